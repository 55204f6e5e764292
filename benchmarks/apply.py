"""Benchmark: the same mixed changes applied by a native subscriber and by drain → stage → Spark apply, timed in one run.

Usage: python benchmarks/apply.py [--changes 1000000] [--tx-rows 10000] [--max-changes 250000] [--targets postgres,delta]
Prints one JSON object with the timings and the ratios ours / native, per target (PostgreSQL, Delta Lake on
local disk); the Delta apply runs after the PostgreSQL one, in the same (warm) Spark session.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig  # noqa: E402
from airflow_provider_pglogical.apply.runner import apply_slot  # noqa: E402
from airflow_provider_pglogical.hooks import PgLogicalHook  # noqa: E402
from tests.conftest import make_database  # noqa: E402
from tests.pgserver import execute, query, start_server, stop_server  # noqa: E402
from tests.subscriber import drain_all, subscribe, wait_for_subscriber  # noqa: E402
from tests.unit.apply.targetdb import make_target  # noqa: E402

SCHEMA = """
CREATE TABLE bench (id bigint PRIMARY KEY, grp int NOT NULL, amount numeric(12,2), note text,
                    updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench_small (k int PRIMARY KEY, hits bigint NOT NULL);
"""


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=1_000_000)
    p.add_argument("--tx-rows", type=int, default=10_000)
    p.add_argument("--max-changes", type=int, default=250_000, help="drain batch size (changes)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--targets", default="postgres,delta", help="comma-separated: postgres, delta")
    args = p.parse_args()
    from pyspark.sql import SparkSession

    server = start_server()
    try:
        source, native = make_database(server), make_database(server)
        _, ours = make_target(server)
        src_dsn, native_dsn = server.dsn(source), server.dsn(native)
        execute(src_dsn, SCHEMA + "CREATE PUBLICATION pub_all FOR TABLE bench, bench_small;")
        execute(native_dsn, SCHEMA)
        execute(ours, SCHEMA)
        subscribe(src_dsn, native_dsn, publication="pub_all", name="sub_bench")
        execute(native_dsn, "ALTER SUBSCRIPTION sub_bench DISABLE")  # let the changes pile up first
        PgLogicalHook.from_dsn(src_dsn).create_slot("ours")
        t0 = time.monotonic()
        counts = workload(src_dsn, args.changes, args.tx_rows)
        generate_s = time.monotonic() - t0

        t0 = time.monotonic()
        execute(native_dsn, "ALTER SUBSCRIPTION sub_bench ENABLE")
        wait_for_subscriber(src_dsn, native_dsn, name="sub_bench", timeout=3600)
        native_s = time.monotonic() - t0

        staging = tempfile.mkdtemp(prefix="pglogical-bench-")
        t0 = time.monotonic()
        batches = drain_all(src_dsn, staging, max_changes=args.max_changes)
        drain_s = time.monotonic() - t0
        spark = (SparkSession.builder.master(args.master).appName("pglogical-bench")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.memory", "2g").getOrCreate())
        config = ApplyConfig(slot="ours", staging_root=staging, tables={"public.bench": TableApplyConfig()})
        targets = set(args.targets.split(","))
        result: dict = {
            "changes": sum(counts.values()), "by_op": counts, "generate_s": round(generate_s, 1),
            "native_apply_s": round(native_s, 1), "drain_s": round(drain_s, 1), "batches": batches}
        same = True
        if "postgres" in targets:
            t0 = time.monotonic()
            reports = apply_slot(spark, config, ours)
            apply_s = time.monotonic() - t0
            same = query(ours, "SELECT count(*), sum(hashtext(bench::text)) FROM bench") == \
                query(native_dsn, "SELECT count(*), sum(hashtext(bench::text)) FROM bench")
            result.update({
                "spark_apply_s": round(apply_s, 1), "batches_applied": sum(r.applied for r in reports),
                "ratio_spark_apply_over_native": round(apply_s / native_s, 2),
                "ratio_drain_plus_apply_over_native": round((drain_s + apply_s) / native_s, 2),
                "targets_identical": same})
        if "delta" in targets:
            from deltalake import DeltaTable

            from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
            from airflow_provider_pglogical.apply.targets.delta.runner import apply_slot as apply_delta
            from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget

            lake = DeltaLocation(tempfile.mkdtemp(prefix="pglogical-bench-lake-"))
            t0 = time.monotonic()
            reports = apply_delta(spark, config, DeltaTarget(lake, "ours"))
            delta_s = time.monotonic() - t0
            rows = DeltaTable(lake.table_uri("public.bench")).to_pyarrow_table().sort_by("id")
            native_rows = query(native_dsn, "SELECT id, grp, amount, note, updated_at FROM bench ORDER BY id")
            delta_same = [tuple(r.values()) for r in rows.to_pylist()] == [tuple(r) for r in native_rows]
            same = same and delta_same
            result.update({
                "delta_apply_s": round(delta_s, 1), "delta_batches_applied": sum(r.applied for r in reports),
                "delta_stage_and_merge_s": [r.seconds.get("apply") for r in reports],
                "ratio_delta_apply_over_native": round(delta_s / native_s, 2),
                "ratio_drain_plus_delta_over_native": round((drain_s + delta_s) / native_s, 2),
                "delta_identical_to_native": delta_same})
        spark.stop()
        print(json.dumps(result, indent=2))
        return 0 if same else 1
    finally:
        stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
