"""Spark application: apply a pipeline spec's staged batches from the driver spark-submit started.

The PostgreSQL apply app (``apply/app.py``) takes its target as arguments; this one takes the spec file, so any
target the spec names is applied the way ``pglogical apply`` applies it — the lake targets (Delta, Iceberg), whose
table libraries commit from the driver, reached on a classic cluster with spark-submit (client deploy mode: the
spec file and the target's credentials, ``AWS_*`` or ``target.conn_id``, are the driver host's). The Spark work
runs on the master's executors; the session is spark-submit's, stopped here.

    spark-submit --master spark://host:7077 spark_apps/apply_spec.py --spec pipeline.yaml [--max-batches N]
        [--target NAME] [--summary-file PATH] [--credentials-from-env]

Prints the apply's JSON summary (counts only) as its last line (and into ``--summary-file``). ``--target`` picks one
target of a ``targets:`` spec. ``--credentials-from-env``: the submitter (the DAG's ``SpecSubmitApplyOperator``)
resolved ``target.conn_id`` into this process's environment already, so no Airflow connection is looked up here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_pglogical.apply.sparkenv import SESSION_CONF
from airflow_provider_pglogical.pipeline.fanout import select_views
from airflow_provider_pglogical.pipeline.runs import SparkStarter, apply_pending
from airflow_provider_pglogical.pipeline.spec import PipelineSpec, load_spec

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
    p.add_argument("--target", default=None, help="the one target of a targets: spec to apply")
    p.add_argument("--summary-file", default=None, help="also write the JSON summary here")
    p.add_argument("--credentials-from-env", action="store_true",
                   help="the target's credentials are in this process's environment: look up no target.conn_id")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    spec = one_target(load_spec(args.spec), args.target)
    if args.credentials_from_env:
        spec = replace(spec, target=replace(spec.target, conn_id=None))
    spark = SparkSession.builder.appName(f"pglogical-apply-{spec.source.slot}").config(map={**SESSION_CONF}).getOrCreate()
    try:
        result = apply_pending(spec, max_batches=args.max_batches, log=_log, spark=GivenSession(spark),
                               tool="spark-submit")
    finally:
        spark.stop()
    summary = json.dumps(result, sort_keys=True)
    if args.summary_file:
        Path(args.summary_file).write_text(summary, encoding="utf-8")
    print(summary)
    return 0


def one_target(spec: PipelineSpec, name: str | None) -> PipelineSpec:
    """The view of target ``name`` of a ``targets:`` spec (``SpecError`` naming the spec's targets when it has no
    such target); the spec itself without a name."""
    if name is None:
        return spec
    (view,) = select_views(spec, [name]).values()
    return view


if __name__ == "__main__":  # the application the DAG submits when the package is installed without spark_apps/
    sys.exit(main())
