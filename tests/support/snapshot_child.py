"""A snapshot run (initial or pending tables) in a child process that dies (exit 137) at a checkpoint.

Usage: python -m tests.support.snapshot_child '<json>' with keys dsn, slot, publication,
staging_uri, tables ({name: [columns|null, filter|null]}), mode (initial|pending), kill_at
(checkpoint name, optionally "name:n" for its n-th occurrence), parallelism, chunk_bytes.
"""

from __future__ import annotations

import json
import sys

from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, initial_snapshot, sync_pending
from tests.support.kill_points import KILLED, dying_at

__all__ = ["KILLED"]


def main() -> None:
    args = json.loads(sys.argv[1])
    job = SnapshotJob(dsn=args["dsn"], slot=args["slot"], publication=args["publication"],
                      staging_uri=args["staging_uri"],
                      tables={t: (tuple(c) if c else None, f) for t, (c, f) in args["tables"].items()},
                      settings=SnapshotSettings(initial=True, parallelism=args.get("parallelism", 1),
                                                chunk_bytes=args.get("chunk_bytes", 1 << 20)))
    run = initial_snapshot if args["mode"] == "initial" else sync_pending
    run(job, on_checkpoint=dying_at(args["kill_at"]))
    sys.exit(0)


if __name__ == "__main__":
    main()
