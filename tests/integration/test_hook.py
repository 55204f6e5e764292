"""PgLogicalClient and the Airflow PgLogicalHook wrapping it, against a real server: lifecycle, quoting,
streaming reads, and every typed error (each API test runs on both)."""

from __future__ import annotations

import json
import time
import uuid

import psycopg2
import psycopg2.extras
import pytest

from airflow_provider_pglogical.exceptions import (
    PublicationNotFoundError,
    ReplicationPermissionError,
    SlotActiveError,
    SlotInvalidatedError,
    SlotNotFoundError,
    SlotPluginMismatchError,
    WalLevelError,
)
from airflow_provider_pglogical.hooks import PgLogicalClient, PgLogicalHook
from airflow_provider_pglogical.hooks.errors import InvalidSlotNameError, translated_errors
from airflow_provider_pglogical.hooks.pglogical import proto_version_for
from scripts.harness.pgserver import start_server, stop_server


@pytest.fixture(params=["client", "hook"])
def hook(request, pg_dsn):
    """The plain client (CLI, pipeline) and the Airflow hook that forwards to it must behave alike."""
    h = PgLogicalClient.from_dsn(pg_dsn) if request.param == "client" else PgLogicalHook.from_dsn(pg_dsn)
    yield h
    h.close()


@pytest.fixture
def table(pg_conn):
    cur = pg_conn.cursor()
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    return cur


def test_proto_version_follows_the_server_version():
    assert [proto_version_for(v) for v in (140011, 150018, 160004, 180000)] == [2, 3, 4, 4]
    with pytest.raises(ValueError):
        proto_version_for(130000)


def test_the_hook_keeps_airflow_connection_identity():
    assert PgLogicalHook.conn_name_attr == "postgres_conn_id"
    assert PgLogicalHook.default_conn_name == "postgres_default"
    assert PgLogicalHook(postgres_conn_id="src").postgres_conn_id == "src"


def test_the_hook_reads_through_its_airflow_connection_and_its_extras(pg_server, pg_dbname, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PGL_HOOK_SOURCE", json.dumps({
        "conn_type": "postgres", "host": pg_server.host, "port": pg_server.port, "schema": pg_dbname,
        "login": pg_server.superuser, "extra": {"application_name": "from-the-extra", "evil": "x"}}))
    with PgLogicalHook(postgres_conn_id="pgl_hook_source") as hook:
        assert hook.client.dsn is None  # the client connects through the hook's Airflow connection
        with hook.session.cursor() as cur:
            cur.execute("SELECT current_database(), current_setting('application_name')")
            assert cur.fetchone() == (pg_dbname, "from-the-extra")
        assert hook.create_slot("via_conn_id") is True
        assert hook.require_slot("via_conn_id").plugin == "pgoutput"
        hook.drop_slot("via_conn_id")
        conn = hook.get_conn()  # DbApiHook's entry point: a new connection of the same connection
        try:
            assert not conn.closed and conn is not hook.session
        finally:
            conn.close()


def test_the_client_takes_a_dsn_or_a_connect_callable():
    with pytest.raises(ValueError, match="exactly one"):
        PgLogicalClient()
    with pytest.raises(ValueError, match="exactly one"):
        PgLogicalClient("dbname=x", connect=lambda: None)


def test_create_and_drop_are_idempotent(hook, table):
    assert hook.create_publication("p", ["t"]) is True
    assert hook.create_publication("p", ["t"]) is False
    assert hook.publication_exists("p")
    assert hook.create_slot("s") is True
    assert hook.create_slot("s") is False
    assert hook.drop_slot_if_exists("s") is True
    assert hook.drop_slot_if_exists("s") is False
    with pytest.raises(SlotNotFoundError) as err:
        hook.drop_slot("s")
    assert isinstance(err.value.__cause__, psycopg2.Error) and "Hint:" in str(err.value)
    hook.drop_publication("p")
    assert not hook.publication_exists("p")


def test_slot_info_reports_positions_and_retained_wal(hook, table):
    hook.create_publication("p", all_tables=True)
    hook.create_slot("s")
    table.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 100) g")
    info = hook.slot_info("s")
    assert info.plugin == "pgoutput" and info.slot_type == "logical" and not info.active
    assert info.wal_status == "reserved" and not info.invalidated
    assert info.confirmed_flush_lsn >= info.restart_lsn
    assert info.pending_bytes > 0 and info.retained_bytes >= info.pending_bytes
    assert hook.slot_info("nope") is None
    assert hook.current_wal_flush_lsn() >= info.confirmed_flush_lsn


def test_a_slot_of_another_plugin_is_refused(hook, pg_conn):
    pg_conn.cursor().execute("SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    with pytest.raises(SlotPluginMismatchError):
        hook.create_slot("td")
    with pytest.raises(SlotPluginMismatchError):
        hook.require_slot("td")


@pytest.mark.parametrize("name", ["Upper", "with space", "quo\"te", "näme", "", "x" * 64])
def test_invalid_slot_names_get_a_clear_error_before_any_sql(hook, name):
    with pytest.raises(InvalidSlotNameError, match="a-z, 0-9"):
        hook.create_slot(name)


def test_awkward_publication_and_table_names_are_quoted(hook, pg_conn):
    cur = pg_conn.cursor()
    cur.execute('CREATE SCHEMA "My Schema"; CREATE TABLE "My Schema"."Weird ""Tab"" näme" (id int PRIMARY KEY)')
    pub = 'Weird "Pub" näme, with comma'
    assert hook.create_publication(pub, [("My Schema", 'Weird "Tab" näme')])
    hook.create_slot("awkward")
    cur.execute('INSERT INTO "My Schema"."Weird ""Tab"" näme" SELECT generate_series(1, 10)')
    rows = list(hook.peek_changes("awkward", pub, itersize=3))
    kinds = [bytes(r[2][:1]).decode() for r in rows]
    assert kinds.count("I") == 10 and kinds[0] == "B" and kinds[-1] == "C"
    assert all(isinstance(lsn, int) and isinstance(xid, int) for lsn, xid, _ in rows)
    assert hook.slot_info("awkward").confirmed_flush_lsn < rows[-1][0]  # peek consumed nothing


def test_peek_stops_at_upto_lsn_and_advance_consumes(hook, table):
    hook.create_publication("p", ["t"])
    hook.create_slot("s")
    table.execute("INSERT INTO t VALUES (1, 'a')")
    table.execute("INSERT INTO t VALUES (2, 'b')")
    rows = list(hook.peek_changes("s", "p"))
    commits = [lsn for lsn, _x, d in rows if bytes(d[:1]) == b"C"]
    assert len(commits) == 2
    first_only = list(hook.peek_changes("s", "p", upto_lsn=commits[0]))
    assert [lsn for lsn, _x, d in first_only if bytes(d[:1]) == b"C"] == commits[:1]
    assert hook.advance_slot("s", commits[0]) == commits[0]
    rest = list(hook.peek_changes("s", ["p"]))
    assert [lsn for lsn, _x, d in rest if bytes(d[:1]) == b"C"] == commits[1:]
    consumed = list(hook.get_changes("s", "p"))
    assert consumed and list(hook.peek_changes("s", "p")) == []
    assert hook.session.autocommit  # the read transaction is over


def test_reading_a_missing_slot_raises_slot_not_found(hook, table):
    hook.create_publication("p", ["t"])
    with pytest.raises(SlotNotFoundError) as err:
        list(hook.peek_changes("missing", "p"))
    assert err.value.__cause__.pgcode == "42704"
    with pytest.raises(SlotNotFoundError):
        hook.require_slot("missing")
    with pytest.raises(SlotNotFoundError):
        hook.advance_slot("missing", hook.current_wal_flush_lsn())


def test_reading_with_a_missing_publication_raises_publication_not_found(hook, table):
    hook.create_slot("s")
    table.execute("INSERT INTO t VALUES (1, 'a')")
    with pytest.raises(PublicationNotFoundError, match="nopub"):
        list(hook.peek_changes("s", "nopub"))


def test_a_slot_held_by_a_streaming_consumer_raises_slot_active(hook, table, pg_dsn):
    hook.create_publication("p", ["t"])
    hook.create_slot("s")
    conn = psycopg2.connect(pg_dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        conn.cursor().start_replication(slot_name="s", options={"proto_version": "1", "publication_names": "p"})
        with pytest.raises(SlotActiveError, match="active for PID"):
            hook.require_slot("s")
        with pytest.raises(SlotActiveError) as err:
            list(hook.peek_changes("s", "p"))
        assert err.value.__cause__.pgcode == "55006"
        with pytest.raises(SlotActiveError):
            hook.advance_slot("s", hook.current_wal_flush_lsn())
    finally:
        conn.close()


def test_an_invalidated_slot_raises_slot_invalidated(hook, table, pg_server):
    hook.create_publication("p", ["t"])
    hook.create_slot("s")
    admin = psycopg2.connect(pg_server.dsn())
    admin.autocommit = True
    cur = admin.cursor()
    try:
        cur.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        cur.execute("SELECT pg_reload_conf()")
        time.sleep(0.2)
        for _ in range(20):
            cur.execute("SELECT pg_logical_emit_message(false, 'fill', repeat('x', 1024 * 1024))")
            cur.execute("SELECT pg_switch_wal()")
            cur.execute("CHECKPOINT")
            if hook.slot_info("s").wal_status == "lost":
                break
        assert hook.slot_info("s").invalidated
    finally:
        cur.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        cur.execute("SELECT pg_reload_conf()")
        admin.close()
    with pytest.raises(SlotInvalidatedError, match="invalidated"):
        hook.require_slot("s")
    with pytest.raises(SlotInvalidatedError) as err:
        list(hook.peek_changes("s", "p"))
    assert isinstance(err.value.__cause__, psycopg2.Error)
    with pytest.raises(SlotInvalidatedError):
        hook.advance_slot("s", hook.current_wal_flush_lsn())


def test_a_server_without_logical_wal_raises_wal_level_error():
    server = start_server(settings={"wal_level": "replica"})
    try:
        with PgLogicalHook.from_dsn(server.dsn()) as hook:
            with pytest.raises(WalLevelError, match="wal_level"):
                hook.create_slot("s")
            with pytest.raises(WalLevelError) as err, translated_errors(slot="s"):
                hook.session.cursor().execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
            assert err.value.__cause__.pgcode == "55000"
    finally:
        stop_server(server)


def test_a_replication_role_reads_and_a_plain_role_gets_a_permission_error(hook, table, pg_conn, pg_server,
                                                                            pg_dbname):
    suffix = uuid.uuid4().hex[:8]
    rep, plain = f"rep_{suffix}", f"plain_{suffix}"
    table.execute(f"CREATE ROLE {rep} LOGIN REPLICATION; CREATE ROLE {plain} LOGIN")
    table.execute(f"GRANT SELECT ON t TO {rep}, {plain}")
    try:
        hook.create_publication("p", ["t"])
        hook.create_slot("s")
        table.execute("INSERT INTO t VALUES (1, 'a')")
        with PgLogicalHook.from_dsn(pg_server.dsn(pg_dbname, user=rep)) as rep_hook:
            rep_hook.check_replication_privilege()
            rows = list(rep_hook.peek_changes("s", "p"))
            assert [bytes(d[:1]) for _l, _x, d in rows] == [b"B", b"R", b"I", b"C"]
            rep_hook.advance_slot("s", rows[-1][0])
        with PgLogicalHook.from_dsn(pg_server.dsn(pg_dbname, user=plain)) as plain_hook:
            with pytest.raises(ReplicationPermissionError):
                plain_hook.check_replication_privilege()
            with pytest.raises(ReplicationPermissionError, match="REPLICATION") as err:
                list(plain_hook.peek_changes("s", "p"))
            assert err.value.__cause__.pgcode == "42501"
    finally:
        table.execute(f"REVOKE ALL ON t FROM {rep}, {plain}")
        table.execute(f"DROP ROLE {rep}; DROP ROLE {plain}")


def test_a_slot_of_another_database_is_reported_as_not_found_here(hook, pg_server):
    with PgLogicalHook.from_dsn(pg_server.dsn()) as other:
        other.create_slot("elsewhere")
        try:
            with pytest.raises(SlotNotFoundError, match="belongs to database 'postgres'"):
                hook.require_slot("elsewhere")
        finally:
            other.drop_slot("elsewhere")
