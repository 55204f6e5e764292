"""A source database with a pgoutput slot of its own, dropped afterwards (slot names are cluster-wide)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database


@contextmanager
def source_with_slot(pg_server, setup_sql: str) -> Iterator[tuple[str, str]]:
    """(source DSN, slot): ``setup_sql`` runs before the slot is created; both are dropped at the end."""
    database = make_database(pg_server)
    dsn = pg_server.dsn(database)
    slot = f"p_{database}".lower()
    execute(dsn, setup_sql)
    PgLogicalHook.from_dsn(dsn).create_slot(slot)
    try:
        yield dsn, slot
    finally:
        execute(pg_server.dsn(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                 "WHERE slot_name = %s AND NOT active", params=(slot,))
        execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
