"""An initial snapshot whose published tables load while it reads on (``targets/postgres/overlap.py``), in a child
process that dies (exit 137) at a kill point of the overlapped load, while the snapshot still reads a table.

Usage: python -m tests.support.snapshot_overlap_child '<json>' with keys source (DSN), target (DSN), slot,
publication, staging_uri, tables (schema.table names in reading order), chunk_bytes, kill_at (a checkpoint of
``apply/targets/postgres/snapshot.CHECKPOINTS``, optionally "name:n"), and optionally streamed (true: the
loader follows the chunks of tables read alone, ``streamed.py``).

The snapshot reads in this process (one reader) and holds its reading at the first chunk written after a table
was published (streamed: at the first chunk written) until the load of that table kills the process: the kill
lands inside the overlapped window.
"""

from __future__ import annotations

import json
import sys
import time

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.targets.postgres.overlap import OverlappedLoad
from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget
from airflow_provider_pglogical.apply.without_spark import refusing_session
from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, initial_snapshot
from tests.support.kill_points import dying_at

HOLD_S = 120.0  # longer than any load of the test's tables: the kill ends the wait


def main() -> None:
    args = json.loads(sys.argv[1])
    config = ApplyConfig(slot=args["slot"], staging_root=args["staging_uri"], tables={})
    loader = OverlappedLoad(lambda: (PostgresTarget(refusing_session(True), config, args["target"],
                                                    on_checkpoint=dying_at(args["kill_at"])), config))
    streamed = bool(args.get("streamed"))
    published = streamed  # a streamed table is loaded from its first chunk on
    held: list[str] = []  # once: a kill point never reached fails the test after one wait, not one per chunk

    def hold(point: str) -> None:
        if point == "done":
            nonlocal published
            published = True
        elif point == "chunk_written" and published and not held:
            held.append(point)
            time.sleep(HOLD_S)

    job = SnapshotJob(dsn=args["source"], slot=args["slot"], publication=args["publication"],
                      staging_uri=args["staging_uri"], tables={t: (None, None) for t in args["tables"]},
                      settings=SnapshotSettings(initial=True, parallelism=1, chunk_bytes=args["chunk_bytes"]))
    initial_snapshot(job, on_checkpoint=hold, on_published=loader if streamed else loader.published)
    loader.close()
    sys.exit(0)  # the kill point was never reached: the parent test fails on this status


if __name__ == "__main__":
    main()
