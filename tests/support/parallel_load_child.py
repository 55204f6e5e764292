"""An apply of staged snapshots in a child process that dies (exit 137) at a kill point, Spark started only if a step
needs it (a snapshot loaded from the staged files needs none).

Usage: python -m tests.support.parallel_load_child '<json>' with keys dsn (target), slot, staging_uri, kill_at (a
checkpoint of ``apply/targets/postgres/snapshot.CHECKPOINTS`` or ``parallel_load.CHECKPOINTS``, optionally "name:n"),
write_partitions (the COPY streams of a created table's load).
"""

from __future__ import annotations

import json
import sys

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget
from tests.support.kill_points import KILLED, dying_at

__all__ = ["KILLED"]


def main() -> None:
    from tests.support.spark import local_session

    args = json.loads(sys.argv[1])
    spark = SparkOnDemand(lambda: local_session("parallel-load-child"))
    config = ApplyConfig(slot=args["slot"], staging_root=args["staging_uri"], tables={},
                         write_partitions=args["write_partitions"])
    target = PostgresTarget(spark, config, args["dsn"], on_checkpoint=dying_at(args["kill_at"]))
    apply_slot(spark, config, target=target)
    sys.exit(0)


if __name__ == "__main__":
    main()
