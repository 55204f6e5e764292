"""Benchmark: initial sync of the same pre-existing rows by our snapshot + Spark apply, by a native
subscriber (copy_data = true, until every table is ready), and by raw COPY TO, timed in one run.

Usage: python benchmarks/snapshot.py [--rows 5000000] [--parallelism 2] [--chunk-size 64MB] [--one-table]
    [--code DIR] [--no-overlap] [--code-no-overlap]
Prints one JSON object with the timings and the ratios. ``--one-table``: all rows in the one ``orders`` table.
``--code DIR``: also time our snapshot + apply with another checkout's package (e.g. a ``git worktree`` of an older
commit, its compiled reader built), in a child process against the same source rows, right after ours.
Ours loads each table as the snapshot publishes it, while the others are read (``pglogical run``'s overlapped
load; a table read alone in several chunks is COPYed chunk by chunk while it is read), unless ``--no-overlap``;
the ``--code`` run likewise unless ``--code-no-overlap`` (a package without that
loader applies after the snapshot). ``snapshot_cpu_s`` is this process's and its readers' CPU during the snapshot:
with the overlap it includes the loaders' threads (``snapshot_cpu_includes_loads``), so the CPU ratio of two runs
is printed only when both loaded the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# --code DIR: the child process that times ``ours`` imports that checkout's package (and harness) instead
CODE_ENV = "SNAPSHOT_BENCH_CODE"
sys.path.insert(0, os.environ.get(CODE_ENV) or str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from airflow_provider_pglogical.hooks.sizes import parse_size  # noqa: E402 - pure; the checkout's own
from scripts.harness.pgserver import (  # noqa: E402
    execute,
    make_database,  # noqa: E402
    query,
    start_server,
    stop_server,
)

SCHEMA = """
CREATE TABLE orders (id bigint PRIMARY KEY, customer int NOT NULL, amount numeric(12,2), status text,
                     created_at timestamptz NOT NULL);
CREATE TABLE events (id bigint PRIMARY KEY, kind text NOT NULL, payload jsonb, at timestamptz);
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, region text, tags text[]);
"""
ALL_TABLES = ("public.orders", "public.events", "public.customers")
TABLES = ALL_TABLES


def populate(dsn: str, rows: int, one_table: bool = False) -> dict[str, int]:
    """``rows`` rows over three tables: 60% orders, 30% events, 10% customers; or all in orders."""
    n_orders, n_events = (rows, 0) if one_table else (rows * 6 // 10, rows * 3 // 10)
    n_customers = rows - n_orders - n_events
    step = 500_000
    for lo in range(0, n_orders, step):
        execute(dsn, "INSERT INTO orders SELECT g, g %% 100000, (g %% 10000) * 0.01, "
                     "(ARRAY['new','paid','shipped'])[1 + g %% 3], '2024-01-01'::timestamptz + g * interval '1 s' "
                     "FROM generate_series(%s, %s) g", params=(lo, min(lo + step, n_orders) - 1))
    for lo in range(0, n_events, step):
        execute(dsn, "INSERT INTO events SELECT g, 'k' || (g %% 20), jsonb_build_object('g', g, 'v', md5(g::text)), "
                     "now() FROM generate_series(%s, %s) g", params=(lo, min(lo + step, n_events) - 1))
    if n_customers:
        execute(dsn, "INSERT INTO customers SELECT g, 'customer ' || g, (ARRAY['EU','US','APAC'])[1 + g %% 3], "
                     "ARRAY['a' || (g %% 7), 'b'] FROM generate_series(0, %s) g", params=(n_customers - 1,))
    execute(dsn, "VACUUM ANALYZE")
    counts = {"orders": n_orders, "events": n_events, "customers": n_customers}
    return {t: n for t, n in counts.items() if f"public.{t}" in TABLES}


def raw_copy(dsn: str) -> float:
    """Every table through ``COPY (SELECT *) TO STDOUT (FORMAT binary)`` into a sink that drops it."""
    import psycopg2

    class Sink:
        def write(self, data: bytes) -> int:
            return len(data)

    conn = psycopg2.connect(dsn)
    t0 = time.monotonic()
    with conn.cursor() as cur:
        for table in TABLES:
            cur.copy_expert(f"COPY (SELECT * FROM ONLY {table}) TO STDOUT (FORMAT binary)", Sink())
    conn.close()
    return time.monotonic() - t0


def native_sync(src_dsn: str, native_dsn: str) -> float:
    """CREATE SUBSCRIPTION with copy_data = true; seconds until every table is ready ('r')."""
    execute(src_dsn, "SELECT pg_create_logical_replication_slot('sub_bench', 'pgoutput')")
    t0 = time.monotonic()
    execute(native_dsn, f"CREATE SUBSCRIPTION sub_bench CONNECTION '{src_dsn}' PUBLICATION pub_all "
                        "WITH (create_slot = false, slot_name = sub_bench, copy_data = true)")
    while True:
        states = query(native_dsn, "SELECT srsubstate FROM pg_subscription_rel")
        if states and all(s == "r" for (s,) in states):
            break
        time.sleep(0.1)
    seconds = time.monotonic() - t0
    execute(native_dsn, "ALTER SUBSCRIPTION sub_bench DISABLE",
            "ALTER SUBSCRIPTION sub_bench SET (slot_name = NONE)", "DROP SUBSCRIPTION sub_bench")
    execute(src_dsn, "SELECT pg_drop_replication_slot('sub_bench')")
    return seconds


def snapshot_only(src_dsn: str, uri: str, parallelism: int, chunk_bytes: int, slot: str,
                  on_published: Any = None) -> tuple[float, int]:
    from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, initial_snapshot

    job = SnapshotJob(dsn=src_dsn, slot=slot, publication="pub_all", staging_uri=uri,
                      tables={t: (None, None) for t in TABLES},
                      settings=SnapshotSettings(initial=True, parallelism=parallelism, chunk_bytes=chunk_bytes))
    t0, cpu0 = time.monotonic(), _cpu_s()
    result = initial_snapshot(job, **({"on_published": on_published} if on_published else {}))
    SNAPSHOT_CPU[slot] = round(_cpu_s() - cpu0, 2)
    return time.monotonic() - t0, sum(t["bytes"] for t in result.tables.values())


def overlapped_loader(target_dsn: str, uri: str, slot: str) -> Any:
    """The loader ``pglogical run`` uses to load each published table while the snapshot reads on, or None for a
    package without it (its apply starts after the snapshot)."""
    try:
        from airflow_provider_pglogical.apply.targets.postgres.overlap import OverlappedLoad
        from airflow_provider_pglogical.apply.without_spark import refusing_session
    except ImportError:
        return None
    from airflow_provider_pglogical.apply.config import ApplyConfig
    from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget

    config = ApplyConfig(slot=slot, staging_root=uri, tables={})
    return OverlappedLoad(lambda: (PostgresTarget(refusing_session(True), config, target_dsn), config))


SNAPSHOT_CPU: dict[str, float] = {}  # per slot: CPU seconds of this process and its reader processes


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its children that ended (the snapshot readers: their
    pool is closed and waited when the snapshot ends). A load-independent measure next to the wall time."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def ours(src_dsn: str, target_dsn: str, uri: str, parallelism: int, chunk_bytes: int, master: str,
         skip_apply: bool = False, slot: str = "ours", no_overlap: bool = False) -> dict[str, Any]:
    from airflow_provider_pglogical.apply.config import ApplyConfig
    from airflow_provider_pglogical.apply.runner import apply_slot

    loader = None if skip_apply or no_overlap else overlapped_loader(target_dsn, uri, slot)
    # The loader itself follows the chunks of a table read alone (streamed into its COPY while read); a package
    # whose loader is not callable hears of publications only
    listener = loader if callable(loader) else loader.published if loader is not None else None
    snapshot_s, staged = snapshot_only(src_dsn, uri, parallelism, chunk_bytes, slot, listener)
    overlap: dict[str, Any] = {}
    if loader is not None:  # the loads still running when the snapshot ended count as the apply's
        t1 = time.monotonic()
        loader.close()
        overlap = {"overlap": True, "loaded_while_reading": sorted(loader.rows), "left": loader.left,
                   "timeline": loader.timeline,
                   "load_wait_after_snapshot_s": round(time.monotonic() - t1, 2)}
    if skip_apply:
        return {"snapshot_s": round(snapshot_s, 2), "snapshot_cpu_s": SNAPSHOT_CPU[slot],
                "snapshot_cpu_includes_loads": False, "apply_s": 0.0, "staged_bytes": staged}
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(master).appName("bench-snapshot").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4").config("spark.pyspark.python", sys.executable)
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    try:
        t1 = time.monotonic()
        spark.range(1).collect()  # JVM up: not part of the apply
        warm_s = time.monotonic() - t1
        t2 = time.monotonic()
        reports = apply_slot(spark, ApplyConfig(slot=slot, staging_root=uri, tables={}), target_dsn)
        apply_s = time.monotonic() - t2 + overlap.get("load_wait_after_snapshot_s", 0.0)
        # where the apply's time went: Spark building the COPY text vs the load transactions, summed over the
        # atomic groups (which overlap: up to 2 at once); "wall": the snapshot loads from start to end
        detail = {k: round(sum(r.seconds.get(k, 0.0) for r in reports), 2) for k in ("stage", "apply", "wall")}
    finally:
        spark.stop()
    return {"snapshot_s": round(snapshot_s, 2), "snapshot_cpu_s": SNAPSHOT_CPU[slot],
            "snapshot_cpu_includes_loads": loader is not None, "apply_s": round(apply_s, 2),
            "spark_start_s": round(warm_s, 2),
            "apply_stage_s": detail["stage"], "apply_load_s": detail["apply"],
            "apply_snapshots_wall_s": detail["wall"], "staged_bytes": staged, **overlap}


def ours_with_code(code: Path, src_dsn: str, target_dsn: str, uri: str, args: argparse.Namespace) -> dict[str, Any]:
    """``ours`` run by a child process importing ``code``'s package (its snapshot readers start there too)."""
    child = {"src_dsn": src_dsn, "target_dsn": target_dsn, "uri": uri, "parallelism": args.parallelism,
             "chunk_bytes": args.chunk_size, "master": args.master, "skip_apply": args.skip_apply, "slot": "prev",
             "tables": TABLES, **({"no_overlap": True} if args.code_no_overlap else {})}
    env = {**os.environ, CODE_ENV: str(code.resolve()), "PYTHONPATH": str(code.resolve())}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(child)], env=env,
                          cwd=code, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the run with --code {code} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    global TABLES
    if sys.argv[1:2] == ["--child"]:  # ours() for --code DIR, in that checkout's package
        child = json.loads(sys.argv[2])
        TABLES = tuple(child.pop("tables"))
        print(json.dumps(ours(**child)))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--chunk-size", type=parse_size, default=64 << 20,
                   help="heap bytes per chunk: a byte count or a size such as 64MB (binary units)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--skip-apply", action="store_true", help="time the snapshot only (no Spark)")
    p.add_argument("--also-parallelism", type=int, nargs="*", default=[],
                   help="also time the snapshot alone with these reader counts (e.g. 1 4)")
    p.add_argument("--one-table", action="store_true", help="every row in the one orders table")
    p.add_argument("--no-overlap", action="store_true",
                   help="load after the whole snapshot is staged (the apply's own path) instead of each table as the "
                        "snapshot publishes it")
    p.add_argument("--code-no-overlap", action="store_true",
                   help="the --code run loads after the whole snapshot is staged (default: as that package does)")
    p.add_argument("--code", type=Path, default=None,
                   help="also time our snapshot + apply with this checkout's package (its compiled reader built)")
    args = p.parse_args()
    if args.one_table:
        TABLES = ("public.orders",)
    load_before = os.getloadavg()[0]  # the machine is shared: the numbers mean little without it
    server = start_server(settings={"max_sync_workers_per_subscription": "2"})
    try:
        source, native, target, prev = (make_database(server) for _ in range(4))
        src_dsn, native_dsn, target_dsn, prev_dsn = (server.dsn(d) for d in (source, native, target, prev))
        published = ", ".join(t.split(".")[1] for t in TABLES)
        execute(src_dsn, SCHEMA + f"CREATE PUBLICATION pub_all FOR TABLE {published};")
        for dsn in (native_dsn, target_dsn, prev_dsn):
            execute(dsn, SCHEMA)
        t0 = time.monotonic()
        counts = populate(src_dsn, args.rows, args.one_table)
        populate_s = time.monotonic() - t0
        raw_s = raw_copy(src_dsn)
        native_s = native_sync(src_dsn, native_dsn)
        with tempfile.TemporaryDirectory() as tmp:
            our = ours(src_dsn, target_dsn, str(Path(tmp) / "staging"), args.parallelism, args.chunk_size,
                       args.master, args.skip_apply, no_overlap=args.no_overlap)
            previous = (ours_with_code(args.code, src_dsn, prev_dsn, str(Path(tmp) / "prev"), args)
                        if args.code else None)
            others = {}
            for n in args.also_parallelism:
                seconds, _b = snapshot_only(src_dsn, str(Path(tmp) / f"p{n}"), n, args.chunk_size, f"p{n}")
                others[str(n)] = round(seconds, 2)
                execute(src_dsn, f"SELECT pg_drop_replication_slot('p{n}')")
        check = "SELECT count(*), sum(hashtext(t::text)) FROM {} t"
        same = args.skip_apply or all(query(native_dsn, check.format(t)) == query(target_dsn, check.format(t)) for t in TABLES)
        total = our["snapshot_s"] + our["apply_s"]
        code: dict[str, Any] = {}
        if previous is not None:
            prev_total = previous["snapshot_s"] + previous["apply_s"]
            code = {"code": str(args.code), "code_ours": previous, "code_total_s": round(prev_total, 2),
                    "code_targets_identical": args.skip_apply or all(
                        query(native_dsn, check.format(t)) == query(prev_dsn, check.format(t)) for t in TABLES),
                    "ratio_code_total_vs_native": round(prev_total / native_s, 2),
                    "ratio_ours_vs_code_total": round(total / prev_total, 2),
                    "ratio_ours_vs_code_snapshot": round(our["snapshot_s"] / previous["snapshot_s"], 2)}
            if our.get("snapshot_cpu_includes_loads") == previous.get("snapshot_cpu_includes_loads", False):
                code["ratio_ours_vs_code_snapshot_cpu"] = round(our["snapshot_cpu_s"] / previous["snapshot_cpu_s"], 2)
        print(json.dumps({
            "rows": counts, "load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "populate_s": round(populate_s, 2), "parallelism": args.parallelism,
            "raw_copy_to_s": round(raw_s, 2), "native_initial_sync_s": round(native_s, 2), "ours": our,
            "snapshot_s_by_parallelism": {str(args.parallelism): our["snapshot_s"], **others},
            "ours_total_s": round(total, 2), "targets_identical": same,
            "ratio_ours_total_vs_native": round(total / native_s, 2),
            "ratio_snapshot_vs_raw_copy": round(our["snapshot_s"] / raw_s, 2),
            "ratio_native_vs_raw_copy": round(native_s / raw_s, 2), **code,
        }, indent=2))
    finally:
        stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
