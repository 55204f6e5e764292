"""Spark application: apply a pipeline spec's staged batches from the driver spark-submit started.

The PostgreSQL apply app (``apply/app.py``) takes its target as arguments; this one takes the spec file, so any
target the spec names is applied the way ``pglogical apply`` applies it — the lake targets (Delta, Iceberg), whose
table libraries commit from the driver, reached on a classic cluster with spark-submit (client deploy mode: the
spec file and the target's credentials, ``AWS_*`` or ``target.conn_id``, are the driver host's). The Spark work
runs on the master's executors; the session is spark-submit's, stopped here.

    spark-submit --master spark://host:7077 spark_apps/apply_spec.py --spec pipeline.yaml [--max-batches N]

Prints the apply's JSON summary (counts only) as its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_provider_pglogical.pipeline.runs import SparkStarter, apply_pending
from airflow_provider_pglogical.pipeline.spec import load_spec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class GivenSession(SparkStarter):
    """A ``SparkStarter`` of a session that is running already (spark-submit's): nothing to start or stop."""

    def __init__(self, session: SparkSession) -> None:
        super().__init__(session.conf.get("spark.master", None))
        self._given = session

    def start(self, reason: str = "") -> None:
        return

    def session(self) -> SparkSession:
        return self._given

    def stop(self) -> None:
        return


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    p = argparse.ArgumentParser(prog="apply_spec", description="Apply a pipeline spec's staged batches")
    p.add_argument("--spec", required=True, help="the pipeline spec file (on the driver's host)")
    p.add_argument("--max-batches", type=int, default=None)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    spec = load_spec(args.spec)
    spark = (SparkSession.builder.appName(f"pglogical-apply-{spec.source.slot}")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    try:
        result = apply_pending(spec, max_batches=args.max_batches, log=_log, spark=GivenSession(spark),
                               tool="spark-submit")
    finally:
        spark.stop()
    print(json.dumps(result, sort_keys=True))
    return 0
