"""An apply of staged snapshots + changes in a child process that dies (exit 137) at a kill point.

Usage: python -m tests.support.snapshot_apply_child '<json>' with keys dsn (target), slot,
staging_uri, kill_at: a checkpoint of ``apply/targets/postgres/snapshot.CHECKPOINTS`` (optionally
"name:n" for its n-th occurrence), or ``mid_copy``: a thread watching the target's
``pg_stat_progress_copy`` kills the process while the load transaction COPYs a snapshot into ``wide``.

Spark starts only if a step needs it (``SparkOnDemand``, as ``pglogical run`` does): the snapshot groups'
transactions, where the kill points are, are the same either way, and the plain snapshot rows and small change
batches of the crash test need none, so its children start no JVM.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import psycopg2

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget
from tests.support.kill_points import KILLED, die, dying_at

__all__ = ["KILLED"]


def kill_mid_copy(dsn: str, min_rows: int = 1000) -> None:
    """Die once the load transaction has COPYed ``min_rows`` rows of a snapshot into ``wide`` (not all yet)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    while True:
        cur.execute("SELECT 1 FROM pg_stat_progress_copy p JOIN pg_class c ON c.oid = p.relid "
                    "WHERE p.command = 'COPY FROM' AND c.relname = 'wide' AND p.tuples_processed >= %s",
                    (min_rows,))
        if cur.fetchone() is not None:
            die()
        time.sleep(0.002)


def main() -> None:
    from tests.support.spark import local_session

    args = json.loads(sys.argv[1])
    checkpoint = dying_at(args["kill_at"])
    spark = SparkOnDemand(lambda: local_session("snapshot-apply-child"))
    if args["kill_at"] == "mid_copy":
        threading.Thread(target=kill_mid_copy, args=(args["dsn"],), daemon=True).start()
    config = ApplyConfig(slot=args["slot"], staging_root=args["staging_uri"], tables={})
    target = PostgresTarget(spark, config, args["dsn"], target_tables=args.get("target_tables", ()),
                            on_checkpoint=checkpoint)
    apply_slot(spark, config, target=target)
    if spark.started:
        spark.session().stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
