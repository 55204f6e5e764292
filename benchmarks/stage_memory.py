"""Stage one large batch (default 1M changes incl. a 250k-row transaction); report peak RSS and rows/s.

    python benchmarks/stage_memory.py [--changes N] [--big-tx N] [--dsn DSN] [--keep]

Without ``--dsn`` a throwaway PostgreSQL server is started (scripts/harness/pgserver.py). Peak RSS is this
process's ``ru_maxrss`` (the drain runs in-process; the server's memory is not included).
"""

from __future__ import annotations

import argparse
import logging
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2  # noqa: E402

from airflow_provider_pglogical.hooks import PgLogicalHook  # noqa: E402
from airflow_provider_pglogical.staging.drain import DrainConfig, drain_slot  # noqa: E402
from airflow_provider_pglogical.staging.writer import DEFAULT_ROW_GROUP_ROWS  # noqa: E402


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def load(dsn: str, changes: int, big_tx: int, tx_rows: int) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("CREATE TABLE IF NOT EXISTS bench (id bigint PRIMARY KEY, account int, amount numeric(12,2),"
                " note text, at timestamptz DEFAULT now())")
    hook = PgLogicalHook.from_dsn(dsn)
    hook.create_publication("bench_pub", ["bench"])
    hook.create_slot("bench_slot")
    hook.close()
    t0 = time.monotonic()
    cur.execute("INSERT INTO bench (id, account, amount, note) SELECT g, g %% 1000, g * 0.01, 'big ' || g"
                " FROM generate_series(1, %s) g", (big_tx,))
    rest = changes - big_tx
    txs = max(rest // tx_rows, 0)
    cur.execute(f"""
        DO $$ BEGIN
          FOR i IN 0..{txs - 1} LOOP
            INSERT INTO bench (id, account, amount, note)
              SELECT {big_tx} + i * {tx_rows} + g, g, g * 0.5, 'small ' || g FROM generate_series(1, {tx_rows}) g;
            COMMIT;
          END LOOP;
        END $$""")
    print(f"loaded {big_tx + txs * tx_rows} changes ({txs + 1} transactions) in {time.monotonic() - t0:.1f}s")
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--big-tx", type=int, default=250_000)
    parser.add_argument("--tx-rows", type=int, default=100)
    parser.add_argument("--dsn")
    parser.add_argument("--row-group-rows", type=int, default=DEFAULT_ROW_GROUP_ROWS)
    parser.add_argument("--memory-budget", type=int, default=None,
                        help="decoder budget of buffered raw bytes before a transaction spills (default: DrainConfig's)")
    parser.add_argument("--keep", action="store_true", help="keep the staged batch")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    server = None
    if args.dsn is None:
        from scripts.harness.pgserver import start_server

        server = start_server(settings={"logical_decoding_work_mem": "64MB", "work_mem": "64MB"})
        args.dsn = server.dsn()
    staging = Path(tempfile.mkdtemp(prefix="stage-bench-"))
    try:
        load(args.dsn, args.changes, min(args.big_tx, args.changes), args.tx_rows)
        base = rss_mib()
        budget = {} if args.memory_budget is None else {"memory_budget": args.memory_budget}
        hook = PgLogicalHook.from_dsn(args.dsn)
        t0 = time.monotonic()
        result = drain_slot(hook, DrainConfig(slot="bench_slot", publication="bench_pub", staging_uri=str(staging),
                                              max_wal_bytes=None, max_changes=None, itersize=10_000,
                                              row_group_rows=args.row_group_rows, progress_every_s=10,
                                              **budget))
        elapsed = time.monotonic() - t0
        hook.close()
        print(f"staged {result.changes} changes in {result.transactions} transactions, {result.bytes / 2**20:.1f} MiB"
              f" of Parquet, in {elapsed:.1f}s = {result.changes / elapsed:,.0f} changes/s")
        print(f"peak RSS {rss_mib():.0f} MiB (after imports and load: {base:.0f} MiB)")
        if args.keep:
            print(f"batch kept at {result.batch_path}")
    finally:
        if not args.keep:
            shutil.rmtree(staging, ignore_errors=True)
        if server is not None:
            from scripts.harness.pgserver import stop_server

            stop_server(server)


if __name__ == "__main__":
    main()
