"""A native subscriber next to our pipeline, for equivalence tests and benchmarks (harness, not tests).

``subscribe`` creates a real ``CREATE SUBSCRIPTION`` on the same server; ``drain_all`` runs our
drain until the slot is caught up. Both sides then hold what the comparison needs.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg2

from airflow_provider_pglogical.hooks import PgLogicalHook
from airflow_provider_pglogical.staging.drain import DrainConfig, drain_run
from scripts.harness.pgserver import execute, query


def connect(dsn: str) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    return conn


def subscribe(source_dsn: str, subscriber_dsn: str, publication: str = "pub_native", name: str = "sub_native") -> None:
    """A native subscription without initial copy; slot created first (same-server CREATE SUBSCRIPTION deadlocks)."""
    execute(source_dsn, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", params=(name,))
    conn = connect(subscriber_dsn)
    with conn.cursor() as cur:
        cur.execute(f"CREATE SUBSCRIPTION {name} CONNECTION %s PUBLICATION {publication} "
                    f"WITH (create_slot = false, slot_name = {name}, copy_data = false)", (source_dsn,))
    conn.close()


def unsubscribe(subscriber_dsn: str, name: str = "sub_native") -> None:
    conn = connect(subscriber_dsn)
    with conn.cursor() as cur:
        cur.execute(f"ALTER SUBSCRIPTION {name} DISABLE")
        cur.execute(f"ALTER SUBSCRIPTION {name} SET (slot_name = NONE)")
        cur.execute(f"DROP SUBSCRIPTION {name}")
    conn.close()


def wait_for_subscriber(source_dsn: str, subscriber_dsn: str, name: str = "sub_native", timeout: float = 120) -> None:
    """Until the subscriber has caught up with the source's current WAL position."""
    (target,) = query(source_dsn, "SELECT pg_current_wal_lsn()::text")[0]
    deadline = time.monotonic() + timeout
    src, sub = connect(source_dsn), connect(subscriber_dsn)
    try:
        while time.monotonic() < deadline:
            with sub.cursor() as cur:
                cur.execute("SELECT coalesce(bool_or(latest_end_lsn >= %s::pg_lsn), false) FROM pg_stat_subscription "
                            "WHERE subname = %s", (target, name))
                sub_done = (cur.fetchone() or (False,))[0]
            with src.cursor() as cur:
                cur.execute("SELECT coalesce(bool_and(replay_lsn >= %s::pg_lsn), false) FROM pg_stat_replication "
                            "WHERE application_name = %s", (target, name))
                src_done = (cur.fetchone() or (False,))[0]
            if sub_done and src_done:
                return
            time.sleep(0.2)
    finally:
        src.close()
        sub.close()
    raise TimeoutError(f"subscriber {name} did not catch up to {target}")


def drain_all(source_dsn: str, uri: str, slot: str = "ours", publication: str = "pub_all", **kw: Any) -> int:
    """Drain cycles until the slot is caught up (``drain_run``: one lock, a peek read on across
    batches); returns the number of batches staged."""
    hook = PgLogicalHook.from_dsn(source_dsn)
    try:
        results = drain_run(hook, DrainConfig(slot=slot, publication=publication, staging_uri=uri, **kw))
        return sum(1 for r in results if r.staged)
    finally:
        hook.close()


def run_script(dsn: str, transactions: list[str]) -> None:
    for tx in transactions:
        execute(dsn, f"BEGIN; {tx} COMMIT;")


def drop_slot_when_idle(dsn: str, slot: str, timeout: float = 30) -> None:
    """The native subscription's slot, once its walsender has gone (it stops shortly after DROP SUBSCRIPTION)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not query(dsn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", params=(slot,)):
            execute(dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    params=(slot,))
            return
        time.sleep(0.2)
