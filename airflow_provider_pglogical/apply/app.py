"""Command-line entry of the apply Spark application: arguments → ApplyConfig → ``apply_slot``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.exceptions import PgLogicalError

if TYPE_CHECKING:
    from airflow_provider_pglogical.apply.targets.base import BatchReport


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="apply_batches", description="Apply staged pgoutput batches to PostgreSQL")
    p.add_argument("--slot", required=True)
    p.add_argument("--staging-root", required=True)
    p.add_argument("--tables-json", default="{}", help="JSON object: source schema.table -> TableApplyConfig fields")
    p.add_argument("--dsn-env", default="PGLOGICAL_TARGET_DSN", help="environment variable holding the target DSN")
    p.add_argument("--dsn-file", default=None,
                   help="0600 file holding the target DSN, instead of --dsn-env (relative: to the driver's working "
                        "directory, where YARN puts --files)")
    p.add_argument("--max-batches", type=int, default=None)
    p.add_argument("--write-partitions", type=int, default=None)
    p.add_argument("--bookkeeping-schema", default=None, help="schema of the progress, rejects and staging tables")
    p.add_argument("--session-replication-role", default="origin", choices=("origin", "replica"),
                   help="replica: apply like a native subscriber (the target's foreign keys and triggers do not fire)")
    p.add_argument("--report-file", default=None, help="append one JSON line per applied batch (counts only)")
    return p


def parse_args(argv: Sequence[str]) -> ApplyConfig:
    a = _parser().parse_args(argv)
    return ApplyConfig.from_dict({
        "slot": a.slot, "staging_root": a.staging_root, "tables": json.loads(a.tables_json),
        "dsn_env": a.dsn_env, "dsn_file": a.dsn_file, "max_batches": a.max_batches,
        "write_partitions": a.write_partitions, "bookkeeping_schema": a.bookkeeping_schema,
        "session_replication_role": a.session_replication_role})


def report_file(argv: Sequence[str]) -> str | None:
    """``--report-file``: about this process, not the apply, so it is not part of ApplyConfig."""
    path: str | None = _parser().parse_args(argv).report_file
    return path


def report_line(report: BatchReport) -> str:
    """One batch's report as the JSON line the Airflow apply task reads (counts only, never row values)."""
    return json.dumps({"start_lsn": report.start_lsn, "end_lsn": report.end_lsn, "applied": report.applied,
                       "rows": report.rows, "seconds": report.seconds, "ordered": report.ordered})


def summary_line(slot: str, reports: Sequence[BatchReport]) -> str:
    """The run's machine-readable summary (counts only, never row values): the app's last line on stdout, which
    the Airflow apply task logs for the batches it applied in the worker too."""
    return json.dumps({"slot": slot, "batches": len(reports), "applied": sum(r.applied for r in reports),
                       "end_lsn": max((r.end_lsn for r in reports), default=None),
                       "rows": {f"{r.end_lsn:X}": r.rows for r in reports if r.applied}})


def batch_report_writer(path: str | None) -> Callable[[BatchReport], None] | None:
    """An ``on_batch`` callback appending each batch's report as one JSON line (flushed: the
    operator reads the committed batches' reports even when a later batch fails)."""
    if not path:
        return None

    def write(report: BatchReport) -> None:
        with open(path, "a", encoding="utf-8") as out:
            out.write(report_line(report) + "\n")

    return write


def main(argv: Sequence[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.dsn import read_dsn
    from airflow_provider_pglogical.apply.runner import apply_slot
    from airflow_provider_pglogical.apply.sparkenv import SESSION_CONF, check_pyspark_install

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    config = parse_args(argv)
    try:
        dsn = read_dsn(config)
    except PgLogicalError as e:
        # Before Spark starts: one line in the driver's log (on the cluster in cluster deploy mode), no traceback.
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    check_pyspark_install()
    spark = SparkSession.builder.appName(f"pglogical-apply-{config.slot}").config(map={**SESSION_CONF}).getOrCreate()
    try:
        reports = apply_slot(spark, config, dsn, on_batch=batch_report_writer(report_file(argv)))
    finally:
        spark.stop()
    print(summary_line(config.slot, reports))
    return 0
