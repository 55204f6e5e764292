"""Benchmark: the Spark plan of a filtered REPLICA IDENTITY FULL table-batch, planned against the full reference pipeline.

Stages ``benchmarks/apply.py``'s filtered workload (``--changes``, one batch by default), then in one warm Spark
session writes each frame with Spark's ``noop`` format, alternately, ``--repeat`` times after a warm-up round: the Parquet scan, the
published changes as planned (``SparkBatchChanges.published``) and by the full pipeline (``published_changes``
with the TOAST refill), and the net frame as planned and by the full pipeline (``net_changes``, ``toast=True``,
``compact``). Prints one JSON object with every timing and the ratios of the medians; nothing touches a target.
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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from airflow_provider_pglogical.apply import planning  # noqa: E402
from airflow_provider_pglogical.apply.batches import list_batches, read_changes, read_relations  # noqa: E402
from airflow_provider_pglogical.apply.changes import SparkBatchChanges, net_changes, published_changes  # noqa: E402
from airflow_provider_pglogical.apply.config import TableApplyConfig  # noqa: E402
from airflow_provider_pglogical.apply.targets.base import PlannedTable  # noqa: E402
from airflow_provider_pglogical.hooks import PgLogicalHook  # noqa: E402
from benchmarks.apply import BIG_SCHEMA, FILTER, filtered_workload  # noqa: E402
from scripts.harness.pgserver import (  # noqa: E402
    execute,
    make_database,  # noqa: E402
    start_server,
    stop_server,
)
from scripts.harness.subscriber import drain_all  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=300_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    staging = tempfile.mkdtemp(prefix="pglogical-bench-net-")
    server = start_server()
    try:
        src = server.dsn(make_database(server))
        execute(src, BIG_SCHEMA + "ALTER TABLE big REPLICA IDENTITY FULL; CREATE PUBLICATION pub_all FOR TABLE big;")
        PgLogicalHook.from_dsn(src).create_slot("ours")
        counts = filtered_workload(src, args.changes)
        drain_all(src, staging, max_changes=args.changes * 2)  # one batch
    finally:
        stop_server(server)
    try:
        from pyspark.sql import DataFrame, SparkSession

        from airflow_provider_pglogical.apply.sparkenv import use_package_python

        use_package_python()
        spark = (SparkSession.builder.master("local[2]").appName("pglogical-bench-net")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.memory", "2g").getOrCreate())
        (batch,) = list_batches(staging, "ours")
        rel = read_relations(batch)["public.big"]
        config = TableApplyConfig(row_filter=FILTER)
        columns = tuple(rel.column_names)
        table = PlannedTable("public.big", "public.big", ("id",), columns, rel, config)
        shape = planning.TableShape(table.source, table.target, table.key, table.columns)
        planned = SparkBatchChanges(spark, batch)

        def staged() -> DataFrame:
            return read_changes(spark, batch, table.source)

        frames: dict[str, Callable[[], DataFrame]] = {
            "scan": staged,
            "published_planned": lambda: planned.published(table),
            "published_reference": lambda: published_changes(staged(), rel, config, shape),
            "net_planned": lambda: planned.net(table),
            "net_reference": lambda: net_changes(staged(), rel, config, shape, None, toast=True),
        }
        seconds: dict[str, list[float]] = {name: [] for name in frames}
        for round_ in range(args.repeat + 1):  # the first round warms the JVM up and is not counted
            for name, frame in frames.items():
                t0 = time.monotonic()
                frame().write.format("noop").mode("overwrite").save()
                if round_:
                    seconds[name].append(round(time.monotonic() - t0, 2))
        spark.stop()
        median = {name: statistics.median(s) for name, s in seconds.items()}
        print(json.dumps({
            "changes": sum(counts.values()), "by_op": counts, "seconds": seconds,
            "ratio_published_planned_over_reference": round(median["published_planned"]
                                                            / median["published_reference"], 2),
            "ratio_net_planned_over_reference": round(median["net_planned"] / median["net_reference"], 2),
            "load_average": [round(x, 2) for x in os.getloadavg()]}, indent=2))
        return 0
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
