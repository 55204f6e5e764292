"""SlotLagSensor and the WAL-retention check against a real slot on a server with max_slot_wal_keep_size."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import psycopg2
import pytest

from airflow_provider_pglogical.exceptions import SlotInvalidatedError, SlotNotFoundError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.sensors.slot_lag import SlotLagSensor, SlotWalRetentionError, check_wal_retention
from scripts.harness.pgserver import PgServer, make_database, start_server, stop_server


@pytest.fixture(scope="module")
def capped_server() -> Iterator[PgServer]:
    """Its own server: max_slot_wal_keep_size is a server-wide setting the other tests must not see."""
    server = start_server(settings={"max_slot_wal_keep_size": "'64MB'"})
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture
def source(capped_server: PgServer, monkeypatch) -> Iterator[tuple[PgLogicalHook, str]]:
    dbname = make_database(capped_server)
    monkeypatch.setenv("AIRFLOW_CONN_SENSOR_SOURCE", capped_server.uri(dbname))
    conn = psycopg2.connect(capped_server.dsn(dbname))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    hook = PgLogicalHook.from_dsn(capped_server.dsn(dbname))
    hook.create_slot("sensor_slot")
    try:
        yield hook, capped_server.dsn(dbname)
    finally:
        hook.drop_slot_if_exists("sensor_slot")
        hook.close()
        conn.close()


def write_wal(dsn: str, rows: int = 200) -> None:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, %s) g "
                    "ON CONFLICT (id) DO UPDATE SET v = excluded.v || 'y'", (rows,))
    conn.close()


def sensor(**kwargs) -> SlotLagSensor:
    return SlotLagSensor(task_id="lag", slot="sensor_slot", postgres_conn_id="sensor_source", **kwargs)


def test_the_sensor_is_satisfied_when_the_lag_is_under_the_threshold(source):
    _hook, dsn = source
    write_wal(dsn)
    assert sensor(max_lag_bytes="64MB").poke({}) is True


def test_the_sensor_waits_while_unconsumed_wal_exceeds_the_threshold_and_passes_once_the_slot_advances(source):
    hook, dsn = source
    write_wal(dsn)
    assert sensor(max_lag_bytes=0).poke({}) is False
    hook.advance_slot("sensor_slot", hook.current_wal_flush_lsn())
    assert sensor(max_lag_bytes=0).poke({}) is True


def test_the_sensor_fails_loudly_when_safe_wal_size_is_under_its_minimum(source):
    # max_slot_wal_keep_size is 64MB, so safe_wal_size can never reach 1GB.
    with pytest.raises(SlotWalRetentionError, match="'sensor_slot' can lose WAL after"):
        sensor(max_lag_bytes="1GB", min_safe_wal_bytes="1GB").poke({})


def test_the_sensor_fails_for_a_missing_slot(source):
    with pytest.raises(SlotNotFoundError):
        SlotLagSensor(task_id="lag", slot="no_such_slot", postgres_conn_id="sensor_source").poke({})


def test_the_wal_retention_check_passes_a_healthy_slot_with_room_to_spare(source):
    hook, _dsn = source
    info = hook.slot_info("sensor_slot")
    assert info.wal_status == "reserved" and info.safe_wal_size is not None
    check_wal_retention(info, slot="sensor_slot", min_safe_wal_bytes=1024 * 1024)


def test_an_unreserved_slot_is_an_error_even_without_a_threshold(source):
    hook, _dsn = source
    info = dataclasses.replace(hook.slot_info("sensor_slot"), wal_status="unreserved", safe_wal_size=-1)
    with pytest.raises(SlotWalRetentionError, match="unreserved"):
        check_wal_retention(info, slot="sensor_slot")


def test_a_lost_slot_is_reported_as_invalidated(source):
    hook, _dsn = source
    info = dataclasses.replace(hook.slot_info("sensor_slot"), wal_status="lost")
    with pytest.raises(SlotInvalidatedError):
        check_wal_retention(info, slot="sensor_slot")
