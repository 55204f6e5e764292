"""An apply into an Iceberg target in a child process that dies (exit 137, no cleanup) at a kill point.

Usage: python -m tests.support.iceberg_apply_child '<json>' with keys catalog (pyiceberg catalog properties),
namespace, slot, staging_uri, mode, tables (source → {row_filter, columns, unchanged_toast}) and kill_at:
``<checkpoint>@<target table>`` (a checkpoint of ``apply/targets/iceberg/target.CHECKPOINTS``), or "" to finish.
"""

from __future__ import annotations

import json
import sys

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from tests.support.kill_points import KILLED, die

__all__ = ["KILLED"]


def main() -> None:
    from tests.support.spark import local_session

    args = json.loads(sys.argv[1])
    point, _, table = args["kill_at"].partition("@")

    def checkpoint(name: str, target: str) -> None:
        if (name, target) == (point, table):
            die()

    # Started only for a table-batch the direct path does not cover, as ``pglogical run`` does: the kill points are
    # the Iceberg target's own (its files and catalog commit), whichever path netted the batch.
    spark = SparkOnDemand(lambda: local_session("iceberg-apply-child"), local_master=True)
    tables = {name: TableApplyConfig(**cfg) for name, cfg in args["tables"].items()}
    config = ApplyConfig(slot=args["slot"], staging_root=args["staging_uri"], tables=tables)
    target = IcebergTarget(IcebergLocation(args["catalog"], args["namespace"]), args["slot"], mode=args["mode"],
                           on_checkpoint=checkpoint)
    apply_slot(spark, config, target=target)
    if spark.started:
        spark.session().stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
