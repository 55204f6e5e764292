"""`pglogical check` and the DAGs' slot-health task on a server with a small max_slot_wal_keep_size: they fail while
the slot can still be saved, then say the slot is lost and name the resync; every decode is in the run history."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg2
import pytest
import yaml

from airflow_provider_pglogical.cli import EXIT_AT_RISK, EXIT_LOST, EXIT_OK
from airflow_provider_pglogical.exceptions import SlotInvalidatedError, SlotWalRetentionError
from airflow_provider_pglogical.history.store import RunHistory
from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient
from airflow_provider_pglogical.operators.slot_health import SlotHealthCheckOperator
from scripts.harness.pgserver import PgServer, execute, make_database, start_server, stop_server
from scripts.harness.userenv import run_as_user, venv_script

MB = 1024 * 1024
KEEP = 64 * MB  # four 16 MB WAL segments
THRESHOLD = 40 * MB


@pytest.fixture(scope="module")
def capped_server() -> Iterator[PgServer]:
    """Its own server: max_slot_wal_keep_size is server-wide, and this test invalidates a slot on purpose."""
    server = start_server(settings={"max_slot_wal_keep_size": "'64MB'"})
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture
def spec(capped_server: PgServer, tmp_path, monkeypatch) -> Iterator[dict[str, str]]:
    source = make_database(capped_server)
    monkeypatch.setenv("AIRFLOW_CONN_HEALTH_SOURCE", capped_server.uri(source))
    target = make_database(capped_server)
    execute(capped_server.dsn(source), "CREATE TABLE t (id int PRIMARY KEY, v text)")
    doc = {"source": {"dsn": capped_server.uri(source), "publication": "health_pub", "slot": "health_slot",
                      "create": True, "min_safe_wal_bytes": f"{THRESHOLD // MB}MB"},
           "staging": {"uri": str(tmp_path / "staging")},
           "target": {"kind": "postgres", "dsn": capped_server.uri(target)},
           "tables": {"public.t": {}}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    yield {"path": str(path), "source": capped_server.dsn(source), "staging": str(tmp_path / "staging")}
    with PgLogicalClient.from_dsn(capped_server.dsn(source)) as client:
        client.drop_slot_if_exists("health_slot")


def pglogical(*args: str):
    return run_as_user([venv_script("pglogical"), *args], timeout=300)


def health_task() -> SlotHealthCheckOperator:
    return SlotHealthCheckOperator(task_id="health", slot="health_slot", postgres_conn_id="health_source",
                                   min_safe_wal_bytes=f"{THRESHOLD // MB}MB", max_lag_bytes="1GB")


def write_wal_until(dsn: str, done) -> dict:
    """Fill WAL a segment at a time (a 1 MB logical message, a segment switch, a checkpoint) until ``done(slot)``."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for _ in range(40):
                cur.execute("SELECT wal_status, safe_wal_size, pg_current_wal_lsn() - restart_lsn FROM "
                            "pg_replication_slots WHERE slot_name = 'health_slot'")
                status, safe, retained = cur.fetchone()
                slot = {"wal_status": status, "safe_wal_size": safe, "retained": retained}
                if done(slot):
                    return slot
                cur.execute("SELECT pg_logical_emit_message(false, 'fill', repeat('x', 1024 * 1024))")
                cur.execute("SELECT pg_switch_wal()")
                cur.execute("CHECKPOINT")
    finally:
        conn.close()
    raise AssertionError(f"the slot never got there: {slot}")


def test_check_fails_while_the_slot_can_be_saved_then_reports_it_lost_naming_the_resync(spec):
    decoded = pglogical("decode", "--spec", spec["path"])  # creates publication and slot
    assert decoded.returncode == 0, decoded.stderr[-2000:]
    execute(spec["source"], "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10) g")
    staged = pglogical("decode", "--spec", spec["path"])
    assert staged.returncode == 0 and json.loads(staged.stdout)["changes"] == 10, staged.stderr[-2000:]

    healthy = pglogical("check", "--spec", spec["path"])
    assert healthy.returncode == EXIT_OK, healthy.stderr[-2000:]
    body = json.loads(healthy.stdout)
    assert body["health"] == "ok" and body["thresholds"]["min_safe_wal_bytes"] == THRESHOLD
    assert body["figures"]["wal_status"] == "reserved" and body["figures"]["safe_wal_size"] >= THRESHOLD
    assert health_task().execute({})["wal_status"] == "reserved"

    slot = write_wal_until(spec["source"], lambda s: s["safe_wal_size"] is not None and s["safe_wal_size"] < THRESHOLD)
    assert slot["wal_status"] in ("reserved", "extended", "unreserved")
    at_risk = pglogical("check", "--spec", spec["path"])
    assert at_risk.returncode == EXIT_AT_RISK, at_risk.stderr[-2000:]
    body = json.loads(at_risk.stdout)
    assert body["health"] == "at_risk" and body["figures"]["wal_status"] != "lost"
    assert "safe_wal_size" in [f["check"] for f in body["findings"]] and "can lose WAL after" in at_risk.stderr
    with pytest.raises(SlotWalRetentionError, match="'health_slot' can lose WAL after .* Hint: drain the slot now"):
        health_task().execute({})

    # The lag threshold alone, from the command line: the slot has not consumed the WAL written above.
    lagging = pglogical("check", "--spec", spec["path"], "--min-safe-wal-size", "0", "--max-lag", "1MB")
    assert lagging.returncode == EXIT_AT_RISK and "lag" in [f["check"] for f in json.loads(lagging.stdout)["findings"]]

    write_wal_until(spec["source"], lambda s: s["wal_status"] == "lost")
    lost = pglogical("check", "--spec", spec["path"])
    assert lost.returncode == EXIT_LOST, lost.stderr[-2000:]
    assert json.loads(lost.stdout)["health"] == "lost" and "pglogical resync --spec" in lost.stderr
    with pytest.raises(SlotInvalidatedError, match="invalidated.*pglogical resync --spec") as lost_error:
        health_task().execute({})
    assert str(lost_error.value).count("Hint:") == 1

    # A decode on the lost slot fails, and its run record says why, with the slot's figures.
    failed = pglogical("decode", "--spec", spec["path"])
    assert failed.returncode == 1 and "invalidated" in failed.stderr
    first, second, last = RunHistory.from_uri(spec["staging"], "health_slot").records()
    assert (first.kind, first.outcome, first.slot_figures.wal_status) == ("decode", "ok", "reserved")
    assert (second.changes, second.batches_staged, second.tables) == (10, 1, {"public.t": 10})
    assert (last.outcome, last.slot_figures.wal_status) == ("failed", "lost")
    assert last.error is not None and "invalidated" in last.error

    # The way out the message names: drop the slot, resync every table, run again; the slot is healthy again.
    execute(spec["source"], "SELECT pg_drop_replication_slot('health_slot')")
    recreated = pglogical("decode", "--spec", spec["path"])  # creates the slot, then refuses the gap it left
    assert recreated.returncode == 1 and "pglogical resync --spec FILE --table public.t" in recreated.stderr
    resynced = pglogical("resync", "--spec", spec["path"], "--table", "public.t")
    assert resynced.returncode == 0, resynced.stderr[-2000:]
    again = pglogical("decode", "--spec", spec["path"])
    assert again.returncode == 0, again.stderr[-2000:]
    assert pglogical("check", "--spec", spec["path"]).returncode == EXIT_OK


def test_check_refuses_a_threshold_it_cannot_read_in_one_line(spec):
    result = pglogical("check", "--spec", spec["path"], "--max-lag", "lots")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("pglogical check: error: --max-lag 'lots'")
