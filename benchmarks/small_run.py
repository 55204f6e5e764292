"""Benchmark: `pglogical run` on an empty slot and on small batches (100 changes), and where the seconds go.

Three kinds of small batch: a plain one (inserts, updates and deletes, each key once: the direct path covers it and
the run starts no JVM), one whose keys repeat (rows inserted and updated in the same transaction: compaction nets
them — in the ``pglogical`` process with Arrow kernels, ``apply/kernels.py``, up to ``PGLOGICAL_APPLY_INPROCESS_ROWS``
staged changes; in Spark with the previous code or with ``--inprocess-rows 0``, the run then starting the JVM once
it has staged the batch), and, last, one with a TRUNCATE of the table between its changes (the changes after it
netted in process, the target truncating in the batch's transaction; in Spark with ``--code`` of a checkout
without that route, or with ``--direct 0``).

The commands run as a user runs them (console script by path, venv not activated). Then the same
small batch size again in-process, split into: Python start + imports, decode (peek → staged →
advanced), Spark session start (JVM), the apply's stage (plan + Spark job + COPY into the staging
table) and target transaction, the Spark jobs' wall time from the event log (so plan/driver time =
stage − jobs), and the session stop.

`pglogical run` starts Spark in the background once the drain has read a transaction; its JSON says
so (``spark.started``, ``start_s``, ``apply_waited_s``) and the benchmark reports those seconds for the
CLI's small-batch runs (the in-process split below starts its own session, not overlapped).

With ``--connect``, small batches (keys repeating) again over a warm Spark Connect server (started once before them,
as ``tests/support/sparkconnect.py`` starts it: local[2] executors, warmed by one run): as the spec applies them (a
batch netted in process starts no Spark over Connect either) and through Spark (``PGLOGICAL_APPLY_DIRECT=0``), each
run's JSON telling whether it started Spark. With ``--code DIR`` too, those runs alternate this checkout's CLI and
DIR's over the same server (A/B, their ratio by the medians). With ``--connect-calls`` too, each of those runs reports
its client's round trips to the server, counted and timed (``benchmarks/connect_calls.py``: analyses, plans run,
settings requests).

With ``--jvm-archive``, only needs-Spark small batches: the class archive of Spark's classes
(``apply/jvm_archive.py``) off and on, alternating, then other JVM settings on top of it (``JVM_VARIANTS``), each
with the wall and CPU seconds of the command and every process it started, and the JVM's start.

With ``--row-filter EXPR`` the table is applied with that spec filter (on ``id``, its replica identity, so UPDATEs
and DELETEs pass it): ``"id % 2 = 0"`` is evaluated in the ``pglogical`` process (``apply/filter_eval.py``), a filter
outside that subset (``"id::bigint % 2 = 0"``: a cast) by Spark, which the run then starts while it drains.

With ``--target iceberg`` (and ``--no-split``) the spec's target is an Iceberg mirror (embedded SQL catalog, local
warehouse) instead of a PostgreSQL database: the same CLI runs, the Iceberg mirror's table-batches read straight
from the staged files (``apply/targets/lake/direct.py``) or, with ``--code`` of an older checkout, through Spark.

With ``--schema-change`` only small batches crossing a source ``ALTER TABLE t ADD COLUMN … DEFAULT`` (rows before
and after it: two schema versions of the table in one batch, a fast default for the rows staged before it), each
applied alternately netted in process (``apply/versions.py``) and through Spark's transforms
(``PGLOGICAL_APPLY_DIRECT=0``), ``--repeat`` times each, side by side with their ratio; with ``--row-filter`` the
table is filtered across the schema change (``"id % 2 = 0"``: UPDATEs and INSERTs of both versions filtered).

With ``--staging s3`` the slot stages to an S3 bucket (moto's server on 127.0.0.1, its credentials in the CLI's
environment as a deployment gives them) instead of a local directory: with the spec's ``local[2]`` master the
``pglogical`` process reads the staged files itself (``batches.readable_here``), so a small batch starts no JVM;
``--code`` of an older tree shows what it cost before.

With ``--keyless``, only keyless small batches (a table without a primary key: insert-only, each row inserted twice
in its transaction), alternately through the direct path and through Spark's transforms (``PGLOGICAL_APPLY_DIRECT=0``)
in one run, side by side with their ratio; ``--row-filter`` applies to that table too (on ``grp``, e.g. ``"grp > 0"``).

Usage: python benchmarks/small_run.py [--changes 100] [--repeat 3] [--json FILE] [--code DIR] [--no-split] [--connect]
                                     [--inprocess-rows N] [--jvm-archive] [--row-filter EXPR] [--target iceberg]
                                     [--staging local|s3] [--direct 0|1] [--schema-change] [--keyless]
``--inprocess-rows N`` sets ``PGLOGICAL_APPLY_INPROCESS_ROWS`` for the runs (0: repeated keys netted by Spark).
``--direct 0`` sets ``PGLOGICAL_APPLY_DIRECT=0`` for the runs: every table-batch through Spark's transforms (the
reference of the direct path and the in-process netting); the CLI's environment gets it explicitly, as
``run_as_user`` passes no ``PGLOGICAL_*`` variable of the benchmark's own.
``--code DIR`` runs the CLI from another checkout's package (``PYTHONPATH=DIR``, e.g. an exported older
commit with its compiled decoder copied in) for A/B runs; ``--no-split`` skips the in-process split.
Prints one JSON object as the last lines of stdout (the package's log lines come before it) and,
with ``--json``, writes it to FILE. The 1-minute load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from benchmarks import connect_calls  # noqa: E402
from scripts.harness.pgserver import (  # noqa: E402
    execute,
    make_database,  # noqa: E402
    start_server,
    stop_server,
)
from scripts.harness.userenv import run_as_user, venv_script  # noqa: E402

SCHEMA = "CREATE TABLE t (id int PRIMARY KEY, a int NOT NULL, b text, c numeric(12,2), d timestamptz);"


def plain_batch(dsn: str, changes: int, base: int, seeded: int) -> None:
    """``changes`` row changes in one transaction, each key once: half inserts of new rows, 30% updates and 20%
    deletes of rows the seed batch inserted (ids ``seeded`` on, distinct per call)."""
    inserts, updates = changes // 2, changes * 3 // 10
    deletes = changes - inserts - updates
    execute(dsn, f"""BEGIN;
INSERT INTO t SELECT g, g, md5(g::text), g * 0.01, now() FROM generate_series({base}, {base + inserts - 1}) g;
UPDATE t SET a = a + 1, b = NULL WHERE id BETWEEN {seeded} AND {seeded + updates - 1};
DELETE FROM t WHERE id BETWEEN {seeded + updates} AND {seeded + updates + deletes - 1};
COMMIT;""")


def small_batch(dsn: str, changes: int, base: int) -> None:
    """``changes`` row changes in one transaction: half inserts, 30% updates, 20% deletes, of the rows it inserts
    (so keys repeat: compaction nets them, in process or in Spark)."""
    inserts, updates = changes // 2, changes * 3 // 10
    deletes = changes - inserts - updates
    execute(dsn, f"""BEGIN;
INSERT INTO t SELECT g, g, md5(g::text), g * 0.01, now() FROM generate_series({base}, {base + inserts - 1}) g;
UPDATE t SET a = a + 1 WHERE id BETWEEN {base} AND {base + updates - 1};
DELETE FROM t WHERE id BETWEEN {base + inserts - deletes} AND {base + inserts - 1};
COMMIT;""")


def truncate_batch(dsn: str, changes: int, base: int) -> None:
    """``changes`` row changes around a TRUNCATE of the table, in one transaction: a fifth updates rows before it
    (void), then the truncate, then inserts of new rows and updates of half of them (keys repeat after the cut)."""
    before = changes // 5
    inserts = (changes - before) * 2 // 3
    updates = changes - before - inserts
    execute(dsn, f"""BEGIN;
UPDATE t SET a = a + 1 WHERE id IN (SELECT id FROM t ORDER BY id LIMIT {before});
TRUNCATE t;
INSERT INTO t SELECT g, g, md5(g::text), g * 0.01, now() FROM generate_series({base}, {base + inserts - 1}) g;
UPDATE t SET a = a + 1 WHERE id BETWEEN {base} AND {base + updates - 1};
COMMIT;""")


def schema_change_batch(dsn: str, changes: int, base: int, column: str) -> None:
    """``changes`` row changes around ``ALTER TABLE t ADD COLUMN column int DEFAULT 7``: half before it (inserts of
    new rows, updates of half of them: keys repeat), half after it (updates of the rows inserted before, writing the
    new column for some, and inserts of new rows)."""
    half = changes // 2
    inserts = half * 2 // 3
    execute(dsn, f"""BEGIN;
INSERT INTO t SELECT g, g, md5(g::text), g * 0.01, now() FROM generate_series({base}, {base + inserts - 1}) g;
UPDATE t SET a = a + 1 WHERE id BETWEEN {base} AND {base + half - inserts - 1};
COMMIT;""")
    execute(dsn, f"ALTER TABLE t ADD COLUMN {column} int DEFAULT 7")
    after = changes - half
    execute(dsn, f"""BEGIN;
UPDATE t SET a = a + 1, {column} = id WHERE id BETWEEN {base} AND {base + after // 2 - 1};
INSERT INTO t (id, a) SELECT g, g FROM generate_series({base + inserts}, {base + inserts + after - after // 2 - 1}) g;
COMMIT;""")


def schema_change_runs(spec: list[str], dsn: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """Small batches crossing an ADD COLUMN … DEFAULT, alternately netted in process and by Spark
    (``PGLOGICAL_APPLY_DIRECT=0``): wall seconds of each ``pglogical run`` and whether it started Spark."""
    runs: dict[str, list[dict[str, Any]]] = {"in_process": [], "spark": []}
    base = 5_000_000
    for _ in range(args.repeat):
        for name, direct in (("in_process", "1"), ("spark", "0")):
            base += 1_000_000
            schema_change_batch(dsn, args.changes, base, f"x{base // 1_000_000}")
            out: list[dict[str, Any]] = []
            wall = timed_cli("run", *spec, env={**env, "PGLOGICAL_APPLY_DIRECT": direct}, out=out)
            runs[name].append({"wall_s": round(wall, 2), "spark_started": out[0]["apply"].get("spark_started")})
    medians = {name: round(statistics.median(r["wall_s"] for r in found), 2) for name, found in runs.items()}
    return {"schema_change_runs": runs, "schema_change_median_s": medians,
            "schema_change_in_process_vs_spark": round(medians["in_process"] / medians["spark"], 3)}


def timed_cli(*args: str, env: dict[str, str], out: list[dict[str, Any]] | None = None) -> float:
    """Wall seconds of one ``pglogical`` command; its JSON output is appended to ``out``."""
    t0 = time.monotonic()
    done = run_as_user([venv_script("pglogical"), *args], env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"pglogical {' '.join(args)} failed: {done.stderr[-2000:]}")
    elapsed = time.monotonic() - t0
    if out is not None:
        out.append(json.loads(done.stdout))
    return elapsed


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class BatchSeconds(logging.Handler):
    """Collects the runner's per-batch ``seconds={...}`` log line (stage / apply split)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: list[dict[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"seconds=(\{.*\})", record.getMessage())
        if found:
            self.seconds.append(json.loads(found.group(1).replace("'", '"')))


def in_process(spec_path: Path, dsn: str, changes: int, base: int, event_dir: Path) -> dict[str, Any]:
    """One small batch through the same calls as `pglogical run`, each step timed on its own."""
    from airflow_provider_pglogical.pipeline import runs
    from airflow_provider_pglogical.pipeline.spec import load_spec

    event_dir.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(spec_path.read_text())
    doc["spark"]["conf"] = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(event_dir)}
    timed_spec = spec_path.with_name(f"timed-{event_dir.name}.yaml")
    timed_spec.write_text(yaml.safe_dump(doc))
    spec = load_spec(str(timed_spec))

    t0 = time.monotonic()  # a session started and stopped alone: the JVM's share of every apply
    with runs.local_spark(spec.spark.master):
        started = time.monotonic()
    jvm_start_s, jvm_stop_s = started - t0, time.monotonic() - started

    small_batch(dsn, changes, base)
    t0 = time.monotonic()
    runs.decode_pending(spec)
    decode_s = time.monotonic() - t0

    handler = BatchSeconds()
    package_log = logging.getLogger("airflow_provider_pglogical")
    package_log.addHandler(handler)
    package_log.setLevel(logging.INFO)
    t0 = time.monotonic()
    try:
        runs.apply_pending(spec)
    finally:
        package_log.removeHandler(handler)
    apply_s = time.monotonic() - t0

    from benchmarks.spark_events import summarize

    jobs_s = float(summarize(str(event_dir))["job_wall_s"])
    split = handler.seconds[-1] if handler.seconds else {}
    stage, target_tx = split.get("stage"), split.get("apply")
    return {"decode_s": round(decode_s, 2), "apply_total_s": round(apply_s, 2),
            "jvm_start_s": round(jvm_start_s, 2), "jvm_stop_s": round(jvm_stop_s, 2),
            "stage_s": stage, "target_tx_s": target_tx, "spark_jobs_wall_s": round(jobs_s, 2),
            "stage_outside_spark_jobs_s": None if stage is None else round(stage - jobs_s, 2),
            # the session start/stop inside the apply (the JVM is already up here, a CLI run pays jvm_start_s too),
            # listing batches, watermarks, bookkeeping DDL
            "apply_rest_s": None if stage is None or target_tx is None else round(apply_s - stage - target_tx, 2)}


# Runs a command, then waits for every process it left behind (the JVM outlives the `pglogical` process by the time
# it takes to read EOF on its stdin): this process is their subreaper, so their CPU seconds count in its children's
# rusage, written to the file named first.
CPU_OF_TREE = """
import ctypes, os, resource, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
code = subprocess.call(sys.argv[2:])
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_utime + usage.ru_stime))
sys.exit(code)
"""


def timed_cli_cpu(*args: str, env: dict[str, str], work: Path) -> tuple[float, float, dict[str, Any]]:
    """Wall seconds, CPU seconds (the command and every process it started) and JSON output of one ``pglogical``
    command."""
    cpu_file = work / "cpu.txt"
    t0 = time.monotonic()
    done = run_as_user([sys.executable, "-c", CPU_OF_TREE, str(cpu_file), venv_script("pglogical"), *args], env,
                       timeout=900)
    elapsed = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"pglogical {' '.join(args)} failed: {done.stderr[-2000:]}")
    return elapsed, float(cpu_file.read_text()), json.loads(done.stdout)


# Spark settings tried on a needs-Spark small batch beside the class archive (spec ``spark.conf``).
JVM_VARIANTS: dict[str, dict[str, str]] = {
    "c1_only": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"},
    "one_shuffle_partition": {"spark.sql.shuffle.partitions": "1"},
    "no_whole_stage_codegen": {"spark.sql.codegen.wholeStage": "false"},
}


def archive_runs(spec_path: Path, dsn: str, args: argparse.Namespace, env: dict[str, str],
                 work: Path) -> dict[str, Any]:
    """Needs-Spark small batches (repeated keys netted by Spark: ``PGLOGICAL_APPLY_INPROCESS_ROWS=0``) with the class
    archive off and on, alternating, then with each of ``JVM_VARIANTS`` on top of the archive: wall and CPU seconds
    of the command and the JVM's start as the run reports it. The archive is the one of this machine's cache
    directory (``jvm_archive.cache_dir``: the CLI runs get it passed, their HOME being a throwaway one), written (and
    timed) first unless it is there."""
    from airflow_provider_pglogical.apply import jvm_archive

    cache = jvm_archive.cache_dir()
    archive_env = {**env, "PGLOGICAL_APPLY_INPROCESS_ROWS": "0", jvm_archive.DIR_VARIABLE: str(cache)}
    existed = (jvm_archive.archive_path() or cache).exists()
    t0 = time.monotonic()
    path = jvm_archive.ensure_archive()
    write_s = None if existed else time.monotonic() - t0
    if path is None:
        raise SystemExit("the class archive could not be written (java or pyspark missing?)")
    specs = {"off": spec_path, "on": spec_path}
    for name, conf in JVM_VARIANTS.items():
        doc = yaml.safe_load(spec_path.read_text())
        doc["spark"]["conf"] = conf
        specs[name] = spec_path.with_name(f"spec-{name}.yaml")
        specs[name].write_text(yaml.safe_dump(doc))
    runs: dict[str, list[dict[str, float | None]]] = {name: [] for name in specs}
    base = 3_000_000
    for _ in range(args.repeat):
        for name, spec in specs.items():
            base += 1_000_000
            small_batch(dsn, args.changes, base)
            run_env = {**archive_env, "PGLOGICAL_JVM_ARCHIVE": "off"} if name == "off" else archive_env
            wall, cpu, out = timed_cli_cpu("run", "--spec", str(spec), env=run_env, work=work)
            runs[name].append({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                               "jvm_start_s": (out.get("spark") or {}).get("start_s")})

    def median(name: str, key: str) -> float | None:
        values = [value for r in runs[name] if (value := r[key]) is not None]
        return round(statistics.median(values), 2) if values else None

    medians = {name: {key: median(name, key) for key in ("wall_s", "cpu_s", "jvm_start_s")} for name in runs}
    ratios = {f"{name}_vs_off": {key: round(medians[name][key] / medians["off"][key], 3)  # type: ignore[operator]
                                 for key in ("wall_s", "cpu_s", "jvm_start_s")
                                 if medians[name][key] and medians["off"][key]}
              for name in runs if name != "off"}
    return {"jvm_archive_write_s": write_s and round(write_s, 2), "jvm_archive_bytes": path.stat().st_size,
            "jvm_archive_runs": runs, "jvm_archive_median": medians, "jvm_archive_ratios": ratios}


KEYLESS_SCHEMA = "CREATE TABLE ev (at int NOT NULL, grp int, note text);"  # no primary key: insert-only


def keyless_batch(dsn: str, changes: int, base: int) -> None:
    """``changes`` INSERTs into the keyless table in one transaction, each row twice (two identical rows)."""
    execute(dsn, f"""BEGIN;
INSERT INTO ev SELECT {base} + g / 2, g % 5 - 1, md5((g / 2)::text) FROM generate_series(0, {changes - 1}) g;
COMMIT;""")


def keyless_runs(spec_path: Path, dsn: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """Keyless small batches, alternately with the direct path (``direct``) and with every table-batch through
    Spark's transforms (``spark``: ``PGLOGICAL_APPLY_DIRECT=0``), ``--repeat`` times each after one warm-up run of
    each: wall seconds of the CLI run and whether it started Spark."""
    execute(dsn, KEYLESS_SCHEMA)
    doc = yaml.safe_load(spec_path.read_text())
    doc["source"].update(publication="keyless_pub", slot="keyless_slot")
    doc["tables"] = {"public.ev": {"row_filter": args.row_filter} if args.row_filter else {}}
    keyless_spec = spec_path.with_name("spec-keyless.yaml")
    keyless_spec.write_text(yaml.safe_dump(doc))
    spec = ["--spec", str(keyless_spec)]
    timed_cli("run", *spec, env=env)  # creates publication and slot
    envs = {"direct": {**env, "PGLOGICAL_APPLY_DIRECT": "1"}, "spark": {**env, "PGLOGICAL_APPLY_DIRECT": "0"}}
    runs: dict[str, list[float]] = {name: [] for name in envs}
    started: dict[str, list[bool]] = {name: [] for name in envs}
    base = 0
    for i in range(args.repeat + 1):
        for name, run_env in envs.items():
            base += 1_000_000
            keyless_batch(dsn, args.changes, base)
            out: list[dict[str, Any]] = []
            seconds = timed_cli("run", *spec, env=run_env, out=out)
            if i:  # the first round warms the page cache and the bytecode of both
                runs[name].append(round(seconds, 2))
                started[name].append(bool((out[0].get("spark") or {}).get("started")))
    medians = {name: round(statistics.median(values), 2) for name, values in runs.items()}
    return {"keyless_run_s": runs, "keyless_run_median_s": medians, "keyless_spark_started": started,
            "keyless_direct_vs_spark_ratio": round(medians["direct"] / medians["spark"], 3)}


def connect_runs(spec_path: Path, dsn: str, args: argparse.Namespace, env: dict[str, str],
                 work: Path) -> dict[str, Any]:
    """The small-batch runs over a Spark Connect server started (and warmed by one run) before them: each batch as
    the spec and environment apply it (``as_spec``: a batch the run nets in process starts no Spark, even over
    Connect) and one needing Spark (``needs_spark``: ``PGLOGICAL_APPLY_DIRECT=0``, every table-batch through
    Spark's transforms). With ``--code DIR`` each run alternates this checkout's CLI and DIR's over the same
    server (A/B); their wall seconds and whether they started Spark."""
    from scripts.harness.sparkconnect import start_server as start_connect
    from scripts.harness.sparkconnect import stop as stop_connect

    t0 = time.monotonic()
    process, url = start_connect({}, work / "connect-server.log")
    server_start_s = time.monotonic() - t0
    here = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    codes = {"this_checkout": here, **({"code": env} if args.code else {})}
    kinds = {"as_spec": {}, "needs_spark": {"PGLOGICAL_APPLY_DIRECT": "0"}}
    runs: dict[str, list[dict[str, Any]]] = {f"{kind}/{code}": [] for kind in kinds for code in codes}
    try:
        doc = yaml.safe_load(spec_path.read_text())
        doc["spark"] = {"remote": url}
        remote_spec = spec_path.with_name("spec-connect.yaml")
        remote_spec.write_text(yaml.safe_dump(doc))
        spec = ["--spec", str(remote_spec)]
        base = 1_000_000 * (2 * args.repeat + 2)
        small_batch(dsn, args.changes, base)
        # the server's first plans and Python workers
        warmup_s = timed_cli("run", *spec, env={**here, **kinds["needs_spark"]})
        for i in range(args.repeat):
            for kind, extra in kinds.items():
                # each code goes first as often as the other (a run right after the kind switches is slower)
                for code, code_env in list(codes.items())[::1 if i % 2 == 0 else -1]:
                    base += 1_000_000
                    small_batch(dsn, args.changes, base)
                    out: list[dict[str, Any]] = []
                    run_env = {**code_env, **extra}
                    if args.connect_calls:
                        run_env = connect_calls.profiled_env(run_env, work / "connect-calls")
                    wall = timed_cli("run", *spec, env=run_env, out=out)
                    runs[f"{kind}/{code}"].append({"wall_s": round(wall, 2),
                                                   "spark_started": out[0]["apply"].get("spark_started"),
                                                   **({"client": connect_calls.summary(work / "connect-calls")}
                                                      if args.connect_calls else {})})
    finally:
        stop_connect(process)
    medians = {name: round(statistics.median(r["wall_s"] for r in found), 2) for name, found in runs.items()}
    ratios = {f"{kind}/this_checkout_vs_code": round(medians[f"{kind}/this_checkout"] / medians[f"{kind}/code"], 3)
              for kind in kinds if args.code}
    return {"connect_server_start_s": round(server_start_s, 2), "connect_first_run_s": round(warmup_s, 2),
            "connect_runs": runs, "connect_run_small_batch_median_s": medians, **ratios}


@contextmanager
def staging_root(kind: str, work: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The staging URI of ``kind`` and the environment the CLI reaches it with: a local directory, or a bucket of a
    moto S3 server on 127.0.0.1 (its credentials set in this process too, for the in-process split)."""
    if kind == "local":
        yield str(work / "staging"), {}
        return
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the S3 server's line per request
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "bench-key",
               "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ALLOW_HTTP": "true"}
        os.environ.update(env)
        boto3.client("s3").create_bucket(Bucket="bench")
        yield "s3://bench/staging", env
    finally:
        moto.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, help="also write the result to this file")
    p.add_argument("--code", type=Path, default=None, help="run the CLI with this checkout's package (PYTHONPATH)")
    p.add_argument("--no-split", action="store_true", help="skip the in-process split")
    p.add_argument("--connect", action="store_true", help="also run over a warm Spark Connect server")
    p.add_argument("--connect-calls", action="store_true",
                   help="with --connect: each run's Connect client calls, counted and timed (benchmarks/connect_calls.py)")
    p.add_argument("--jvm-archive", action="store_true",
                   help="only the needs-Spark small batches with the class archive off and on (and JVM_VARIANTS)")
    p.add_argument("--inprocess-rows", type=int, default=None,
                   help="PGLOGICAL_APPLY_INPROCESS_ROWS for the runs (0: repeated keys netted by Spark)")
    p.add_argument("--direct", type=int, choices=(0, 1), default=None,
                   help="PGLOGICAL_APPLY_DIRECT for the runs (0: every table-batch through Spark's transforms)")
    p.add_argument("--schema-change", action="store_true",
                   help="only small batches crossing an ADD COLUMN … DEFAULT, in process and by Spark alternately")
    p.add_argument("--keyless", action="store_true",
                   help="only keyless small batches, the direct path and Spark's transforms alternately")
    p.add_argument("--row-filter", default=None, help="the table's spec row filter (on id; with --keyless on grp), e.g. 'id %% 2 = 0'")
    p.add_argument("--target", choices=("postgres", "iceberg"), default="postgres",
                   help="the spec's target: a PostgreSQL database, or an Iceberg mirror (SQL catalog on SQLite, "
                        "local warehouse; with --no-split)")
    p.add_argument("--staging", choices=("local", "s3"), default="local",
                   help="stage to a local directory or to an S3 bucket (moto's server on 127.0.0.1)")
    args = p.parse_args()
    if args.target != "postgres" and not (args.no_split and not args.connect and not args.jvm_archive):
        p.error("--target iceberg runs the CLI only: add --no-split (no --connect, --jvm-archive)")
    if args.inprocess_rows is not None:  # the in-process split reads it here, the CLI runs from ``env``
        os.environ["PGLOGICAL_APPLY_INPROCESS_ROWS"] = str(args.inprocess_rows)
    if args.direct is not None:
        os.environ["PGLOGICAL_APPLY_DIRECT"] = str(args.direct)
    load_before = load_average()
    server = start_server()
    work = Path(tempfile.mkdtemp(prefix="pglogical-small-"))
    store = ExitStack()
    try:
        staging, staging_env = store.enter_context(staging_root(args.staging, work))
        source, target = make_database(server), make_database(server)
        dsn = server.dsn(source)
        execute(dsn, SCHEMA)
        spec_path = work / "spec.yaml"
        spec_path.write_text(yaml.safe_dump({
            "source": {"dsn": server.uri(source), "publication": "small_pub", "slot": "small_slot", "create": True},
            "staging": {"uri": staging},
            "target": {"kind": "postgres", "dsn": server.uri(target)} if args.target == "postgres" else {
                "kind": "iceberg", "catalog": {"type": "sql", "uri": f"sqlite:///{work}/catalog.db",
                                               "warehouse": str(work / "warehouse")}},
            "tables": {"public.t": {"row_filter": args.row_filter} if args.row_filter else {}},
            "spark": {"master": "local[2]"}}))
        env: dict[str, str] = {**staging_env, **({"PYTHONPATH": str(args.code.resolve())} if args.code else {})}
        if args.inprocess_rows is not None:
            env["PGLOGICAL_APPLY_INPROCESS_ROWS"] = str(args.inprocess_rows)
        if args.direct is not None:
            env["PGLOGICAL_APPLY_DIRECT"] = str(args.direct)
        spec = ["--spec", str(spec_path)]
        if args.keyless:
            result = json.dumps({"changes_per_batch": args.changes, "row_filter": args.row_filter,
                                 **keyless_runs(spec_path, dsn, args, env),
                                 "load_average_1m": [load_before, load_average()]}, indent=2)
            print(result)
            if args.json:
                args.json.write_text(result + "\n")
            return 0
        if args.jvm_archive:
            timed_cli("run", *spec, env=env)  # creates publication and slot
            measured = archive_runs(spec_path, dsn, args, env, work)
            result = json.dumps({"changes_per_batch": args.changes, "load_average_1m": [load_before, load_average()],
                                 **measured}, indent=2)
            print(result)
            if args.json:
                args.json.write_text(result + "\n")
            return 0
        if args.schema_change:
            timed_cli("run", *spec, env=env)  # creates publication and slot
            measured = schema_change_runs(spec, dsn, args, env)
            result = json.dumps({"changes_per_batch": args.changes, "row_filter": args.row_filter,
                                 "code": str(args.code) if args.code else "this checkout",
                                 "load_average_1m": [load_before, load_average()], **measured}, indent=2)
            print(result)
            if args.json:
                args.json.write_text(result + "\n")
            return 0
        help_s = [timed_cli("--help", env=env) for _ in range(args.repeat)]
        first_s = timed_cli("run", *spec, env=env)  # creates publication and slot
        empty_s = [timed_cli("run", *spec, env=env) for _ in range(args.repeat)]
        # The rows the plain batches update and delete: inserted (and applied) by one seed batch first.
        seed_rows = args.changes * args.repeat
        execute(dsn, f"INSERT INTO t SELECT g, g, md5(g::text), g * 0.01, now() FROM generate_series(1, {seed_rows}) g")
        seed_s = timed_cli("run", *spec, env=env)
        plain_s: list[float] = []
        plain_out: list[dict[str, Any]] = []
        for i in range(args.repeat):
            plain_batch(dsn, args.changes, 500_000 + 1_000 * i, 1 + i * args.changes)
            plain_s.append(timed_cli("run", *spec, env=env, out=plain_out))
        small_s: list[float] = []
        small_out: list[dict[str, Any]] = []
        for i in range(args.repeat):
            small_batch(dsn, args.changes, 1_000_000 * (i + 1))
            small_s.append(timed_cli("run", *spec, env=env, out=small_out))
        # Last: a TRUNCATE empties the table (the rows a later batch updates must exist before it).
        trunc_s: list[float] = []
        trunc_out: list[dict[str, Any]] = []
        for i in range(args.repeat):
            truncate_batch(dsn, args.changes, 2_000_000 + 1_000 * i)
            trunc_s.append(timed_cli("run", *spec, env=env, out=trunc_out))
        spark = [o.get("spark") or {} for o in small_out]  # absent from older code's output
        plain_spark = [o.get("spark") or {} for o in plain_out]
        split = [] if args.no_split else [
            in_process(spec_path, dsn, args.changes, 1_000_000 * (args.repeat + i + 1), work / f"events{i}")
            for i in range(args.repeat)]
        connect = connect_runs(spec_path, dsn, args, env, work) if args.connect else {}
        median = {key: statistics.median(s[key] for s in split if s[key] is not None)
                  for key in (split[0] if split else {}) if any(s[key] is not None for s in split)}
        result = json.dumps({
            "changes_per_batch": args.changes,
            "code": str(args.code) if args.code else "this checkout",
            "inprocess_rows": args.inprocess_rows,
            "direct": args.direct,
            "row_filter": args.row_filter,
            "target": args.target,
            "staging": args.staging,
            "load_average_1m": [load_before, load_average()],
            "cli_help_s": round(statistics.median(help_s), 2),
            "cli_first_run_creating_slot_s": round(first_s, 2),
            "cli_run_empty_slot_s": [round(s, 2) for s in empty_s],
            "cli_run_empty_slot_median_s": round(statistics.median(empty_s), 2),
            "cli_run_seed_batch_s": round(seed_s, 2),
            "cli_run_plain_batch_s": [round(s, 2) for s in plain_s],
            "cli_run_plain_batch_median_s": round(statistics.median(plain_s), 2),
            "cli_run_plain_batch_spark": plain_spark,
            "cli_run_small_batch_s": [round(s, 2) for s in small_s],
            "cli_run_small_batch_median_s": round(statistics.median(small_s), 2),
            "cli_run_small_batch_spark": spark,
            "cli_run_truncate_batch_s": [round(s, 2) for s in trunc_s],
            "cli_run_truncate_batch_median_s": round(statistics.median(trunc_s), 2),
            "cli_run_truncate_batch_spark": [o.get("spark") or {} for o in trunc_out],
            "plain_vs_spark_batch_ratio": round(statistics.median(plain_s) / statistics.median(small_s), 3),
            "in_process_split_median": {k: round(v, 2) for k, v in median.items()},
            "in_process_split_runs": split,
            **connect,
        }, indent=2)
        print(result)
        if args.json:
            args.json.write_text(result + "\n")
        return 0
    finally:
        store.close()
        stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
