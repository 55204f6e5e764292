"""Fixtures shared by the integration tests' modules."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.hooks import PgLogicalHook
from tests.support.drain import SCHEMA_SQL


@pytest.fixture
def drain_source(pg_conn, pg_dsn):
    """The drain tests' source: tests.support.drain.SCHEMA_SQL and slot s1, as (cursor, hook)."""
    cur = pg_conn.cursor()
    cur.execute(SCHEMA_SQL)
    hook = PgLogicalHook.from_dsn(pg_dsn)
    hook.create_slot("s1")
    yield cur, hook
    hook.close()
