"""A drain run in a child process that dies (exit 137, no cleanup) at a chosen point.

Usage: python -m tests.support.drain_child '<json>' with keys dsn, slot, publication,
staging_uri, kill_at (a checkpoint name, or "transaction:<n>" to die mid-write after n
transactions), and optional max_changes / row_group_rows / read, and ``run`` (true: ``drain_run``, several
batches under one lock with the slot advanced once, instead of one ``drain_slot`` cycle).
"""

from __future__ import annotations

import json
import sys

# The plain psycopg2 slot client the CLI drains with, not the Airflow hook wrapping it: the drain and its durable
# steps are the same library function either way, and a child then does not import Airflow (about 1.5 CPU-seconds).
from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient
from airflow_provider_pglogical.staging import writer as writer_module
from airflow_provider_pglogical.staging.drain import DrainConfig, drain_run, drain_slot
from tests.support.kill_points import KILLED, die, dying_at

__all__ = ["KILLED"]


def main() -> None:
    args = json.loads(sys.argv[1])
    kill_at: str = args["kill_at"]

    if kill_at.startswith("transaction:"):
        limit = int(kill_at.split(":", 1)[1])
        original = writer_module.BatchWriter.write_transaction

        def write_then_die(self, tx):  # test-only wrapper: production code has no kill switch
            original(self, tx)
            if self.manifest.transactions >= limit:
                die()

        writer_module.BatchWriter.write_transaction = write_then_die

    client = PgLogicalClient.from_dsn(args["dsn"])
    config = DrainConfig(slot=args["slot"], publication=args["publication"], staging_uri=args["staging_uri"],
                         max_changes=args.get("max_changes"), row_group_rows=args.get("row_group_rows", 65536),
                         read=args.get("read", "sql"))
    if args.get("run"):
        drain_run(client, config, on_checkpoint=dying_at(kill_at))
    else:
        drain_slot(client, config, on_checkpoint=dying_at(kill_at))
    sys.exit(0)


if __name__ == "__main__":
    main()
