"""Benchmark: a table-batch whose keys repeat netted in process by the Arrow kernels against Spark's net frame.

Stages ``--changes`` changes of one table in one batch from a real source (rows inserted, updated two or three times
and some deleted, in transactions of 100 changes: every key repeats; four of five updates leave the TOASTed
``body`` unchanged), then, alternately ``--repeat`` times after a warm-up round, nets them with ``direct.compacted_rows``
over the staged files (read included) and with Spark's ``SparkBatchChanges.net`` (``transforms.compact``) written
with Spark's ``noop`` format in a warm local[2] session. Prints one JSON object with every timing, the row counts
(equal) and the ratio of the medians; nothing touches a target. JVM start is not counted: with a cold JVM the
Spark side costs its start too (``benchmarks/small_run.py``).

Usage: python benchmarks/kernels.py [--changes 100000] [--repeat 3]
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

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from airflow_provider_pglogical.apply import direct, kernels  # noqa: E402
from airflow_provider_pglogical.apply.batches import list_batches, read_relations  # noqa: E402
from airflow_provider_pglogical.apply.changes import SparkBatchChanges  # noqa: E402
from airflow_provider_pglogical.apply.config import TableApplyConfig  # noqa: E402
from airflow_provider_pglogical.apply.targets.base import PlannedTable  # noqa: E402
from airflow_provider_pglogical.hooks import PgLogicalHook  # noqa: E402
from scripts.harness.pgserver import execute, make_database, start_server, stop_server  # noqa: E402
from scripts.harness.subscriber import drain_all  # noqa: E402

SCHEMA = """CREATE TABLE t (id int PRIMARY KEY, a int NOT NULL, b text, c numeric(12,2), body text);
ALTER TABLE t ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE PUBLICATION pub_t FOR TABLE t;"""


def workload(dsn: str, changes: int) -> None:
    """About ``changes`` changes: per 100, 40 inserts, 50 updates of those rows (all but the 10 setting ``body``
    leave it unchanged-TOAST) and 10 deletes."""
    for start in range(0, changes, 100):
        base = start * 10 + 1
        execute(dsn, f"""BEGIN;
INSERT INTO t SELECT g, g, md5(g::text), g * 0.01, repeat(md5(g::text), 80) FROM generate_series({base}, {base + 39}) g;
UPDATE t SET a = a + 1, b = NULL WHERE id BETWEEN {base} AND {base + 29};
UPDATE t SET a = a + 2 WHERE id BETWEEN {base} AND {base + 9};
UPDATE t SET c = 1, body = 'x' WHERE id BETWEEN {base + 10} AND {base + 19};
DELETE FROM t WHERE id BETWEEN {base + 30} AND {base + 39};
COMMIT;""")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    staging = tempfile.mkdtemp(prefix="pglogical-bench-kernels-")
    server = start_server()
    try:
        src = server.dsn(make_database(server))
        execute(src, SCHEMA)
        PgLogicalHook.from_dsn(src).create_slot("ours")
        workload(src, args.changes)
        drain_all(src, staging, slot="ours", publication="pub_t", max_changes=args.changes * 2)
    finally:
        stop_server(server)
    try:
        from pyspark.sql import SparkSession

        from airflow_provider_pglogical.apply.sparkenv import use_package_python

        (batch,) = list_batches(staging, "ours")
        rel = read_relations(batch)["public.t"]
        table = PlannedTable("public.t", "public.t", ("id",), tuple(rel.column_names), rel, TableApplyConfig())
        os.environ[direct.ROWS_SWITCH] = str(args.changes * 2)
        net = direct.batch_files(table, batch, None)
        if net is None or not net.compacted:
            raise SystemExit("the batch is not netted in process: nothing to compare")
        use_package_python()
        spark = (SparkSession.builder.master("local[2]").appName("pglogical-bench-kernels")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.memory", "2g").getOrCreate())

        def in_process() -> int:
            staged = pa.concat_tables([pq.read_table(f, columns=list(kernels.STAGED_COLUMNS)) for f in net.files])
            return int(direct.compacted_rows(staged, net).num_rows)

        def spark_net() -> int:
            SparkBatchChanges(spark, batch).net(table).write.format("noop").mode("overwrite").save()
            return -1  # counted once below, outside the timings

        seconds: dict[str, list[float]] = {"in_process": [], "spark": []}
        rows: dict[str, int] = {}
        for round_ in range(args.repeat + 1):  # the first round warms the JVM up and is not counted
            for name, run in (("in_process", in_process), ("spark", spark_net)):
                t0 = time.monotonic()
                rows[name] = run()
                if round_:
                    seconds[name].append(round(time.monotonic() - t0, 3))
        rows["spark"] = SparkBatchChanges(spark, batch).net(table).count()
        spark.stop()
        median = {name: statistics.median(s) for name, s in seconds.items()}
        print(json.dumps({
            "staged_changes": int(batch.manifest.tables["public.t"]["rows"]), "net_rows": rows, "seconds": seconds,
            "ratio_in_process_over_spark": round(median["in_process"] / median["spark"], 3),
            "load_average": [round(x, 2) for x in os.getloadavg()]}, indent=2))
        return 0
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
