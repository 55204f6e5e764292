"""Command-line entry of the apply Spark application: arguments → ApplyConfig → ``apply_slot``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from airflow_provider_pglogical.apply.config import ApplyConfig


def parse_args(argv: Sequence[str]) -> ApplyConfig:
    p = argparse.ArgumentParser(prog="apply_batches", description="Apply staged pgoutput batches to PostgreSQL")
    p.add_argument("--slot", required=True)
    p.add_argument("--staging-root", required=True)
    p.add_argument("--tables-json", default="{}", help="JSON object: source schema.table -> TableApplyConfig fields")
    p.add_argument("--dsn-env", default="PGLOGICAL_TARGET_DSN", help="environment variable holding the target DSN")
    p.add_argument("--dsn-file", default=None, help="0600 file holding the target DSN (instead of --dsn-env)")
    p.add_argument("--max-batches", type=int, default=None)
    p.add_argument("--write-partitions", type=int, default=None)
    a = p.parse_args(argv)
    return ApplyConfig.from_dict({
        "slot": a.slot, "staging_root": a.staging_root, "tables": json.loads(a.tables_json),
        "dsn_env": a.dsn_env, "dsn_file": a.dsn_file, "max_batches": a.max_batches,
        "write_partitions": a.write_partitions})


def main(argv: Sequence[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.runner import apply_slot, read_dsn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_args(sys.argv[1:] if argv is None else argv)
    dsn = read_dsn(config)
    spark = (SparkSession.builder.appName(f"pglogical-apply-{config.slot}")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    try:
        reports = apply_slot(spark, config, dsn)
    finally:
        spark.stop()
    applied = sum(r.applied for r in reports)
    # One machine-readable summary line (counts only, never row values).
    print(json.dumps({"slot": config.slot, "batches": len(reports), "applied": applied,
                      "end_lsn": max((r.end_lsn for r in reports), default=None),
                      "rows": {f"{r.end_lsn:X}": r.rows for r in reports if r.applied}}))
    return 0
