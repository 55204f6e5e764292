"""Benchmark: the same changes applied by a native subscriber and by drain → stage → Spark apply, timed in one run.

Three workloads:

* ``--workload mixed`` (default): ~``--changes`` row changes, 50% inserts, 30% updates (some rows twice), 20%
  deletes, in transactions of ``--tx-rows`` rows, into ``bench``; drained in batches of ``--max-changes``.
* ``--workload big``: big transactions on ``big (id int primary key, a int, b text, c numeric(12,2),
  d timestamptz)`` — 4/7 of ``--changes`` inserted in transactions of 250k rows, then one UPDATE of half of the
  rows and one DELETE of a quarter (1.75M changes by default: 1M inserts in four transactions, a 500k-row UPDATE,
  a 250k-row DELETE; ``--changes 10000000`` scales it). Drained with the drain's default batch size.
* ``--workload filtered``: ``big`` with ``REPLICA IDENTITY FULL`` (full old images), applied with the spec row
  filter ``a % 2 = 0`` from an unfiltered publication (the native subscriber's publication has the same filter):
  8/15 of ``--changes`` inserted in 250k-row transactions, one UPDATE of half of the rows, a second UPDATE of
  every 8th row (keys repeat inside a batch), one DELETE of a quarter (1.875M changes by default). Every UPDATE
  flips the parity of ``a``, so it crosses the filter and becomes an INSERT or a DELETE.

Measured in one run: the raw named-cursor fetch of the slot's data (what the drain cannot beat), the drain (peek →
staged → advanced), the Spark session start, the Spark apply, and the native subscriber's catch-up, with
ratios. ``--event-log DIR`` keeps Spark's event log there and prints per-job/stage timings
(``benchmarks/spark_events.py``); ``--profile-drain FILE`` writes a cProfile of the drain; ``--java-options`` passes
``spark.driver.extraJavaOptions`` (e.g. ``--java-options=-XX:TieredStopAtLevel=1``).
Prints one JSON object.

``--skip-apply``: drain only (no native subscriber, no Spark): the raw fetch and the drain, with their ratio.
``drain_peeks`` in the output: 2 when the run took a fresh peek at its end for WAL flushed while it ran (which
the server decodes from the slot's restart point again: seconds; see docs/performance.md).
``--read stream``: also drain a twin slot (created with the first, so it holds the same changes) through a logical
replication connection (``DrainConfig.read='stream'``) right after the SQL drain: ``stream_drain_s`` and its ratios
to the raw fetch and to the SQL drain, in the same output (``--read stream-first``: the streamed drain before the SQL
one); the server then runs with PostgreSQL's default
``wal_sender_timeout`` (60 s) instead of the harness's 0.
``--stream-reference after`` (or ``before``): with ``--read stream``, also drain a third twin slot through the
stream read on the decoder's thread (``PGLOGICAL_STREAM_READ_AHEAD=0``, the reference without read-ahead) right
after (before) the streamed drain: ``stream_reference_drain_s`` and ``ratio_stream_drain_over_stream_reference``.
``--ab-code DIR``: also drain a second slot (created before the workload, so it holds the same changes) with the
package at ``DIR`` (e.g. ``git worktree``/``git archive`` of the old commit) in a subprocess, fetch and drains
interleaved, for an A/B of two versions on the same data under the same load.

``--targets postgres,delta`` (default both): the Delta apply (Delta Lake on local disk) runs after the
PostgreSQL one, in the same warm Spark session, and is compared with the native subscriber's rows; beside it, the
delta-rs floor (``delta_floor_s``): delta-rs alone writing each batch's net rows, computed beforehand and not timed,
into a table of its own (a plain append into the empty table, else one MERGE of updates, deletes and inserts).
``--delta-reference`` also runs the Delta apply with the direct path and the append of absent keys switched off
(``PGLOGICAL_APPLY_DIRECT=0``, ``PGLOGICAL_DELTA_APPEND=0``: every batch through Spark's net frame and a MERGE),
in the same session, for a before/after of one run.
``--targets postgres,delta,iceberg`` adds the Iceberg apply (embedded SQL catalog, local warehouse) the same way;
``--iceberg-reference`` also runs it with the direct path switched off (``PGLOGICAL_APPLY_DIRECT=0``: every batch
through Spark's net frame, the Iceberg mirror's only path before it read the staged files), in the same session.
``--inprocess-rows N``: the PostgreSQL apply twice in one run, into two targets: first with
``PGLOGICAL_APPLY_INPROCESS_ROWS=N`` (and ``PGLOGICAL_APPLY_INPROCESS_BYTES`` of ``--inprocess-bytes``; a batch
above them is netted in key partitions, ``staged_per_batch`` prints how many) and Spark started only if a batch
needs it (``inprocess_*``; before any JVM starts), then the Spark run of the PostgreSQL target with ``PGLOGICAL_APPLY_INPROCESS_ROWS=0`` (every netted batch
through Spark), both compared with the native subscriber (``ratio_inprocess_apply_over_spark_apply``); each lake
target too, under those bounds and then with ``PGLOGICAL_APPLY_INPROCESS_ROWS=0`` (``spark_*``,
``ratio_delta_apply_over_spark_netting``, ``ratio_iceberg_apply_over_spark_netting``).
Each lake's applies (the product, ``spark_*``, ``reference_*``) first run once each untimed (a warm-up: the JVM's
JIT, pyiceberg's import and catalog), then ``--lake-rounds`` timed rounds, every other one in reverse order; a
figure is the median of its rounds (``*_apply_runs_s`` lists them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig  # noqa: E402
from airflow_provider_pglogical.apply.runner import apply_slot  # noqa: E402
from airflow_provider_pglogical.environ import scoped  # noqa: E402
from airflow_provider_pglogical.hooks import PgLogicalHook  # noqa: E402
from airflow_provider_pglogical.hooks.replication import READ_AHEAD_ENV  # noqa: E402
from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient  # noqa: E402
from scripts.harness.pgserver import (  # noqa: E402
    execute,
    make_database,  # noqa: E402
    make_target,  # noqa: E402
    query,
    start_server,
    stop_server,
)
from scripts.harness.subscriber import drain_all, subscribe, wait_for_subscriber  # noqa: E402

SCHEMA = """
CREATE TABLE bench (id bigint PRIMARY KEY, grp int NOT NULL, amount numeric(12,2), note text,
                    updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench_small (k int PRIMARY KEY, hits bigint NOT NULL);
"""
BIG_SCHEMA = """
CREATE TABLE big (id int PRIMARY KEY, a int, b text, c numeric(12,2), d timestamptz);
"""
BIG_TX_ROWS = 250_000
FILTER = "a % 2 = 0"  # the filtered workload's row filter: every UPDATE of ``a + 1`` crosses it


def big_workload(dsn: str, changes: int) -> dict[str, int]:
    """The big workload's shape: inserts (4/7) in 250k-row transactions, one UPDATE of half of them, one DELETE of a quarter."""
    inserts = changes * 4 // 7
    updates, deletes = inserts // 2, inserts // 4
    for lo in range(0, inserts, BIG_TX_ROWS):
        hi = min(lo + BIG_TX_ROWS, inserts)
        execute(dsn, "INSERT INTO big SELECT g, g %% 1000, md5(g::text), (g %% 100000) * 0.01, "
                     "'2026-01-01'::timestamptz + g * interval '1 second' FROM generate_series(%s, %s) g",
                params=(lo, hi - 1))
    execute(dsn, "UPDATE big SET a = a + 1, d = d + interval '1 day' WHERE id < %s", params=(updates,))
    execute(dsn, "DELETE FROM big WHERE id >= %s", params=(inserts - deletes,))
    return {"insert": inserts, "update": updates, "delete": deletes}


def filtered_workload(dsn: str, changes: int) -> dict[str, int]:
    """The filtered workload's shape: inserts (8/15) in 250k-row transactions, one UPDATE of half of them, one of
    every 8th row, one DELETE of a quarter; every UPDATE flips the parity of ``a`` (crosses ``FILTER``)."""
    inserts = changes * 8 // 15
    updates, deletes = inserts // 2, inserts // 4
    for lo in range(0, inserts, BIG_TX_ROWS):
        hi = min(lo + BIG_TX_ROWS, inserts)
        execute(dsn, "INSERT INTO big SELECT g, g %% 1000, md5(g::text), (g %% 100000) * 0.01, "
                     "'2026-01-01'::timestamptz + g * interval '1 second' FROM generate_series(%s, %s) g",
                params=(lo, hi - 1))
    execute(dsn, "UPDATE big SET a = a + 1, d = d + interval '1 day' WHERE id < %s", params=(updates,))
    execute(dsn, "UPDATE big SET a = a + 1, c = c + 1 WHERE id % 8 = 0")  # no parameters: % as is
    execute(dsn, "DELETE FROM big WHERE id >= %s", params=(inserts - deletes,))
    return {"insert": inserts, "update": updates + (inserts + 7) // 8, "delete": deletes}


def staged_sizes(staging: str, slot: str, source: str, bounds: dict[str, str]) -> list[dict[str, float]]:
    """Per staged batch of ``source``: its changes by the manifest, the uncompressed MiB of the columns the
    in-process netting reads (``direct.staged_bytes``: what ``PGLOGICAL_APPLY_INPROCESS_BYTES`` bounds) and the key
    partitions the in-process netting uses with the bounds of ``bounds`` (``partitioned.partition_count``)."""
    from airflow_provider_pglogical.apply import direct, partitioned
    from airflow_provider_pglogical.apply.batches import list_batches

    sizes = []
    for batch in list_batches(staging, slot):
        files = batch.table_files.get(source, ())
        if files:
            total, _ = direct.staged_bytes([f"{batch.ref.path}/{f}" for f in files])
            rows = int(batch.manifest.tables.get(source, {}).get("rows", 0))
            with scoped(bounds):
                parts = partitioned.partition_count(rows, total, direct.inprocess_rows(), direct.inprocess_bytes())
            sizes.append({"changes": rows, "staged_mib": round(total / 2**20, 1), "inprocess_partitions": parts})
    return sizes


def delta_floor(staging: str, slot: str, table: str, uri: str) -> tuple[float, list[float]]:
    """delta-rs alone writing each staged batch's net rows of ``table`` into a Delta table at ``uri``: the rows are
    netted beforehand by the Arrow kernels (not timed); timed is the append into the empty table, or the one MERGE
    (update, delete, insert by kind) of a later batch. Returns the total and per-batch seconds."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    from airflow_provider_pglogical.apply import kernels
    from airflow_provider_pglogical.staging.reader import StagingReader

    reader = StagingReader.from_uri(staging, slot)
    qualified = f"public.{table}"
    per_batch: list[float] = []
    for ref in reader.batches():
        files = reader.read_table_changes(ref, qualified)
        if not files:
            continue
        staged = pa.concat_tables([f.select(list(kernels.STAGED_COLUMNS)) for f in files])
        columns = [staged.schema.field("new").type.field(i).name for i in range(staged.schema.field("new").type.num_fields)]
        net = kernels.compact_changes(staged, ["id"], columns, ["id"]).table(["id"], columns)
        inserted = pc.is_in(net.column("kind"), pa.array(["I", "R"]))
        t0 = time.monotonic()
        if not Path(uri).exists():
            write_deltalake(uri, net.filter(inserted).select(columns))
        else:
            source = net.select(["kind", *columns])
            (DeltaTable(uri).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
             .when_matched_delete("s.kind = 'D'")
             .when_matched_update({c: f"s.{c}" for c in columns if c != "id"})
             .when_not_matched_insert({c: f"s.{c}" for c in columns}, predicate="s.kind IN ('I', 'R')")
             .execute())
        per_batch.append(round(time.monotonic() - t0, 2))
    return round(sum(per_batch), 2), per_batch


SCRATCH: list[str] = []  # staging and lake directories, removed when the run ends


def scratch(prefix: str) -> str:
    SCRATCH.append(tempfile.mkdtemp(prefix=prefix))
    return SCRATCH[-1]


def raw_fetch(dsn: str, slot: str, publication: str, *, cursor: bool = True) -> tuple[int, float]:
    """The slot's data through the hook's named cursor (binary pgoutput, same options as the drain), counted only.
    ``cursor=False``: through the drain's binary COPY reader instead, when it is built."""
    client = PgLogicalClient.from_dsn(dsn)
    try:
        t0, c0 = time.monotonic(), time.process_time()
        n = sum(1 for _ in client._changes("pg_logical_slot_peek_binary_changes", slot, publication, upto_lsn=None,
                                           upto_nchanges=None, streaming=False, itersize=5000, cursor=cursor))
        RAW_FETCH_CPU.append(round(time.process_time() - c0, 2))
        return n, time.monotonic() - t0
    finally:
        client.close()


def raw_stream_fetch(dsn: str, slot: str, publication: str) -> tuple[int, float]:
    """The slot's data over a replication connection up to the flush position (what the streamed drain reads),
    counted only and never confirmed: the walsender's decoding and sending, the streamed drain's floor."""
    client = PgLogicalClient.from_dsn(dsn)
    try:
        t0, c0 = time.monotonic(), time.process_time()
        start = client.require_slot(slot).confirmed_flush_lsn
        stream = client.stream_changes(slot, publication, start_lsn=start, upto_lsn=client.current_wal_flush_lsn(),
                                       itersize=5000)
        try:
            n = sum(len(block) for block in stream.blocks())
        finally:
            stream.close()
        RAW_FETCH_CPU.append(round(time.process_time() - c0, 2))
        return n, time.monotonic() - t0
    finally:
        client.close()


RAW_FETCH_CPU: list[float] = []  # client CPU seconds of each raw fetch, the stream's last (the server's are not counted)


def drain_elsewhere(code: str, dsn: str, staging: str, slot: str, drain_kw: dict[str, int]) -> float:
    """Drain ``slot`` to the end with the package under ``code`` in a child process; its drain seconds."""
    import subprocess

    script = ("import json, sys, time; sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2]);"
              "from scripts.harness.subscriber import drain_all; t0, c0 = time.monotonic(), time.process_time();"
              "drain_all(sys.argv[3], sys.argv[4], slot=sys.argv[5], **json.loads(sys.argv[6]));"
              "print(time.process_time() - c0); print(time.monotonic() - t0)")
    out = subprocess.run([sys.executable, "-c", script, code, str(Path(__file__).resolve().parent.parent), dsn,
                          staging, slot, json.dumps(drain_kw)], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": code})
    cpu, wall = out.stdout.strip().splitlines()[-2:]
    AB_DRAIN_CPU.append(round(float(cpu), 2))
    return round(float(wall), 2)


AB_DRAIN_CPU: list[float] = []  # client CPU seconds of the A/B child's drain


class count_peeks:  # noqa: N801 - used like a function
    """Counts the drain's ``peek_changes`` calls (each one the server materialises from the slot's restart point)."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = real = PgLogicalClient.peek_changes

        def counted(client: PgLogicalClient, *a: object, **kw: object) -> object:
            self.calls += 1
            return real(client, *a, **kw)  # type: ignore[arg-type]
        PgLogicalClient.peek_changes = counted  # type: ignore[method-assign, assignment]


def workload(dsn: str, changes: int, tx_rows: int) -> dict[str, int]:
    """~``changes`` row changes: 50% inserts, 30% updates (some rows several times), 20% deletes."""
    inserts, updates, deletes = changes // 2, changes * 3 // 10, changes // 5
    done = {"insert": 0, "update": 0, "delete": 0}
    for lo in range(0, inserts, tx_rows):
        hi = min(lo + tx_rows, inserts)
        execute(dsn, "INSERT INTO bench (id, grp, amount, note) SELECT g, g %% 100, g * 0.01, md5(g::text) "
                     "FROM generate_series(%s, %s) g", params=(lo, hi - 1))
        done["insert"] += hi - lo
    for lo in range(0, updates, tx_rows):
        hi = min(lo + tx_rows, updates)
        # ids modulo inserts/2: the upper half of updates hits rows a second time (compaction matters)
        execute(dsn, "UPDATE bench SET amount = amount + 1, updated_at = now() WHERE id IN "
                     "(SELECT g %% %s FROM generate_series(%s, %s) g)", params=(max(inserts // 2, 1), lo, hi - 1))
        done["update"] += hi - lo
    for lo in range(0, deletes, tx_rows):
        hi = min(lo + tx_rows, deletes)
        execute(dsn, "DELETE FROM bench WHERE id BETWEEN %s AND %s", params=(inserts - hi, inserts - lo - 1))
        done["delete"] += hi - lo
    return done


def lake_runs(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """The lake applies to time, by the prefix of their figures: the product as set, and with ``--inprocess-rows``
    the product under those bounds and then ``spark_`` with ``PGLOGICAL_APPLY_INPROCESS_ROWS=0`` (a table-batch the
    direct path would net in this process netted by Spark instead)."""
    if args.inprocess_rows is None:
        return {"": {}}
    return {"": inprocess_bounds(args), "spark_": {"PGLOGICAL_APPLY_INPROCESS_ROWS": "0"}}


def lake_schedule(runs: dict[str, dict[str, str]], rounds: int) -> list[tuple[str, dict[str, str], bool]]:
    """The lake applies in the order they run, and whether each is timed: every one once untimed (the warm-up),
    then ``rounds`` rounds, every other one reversed, so no apply is always first or last."""
    order = list(runs.items())
    timed = [(p, e, True) for r in range(rounds) for p, e in (order if r % 2 == 0 else order[::-1])]
    return [(p, e, False) for p, e in order] + timed


def inprocess_bounds(args: argparse.Namespace) -> dict[str, str]:
    """The in-process bounds ``--inprocess-rows`` / ``--inprocess-bytes`` set (unset: the environment's)."""
    bounds = {"PGLOGICAL_APPLY_INPROCESS_ROWS": args.inprocess_rows, "PGLOGICAL_APPLY_INPROCESS_BYTES": args.inprocess_bytes}
    return {k: str(v) for k, v in bounds.items() if v is not None}


def apply_in_process(config: ApplyConfig, dsn: str, native_dsn: str, table: str, bounds: dict[str, str],
                     native_s: float) -> dict[str, object]:
    """The PostgreSQL apply with the in-process bounds ``bounds`` into ``dsn``, Spark started only if a batch
    needs it (``inprocess_spark_started``): its seconds, its ratio to the native catch-up, its rows compared."""
    from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand

    started: list[object] = []

    def start() -> object:
        from pyspark.sql import SparkSession

        from airflow_provider_pglogical.apply.sparkenv import use_package_python

        use_package_python()
        started.append(SparkSession.builder.master("local[2]").appName("pglogical-bench-inprocess")
                       .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
                       .config("spark.driver.host", "127.0.0.1").config("spark.driver.memory", "2g").getOrCreate())
        return started[-1]

    import resource

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    with scoped(bounds):
        t0 = time.monotonic()
        reports = apply_slot(SparkOnDemand(start), config, dsn)  # type: ignore[arg-type]
        seconds = time.monotonic() - t0
    digest = f"SELECT count(*), sum(hashtext({table}::text)) FROM {table}"
    return {"inprocess_bounds": bounds, "inprocess_apply_s": round(seconds, 2),
            "inprocess_batches_applied": sum(r.applied for r in reports),
            "inprocess_per_batch_seconds": [r.seconds for r in reports],
            "inprocess_spark_started": bool(started),
            # this process's peak resident memory (MiB) before the apply (the drain's) and after it
            "peak_rss_mib_before_inprocess": rss_before,
            "peak_rss_mib_after_inprocess": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "ratio_inprocess_apply_over_native": round(seconds / native_s, 2),
            "inprocess_identical_to_native": query(dsn, digest) == query(native_dsn, digest)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=("mixed", "big", "filtered"), default="mixed")
    p.add_argument("--changes", type=int, default=None,
                   help="1,000,000 (mixed) / 1,750,000 (big) / 1,875,000 (filtered)")
    p.add_argument("--tx-rows", type=int, default=10_000, help="mixed workload: rows per transaction")
    p.add_argument("--max-changes", type=int, default=None,
                   help="drain batch size (changes); mixed: 250,000, big: the drain's default")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--event-log", default=None, help="directory for Spark's event log; prints job/stage timings")
    p.add_argument("--profile-drain", default=None, help="write a cProfile of the drain to this file")
    p.add_argument("--java-options", default="", help="spark.driver.extraJavaOptions, e.g. "
                   "--java-options=-XX:TieredStopAtLevel=1 (C1-only JIT)")
    p.add_argument("--skip-apply", action="store_true", help="drain only: no native subscriber, no Spark")
    p.add_argument("--read", choices=("sql", "stream", "stream-first"), default="sql",
                   help="stream: also drain a twin slot through a replication connection, after the SQL drain "
                        "(stream-first: before it)")
    p.add_argument("--stream-reference", choices=("after", "before"), default=None,
                   help="with --read stream: also drain a twin slot streamed without read-ahead, after (before) "
                        "the streamed drain")
    p.add_argument("--ab-code", default=None, help="also drain a twin slot with the package found in this directory")
    p.add_argument("--delta-reference", action="store_true", help="also apply to Delta with the direct path and "
                   "the append of absent keys switched off (every batch through Spark and a MERGE)")
    p.add_argument("--inprocess-rows", type=int, default=None, help="also apply to PostgreSQL in this process "
                   "(PGLOGICAL_APPLY_INPROCESS_ROWS=N, Spark only on demand), before the Spark run, which then has "
                   "PGLOGICAL_APPLY_INPROCESS_ROWS=0")
    p.add_argument("--inprocess-bytes", type=int, default=None, help="with --inprocess-rows: "
                   "PGLOGICAL_APPLY_INPROCESS_BYTES=N for the in-process run (a batch above the bounds is netted in "
                   "key partitions of at most these sizes)")
    p.add_argument("--lake-rounds", type=int, default=1, help="timed rounds of each lake apply after one untimed "
                   "warm-up of each, every other round in reverse order; figures are medians")
    p.add_argument("--iceberg-reference", action="store_true", help="also apply to Iceberg with the direct path "
                   "switched off (PGLOGICAL_APPLY_DIRECT=0), for a before/after in one run")
    p.add_argument("--targets", default="postgres,delta", help="comma-separated; postgres is our PostgreSQL apply "
                   "(left out: the lake targets alone, against the same native subscriber), delta adds the Delta target, "
                   "iceberg the Iceberg target (SQL catalog on SQLite, local warehouse)")
    args = p.parse_args()
    filtered = args.workload == "filtered"
    big = args.workload == "big" or filtered
    targets = set(args.targets.split(","))
    changes = args.changes or (1_875_000 if filtered else 1_750_000 if big else 1_000_000)
    table = "big" if big else "bench"
    drain_kw = {"max_changes": args.max_changes or (None if big else 250_000)}
    drain_kw = {k: v for k, v in drain_kw.items() if v is not None}

    # The test harness turns wal_sender_timeout off; a walsender then flushes and polls its connection after every
    # message (its fast path needs a timeout). The streamed drain is measured on PostgreSQL's default instead.
    streaming = args.read in ("stream", "stream-first")
    server = start_server(settings={"wal_sender_timeout": "60s"} if streaming else None)
    try:
        source, native = make_database(server), make_database(server)
        _, ours = make_target(server)
        _, ours_inprocess = make_target(server)
        src_dsn, native_dsn = server.dsn(source), server.dsn(native)
        schema = BIG_SCHEMA if big else SCHEMA
        tables = "big" if big else "bench, bench_small"
        execute(src_dsn, schema + f"CREATE PUBLICATION pub_all FOR TABLE {tables};")
        native_pub = "pub_all"
        if filtered:  # ours drains everything and filters in the apply; the native subscriber's publication filters
            execute(src_dsn, f"ALTER TABLE big REPLICA IDENTITY FULL; "
                             f"CREATE PUBLICATION pub_native FOR TABLE big WHERE ({FILTER});")
            native_pub = "pub_native"
        execute(native_dsn, schema)
        execute(ours, schema)
        execute(ours_inprocess, schema)
        subscribe(src_dsn, native_dsn, publication=native_pub, name="sub_bench")
        execute(native_dsn, "ALTER SUBSCRIPTION sub_bench DISABLE")  # let the changes pile up first
        PgLogicalHook.from_dsn(src_dsn).create_slot("ours")
        if args.ab_code:
            PgLogicalHook.from_dsn(src_dsn).create_slot("ours_ab")
        if streaming:
            PgLogicalHook.from_dsn(src_dsn).create_slot("ours_stream")
        if streaming and args.stream_reference:
            PgLogicalHook.from_dsn(src_dsn).create_slot("ours_stream_ref")
        t0 = time.monotonic()
        counts = (filtered_workload(src_dsn, changes) if filtered else big_workload(src_dsn, changes) if big
                  else workload(src_dsn, changes, args.tx_rows))
        generate_s = time.monotonic() - t0

        fetched, fetch_s = raw_fetch(src_dsn, "ours", "pub_all")
        ab: dict[str, object] = {}
        if args.ab_code:
            ab["ab_code"] = args.ab_code
            ab["ab_drain_s"] = drain_elsewhere(args.ab_code, src_dsn, scratch("pglogical-bench-ab-"),
                                               "ours_ab", drain_kw)
            ab["ab_raw_fetch_after_s"] = round(raw_fetch(src_dsn, "ours", "pub_all")[1], 2)
        ab["raw_copy_fetch_s"] = round(raw_fetch(src_dsn, "ours", "pub_all", cursor=False)[1], 2)
        if streaming:
            ab["raw_stream_fetch_s"] = round(raw_stream_fetch(src_dsn, "ours", "pub_all")[1], 2)

        native_s = None
        if not args.skip_apply:
            t0 = time.monotonic()
            execute(native_dsn, "ALTER SUBSCRIPTION sub_bench ENABLE")
            wait_for_subscriber(src_dsn, native_dsn, name="sub_bench", timeout=3600)
            native_s = time.monotonic() - t0

        def drain_stream_reference() -> dict[str, object]:
            t0, c0 = time.monotonic(), time.process_time()
            with scoped({READ_AHEAD_ENV: "0"}):
                drain_all(src_dsn, scratch("pglogical-bench-stream-ref-"), slot="ours_stream_ref", read="stream",
                          **drain_kw)
            return {"stream_reference_drain_s": round(time.monotonic() - t0, 2),
                    "stream_reference_drain_cpu_s": round(time.process_time() - c0, 2),
                    "stream_reference_order": args.stream_reference}

        def drain_streamed() -> tuple[float, dict[str, object]]:
            reference = drain_stream_reference() if args.stream_reference == "before" else {}
            t0, c0 = time.monotonic(), time.process_time()
            stream_batches = drain_all(src_dsn, scratch("pglogical-bench-stream-"), slot="ours_stream", read="stream",
                                       **drain_kw)
            stream_s = time.monotonic() - t0
            out: dict[str, object] = {"stream_drain_s": round(stream_s, 2), "stream_batches": stream_batches,
                                      "stream_drain_cpu_s": round(time.process_time() - c0, 2),
                                      "stream_order": args.read}
            if args.stream_reference == "after":
                reference = drain_stream_reference()
            if reference:
                out.update(reference, ratio_stream_drain_over_stream_reference=round(
                    stream_s / float(reference["stream_reference_drain_s"]), 2))
            return stream_s, out

        stream_s, streamed = drain_streamed() if args.read == "stream-first" else (0.0, {})
        staging = scratch("pglogical-bench-")
        profiler = None
        if args.profile_drain:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        peeks = count_peeks()  # 2 = the run also took a fresh peek for WAL flushed while it ran (see docs)
        t0, c0 = time.monotonic(), time.process_time()
        batches = drain_all(src_dsn, staging, **drain_kw)
        drain_s, drain_cpu = time.monotonic() - t0, time.process_time() - c0
        staged = staged_sizes(staging, "ours", f"public.{table}", inprocess_bounds(args))
        PgLogicalClient.peek_changes = peeks.real  # type: ignore[method-assign]
        if args.read == "stream":
            stream_s, streamed = drain_streamed()
        if streamed:
            streamed.update(ratio_stream_drain_over_raw_fetch=round(stream_s / fetch_s, 2),
                            ratio_stream_drain_over_sql_drain=round(stream_s / drain_s, 2))
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile_drain)
        if args.skip_apply:
            out_drain = {"workload": args.workload, "changes": sum(counts.values()), "by_op": counts,
                         "generate_s": round(generate_s, 1), "raw_fetch_s": round(fetch_s, 2),
                         "raw_fetch_rows": fetched, "drain_s": round(drain_s, 2), "batches": batches,
                         "staged_per_batch": staged, "drain_peeks": peeks.calls,
                         "ratio_drain_over_raw_fetch": round(drain_s / fetch_s, 2), **ab, **streamed,
                         "client_cpu_s": {"raw_fetch": RAW_FETCH_CPU, "drain": round(drain_cpu, 2),
                                          "ab_drain": AB_DRAIN_CPU},
                         "load_average": [round(x, 2) for x in os.getloadavg()]}
            if "ab_drain_s" in ab:
                out_drain["ratio_ab_drain_over_raw_fetch"] = round(float(ab["ab_drain_s"]) / fetch_s, 2)
                out_drain["ratio_drain_over_ab_drain"] = round(drain_s / float(ab["ab_drain_s"]), 2)
            print(json.dumps(out_drain, indent=2))
            return 0
        assert native_s is not None

        table_config = TableApplyConfig(row_filter=FILTER) if filtered else TableApplyConfig()
        config = ApplyConfig(slot="ours", staging_root=staging, tables={f"public.{table}": table_config})
        inprocess: dict[str, object] = {}
        spark_env: dict[str, str] = {}  # the Spark run of the PostgreSQL target below
        if args.inprocess_rows is not None:
            inprocess = apply_in_process(config, ours_inprocess, native_dsn, table, inprocess_bounds(args), native_s)
            spark_env = {"PGLOGICAL_APPLY_INPROCESS_ROWS": "0"}  # every netted batch in Spark; the lakes as set

        t0 = time.monotonic()
        from pyspark.sql import SparkSession

        from airflow_provider_pglogical.apply.sparkenv import use_package_python

        use_package_python()  # Python workers run this interpreter, not python3 from PATH
        builder = (SparkSession.builder.master(args.master).appName("pglogical-bench")
                   .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
                   .config("spark.driver.host", "127.0.0.1").config("spark.driver.memory", "2g"))
        if args.event_log:
            Path(args.event_log).mkdir(parents=True, exist_ok=True)
            builder = builder.config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", args.event_log)
        if args.java_options:
            builder = builder.config("spark.driver.extraJavaOptions", args.java_options)
        spark = builder.getOrCreate()
        spark_start_s = time.monotonic() - t0
        t0 = time.monotonic()
        if "postgres" in targets:
            with scoped(spark_env):
                reports = apply_slot(spark, config, ours)
        else:  # the lake targets only: ours stays empty, compared with nothing
            reports = []
        apply_s = time.monotonic() - t0
        digest = f"SELECT count(*), sum(hashtext({table}::text)) FROM {table}"
        same = "postgres" not in targets or query(ours, digest) == query(native_dsn, digest)
        out = {
            "workload": args.workload, "changes": sum(counts.values()), "by_op": counts,
            "generate_s": round(generate_s, 1), "raw_fetch_s": round(fetch_s, 2), "raw_fetch_rows": fetched,
            "native_apply_s": round(native_s, 2), "drain_s": round(drain_s, 2), "batches": batches, "drain_peeks": peeks.calls,
            "spark_start_s": round(spark_start_s, 2), "spark_apply_s": round(apply_s, 2),
            "batches_applied": sum(r.applied for r in reports),
            "per_batch_seconds": [r.seconds for r in reports],
            "ratio_drain_over_raw_fetch": round(drain_s / fetch_s, 2), **streamed,
            "ratio_spark_apply_over_native": round(apply_s / native_s, 2),
            "ratio_spark_start_plus_apply_over_native": round((spark_start_s + apply_s) / native_s, 2),
            "ratio_drain_plus_apply_over_native": round((drain_s + apply_s) / native_s, 2),
            "targets_identical": same, "staged_per_batch": staged, **ab, **inprocess, "load_average_start": [round(x, 2) for x in os.getloadavg()],
        }
        if "delta" in targets:
            from deltalake import DeltaTable

            from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
            from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget

            native_rows = query(native_dsn, f"SELECT * FROM {table} ORDER BY id")
            runs = lake_runs(args)
            if args.delta_reference:  # the previous path: Spark's net frame and a MERGE for every batch
                runs["reference_"] = {"PGLOGICAL_APPLY_DIRECT": "0", "PGLOGICAL_DELTA_APPEND": "0"}
            delta_runs: dict[str, list[float]] = {}
            for prefix, env, timed in lake_schedule(runs, args.lake_rounds):
                with scoped(env):
                    lake = DeltaLocation(scratch("pglogical-bench-lake-"))
                    t0 = time.monotonic()
                    delta_reports = apply_slot(spark, config, target=DeltaTarget(lake, "ours"))
                    delta_s = time.monotonic() - t0
                rows = DeltaTable(lake.table_uri(f"public.{table}")).to_pyarrow_table().sort_by("id")
                delta_same = [tuple(r.values()) for r in rows.to_pylist()] == [tuple(r) for r in native_rows]
                same = same and delta_same
                if not timed:
                    continue
                delta_runs.setdefault(prefix, []).append(round(delta_s, 2))
                delta_s = statistics.median(delta_runs[prefix])
                out.update({
                    f"{prefix}delta_apply_s": round(delta_s, 2), f"{prefix}delta_apply_runs_s": delta_runs[prefix],
                    f"{prefix}delta_batches_applied": sum(r.applied for r in delta_reports),
                    f"{prefix}delta_per_batch_seconds": [r.seconds for r in delta_reports if r.applied],
                    f"{prefix}ratio_delta_apply_over_native": round(delta_s / native_s, 2),
                    f"{prefix}ratio_drain_plus_delta_over_native": round((drain_s + delta_s) / native_s, 2),
                    f"{prefix}delta_identical_to_native": delta_same})
            if not filtered:  # the floor writes every net row: no row filter
                floor_s, floor_batches = delta_floor(staging, "ours", table, scratch("pglogical-bench-floor-") + "/t")
                out.update({"delta_floor_s": floor_s, "delta_floor_per_batch_s": floor_batches,
                            "ratio_delta_apply_over_floor": round(float(out["delta_apply_s"]) / floor_s, 2)})
            if args.delta_reference:
                out["ratio_delta_apply_over_reference"] = round(
                    float(out["delta_apply_s"]) / float(out["reference_delta_apply_s"]), 2)
            if "spark_delta_apply_s" in out:
                out["ratio_delta_apply_over_spark_netting"] = round(
                    float(out["delta_apply_s"]) / float(out["spark_delta_apply_s"]), 2)
        if "iceberg" in targets:
            from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
            from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget

            native_rows = query(native_dsn, f"SELECT * FROM {table} ORDER BY id")
            ice_runs = lake_runs(args)
            if args.iceberg_reference:  # the previous path: Spark's net frame for every batch
                ice_runs["reference_"] = {"PGLOGICAL_APPLY_DIRECT": "0"}
            ice_times: dict[str, list[float]] = {}
            for prefix, env, timed in lake_schedule(ice_runs, args.lake_rounds):
                warehouse = scratch("pglogical-bench-iceberg-")
                ice = IcebergTarget(IcebergLocation({"type": "sql", "uri": f"sqlite:///{warehouse}/catalog.db",
                                                     "warehouse": warehouse}), "ours")
                with scoped(env):
                    t0 = time.monotonic()
                    ice_reports = apply_slot(spark, config, target=ice)
                    ice_s = time.monotonic() - t0
                ice_table = ice.open(f"public.{table}")
                assert ice_table is not None
                rows = ice_table.scan().to_arrow().sort_by("id")
                ice_same = [tuple(r.values()) for r in rows.to_pylist()] == [tuple(r) for r in native_rows]
                same = same and ice_same
                if not timed:
                    continue
                ice_times.setdefault(prefix, []).append(round(ice_s, 2))
                ice_s = statistics.median(ice_times[prefix])
                out.update({
                    f"{prefix}iceberg_apply_s": round(ice_s, 2), f"{prefix}iceberg_apply_runs_s": ice_times[prefix],
                    f"{prefix}iceberg_batches_applied": sum(r.applied for r in ice_reports),
                    f"{prefix}iceberg_per_batch_seconds": [r.seconds for r in ice_reports],
                    f"{prefix}ratio_iceberg_apply_over_native": round(ice_s / native_s, 2),
                    f"{prefix}ratio_drain_plus_iceberg_over_native": round((drain_s + ice_s) / native_s, 2),
                    f"{prefix}iceberg_identical_to_native": ice_same})
            if "delta_apply_s" in out:
                out["ratio_iceberg_apply_over_delta_apply"] = round(float(out["iceberg_apply_s"])
                                                                    / float(out["delta_apply_s"]), 2)
            if args.iceberg_reference:
                out["ratio_iceberg_apply_over_reference"] = round(
                    float(out["iceberg_apply_s"]) / float(out["reference_iceberg_apply_s"]), 2)
            if "spark_iceberg_apply_s" in out:
                out["ratio_iceberg_apply_over_spark_netting"] = round(
                    float(out["iceberg_apply_s"]) / float(out["spark_iceberg_apply_s"]), 2)
        if inprocess:
            same = same and bool(inprocess["inprocess_identical_to_native"])
            out["ratio_inprocess_apply_over_spark_apply"] = round(float(inprocess["inprocess_apply_s"]) / apply_s, 2)
        out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        spark.stop()
        if args.event_log:
            from benchmarks.spark_events import summarize

            summary = summarize(args.event_log)
            out["spark_job_wall_s"] = summary["job_wall_s"]
        print(json.dumps(out, indent=2))
        if args.event_log:
            import subprocess

            subprocess.run([sys.executable, str(Path(__file__).with_name("spark_events.py")), args.event_log],
                           check=False)
        return 0 if same else 1
    finally:
        stop_server(server)
        for path in SCRATCH:
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
