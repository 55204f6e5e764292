"""Fixtures shared by the integration tests' modules."""

from __future__ import annotations

import pytest


@pytest.fixture
def drain_source(pg_conn, pg_dsn):
    """The drain tests' source: tests.support.drain.SCHEMA_SQL and slot s1, as (cursor, hook)."""
    # imported here, not at collection: the hook brings Airflow (seconds of CPU), which a collection of modules
    # that do not use it (the suite's own checks of its markers run pytest --collect-only) need not pay
    from airflow_provider_pglogical.hooks import PgLogicalHook
    from tests.support.drain import SCHEMA_SQL

    cur = pg_conn.cursor()
    cur.execute(SCHEMA_SQL)
    hook = PgLogicalHook.from_dsn(pg_dsn)
    hook.create_slot("s1")
    yield cur, hook
    hook.close()
