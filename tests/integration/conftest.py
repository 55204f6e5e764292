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


@pytest.fixture(scope="session")
def native_workload(pg_server, tmp_path_factory):
    """test_native_equivalence's batches staged once, with its native subscriber's rows (tests.support.lake_workload):
    the lake equivalence tests copy them rather than each drain the same changes again."""
    from tests.support.lake_workload import native_workload

    with native_workload(pg_server, tmp_path_factory.mktemp("native-workload")) as staged:
        yield staged


@pytest.fixture(scope="session")
def extremes_workload(pg_server, tmp_path_factory):
    """The built-in types' extremes staged once (tests.support.lake_workload), their source kept for the oracle."""
    from tests.support.lake_workload import extremes_workload

    with extremes_workload(pg_server, tmp_path_factory.mktemp("extremes-workload")) as staged:
        yield staged


@pytest.fixture(scope="session")
def scripted_workload(pg_server, tmp_path_factory):
    """test_native_equivalence's batches, without its deviation, staged once: the lake crash tests' (copied)."""
    from tests.support.lake_workload import scripted_workload

    with scripted_workload(pg_server, tmp_path_factory.mktemp("scripted-workload")) as staged:
        yield staged
