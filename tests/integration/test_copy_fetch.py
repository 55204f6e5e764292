"""Slot rows through binary COPY (``hooks.copystream``, compiled) against the named cursor (the reference)."""

from __future__ import annotations

import subprocess

import psycopg2
import pytest

from airflow_provider_pglogical.decoding import speedups
from airflow_provider_pglogical.exceptions import PublicationNotFoundError, SlotNotFoundError
from airflow_provider_pglogical.hooks import PgLogicalHook, copystream
from scripts.harness.userenv import VENV_BIN, run_as_user
from tests.support.drain import workload

pytestmark = pytest.mark.skipif(speedups.compiled is None, reason="compiled helpers not built")


def cursor_rows(hook: PgLogicalHook, **kw) -> list[tuple[int, int, bytes]]:
    query_kw = {"upto_lsn": None, "upto_nchanges": None, "streaming": False, "itersize": 7, **kw}
    options = hook.pgoutput_options("pub")
    from psycopg2 import sql

    from airflow_provider_pglogical.hooks.slot_client import _LSN
    query = sql.SQL("SELECT {lsn}, xid::text::bigint, data FROM pg_logical_slot_peek_binary_changes("
                    "%s, %s::pg_lsn, %s, {opts})").format(lsn=sql.SQL(_LSN.format("lsn")),
                                                          opts=sql.SQL(", ").join(sql.Placeholder() * len(options)))
    rows = hook.client._stream_cursor(query, ("s1", None, query_kw["upto_nchanges"], *options), slot="s1",
                                      publication="pub", itersize=query_kw["itersize"])
    return [(lsn, xid, bytes(data)) for lsn, xid, data in rows]


def test_peek_streams_through_binary_copy_with_the_cursors_rows(drain_source):
    cur, hook = drain_source
    workload(cur, 40)
    cur.execute("SELECT pg_logical_emit_message(false, 'p', 'loose')")
    # A loose message's WAL is not flushed by itself, and decoding reads only flushed WAL: without
    # a commit after it, the two reads below could see it at different times (a flaky CI failure).
    cur.execute("CREATE TABLE unpublished (id int); INSERT INTO unpublished VALUES (0)")
    assert copystream.available()
    rows = list(hook.peek_changes("s1", "pub", itersize=7))  # several COPY chunks
    assert rows and all(type(data) is bytes for _, _, data in rows)  # bytes: the COPY path, not memoryviews
    assert rows == cursor_rows(hook)
    assert {chr(d[0]) for _, _, d in rows} >= {"B", "R", "I", "U", "D", "C"}


def test_a_peek_closed_early_cancels_the_copy_and_leaves_the_slot_and_session_usable(drain_source):
    cur, hook = drain_source
    workload(cur, 60)
    full = list(hook.peek_changes("s1", "pub"))
    rows = hook.peek_changes("s1", "pub", itersize=5)
    head = [next(rows) for _ in range(3)]
    rows.close()
    assert head == full[:3]
    assert hook.require_slot("s1").active is False  # no session holds the slot
    assert list(hook.peek_changes("s1", "pub")) == full  # peek never consumed anything


def test_a_peek_read_a_block_at_a_time_gives_the_cursors_rows_in_lists_of_itersize(drain_source):
    """The drain takes the COPY reader's lists as they are (``RowBlocks.blocks``): the same rows as the
    cursor, none lost at a list's edge, each list at most ``itersize`` long."""
    cur, hook = drain_source
    workload(cur, 40)
    blocks = list(hook.peek_changes("s1", "pub", itersize=7).blocks())  # type: ignore[attr-defined]
    assert len(blocks) > 1 and all(0 < len(b) <= 7 for b in blocks)
    assert [row for b in blocks for row in b] == cursor_rows(hook)


def test_a_block_read_closed_early_cancels_the_copy_and_leaves_the_slot_usable(drain_source):
    cur, hook = drain_source
    workload(cur, 60)
    full = list(hook.peek_changes("s1", "pub"))
    rows = hook.peek_changes("s1", "pub", itersize=5)
    first = next(rows.blocks())  # type: ignore[attr-defined]
    rows.close()  # type: ignore[attr-defined]
    assert first == full[:5]
    assert hook.require_slot("s1").active is False
    assert list(hook.peek_changes("s1", "pub")) == full


def test_errors_of_the_copy_path_are_the_typed_errors_of_the_cursor_path(drain_source):
    _cur, hook = drain_source
    with pytest.raises(SlotNotFoundError):
        list(hook.peek_changes("nope", "pub"))
    with pytest.raises(PublicationNotFoundError):
        cur = _cur
        cur.execute("INSERT INTO docs VALUES (1, 'b', 'n')")
        list(hook.peek_changes("s1", "no_such_publication"))
    assert hook.session.closed == 0  # the session still serves statements
    assert hook.require_slot("s1").active is False


def test_pglogical_in_a_user_environment_uses_the_compiled_helpers(tmp_path):
    """What an installed `pglogical` imports: the compiled module, when the install could build it."""
    code = ("from airflow_provider_pglogical.decoding import speedups; "
            "from airflow_provider_pglogical.hooks import copystream; "
            "print(speedups.implementation(), copystream.available())")
    done = run_as_user([str(VENV_BIN / "python"), "-c", code], home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["compiled", "True"]
    pure = run_as_user([str(VENV_BIN / "python"), "-c", code], {speedups.PURE_PYTHON_ENV: "1"}, home=tmp_path)
    assert pure.stdout.split() == ["python", "False"]


def test_the_cursor_fallback_still_reads_when_the_compiled_path_is_off(drain_source, monkeypatch):
    cur, hook = drain_source
    workload(cur, 10)
    expected = list(hook.peek_changes("s1", "pub"))
    monkeypatch.setattr(copystream, "available", lambda: False)
    got = list(hook.peek_changes("s1", "pub"))
    assert all(isinstance(data, memoryview) for _, _, data in got)
    assert [(lsn, xid, bytes(d)) for lsn, xid, d in got] == expected


def test_copy_refused_is_a_plain_exception_not_a_psycopg2_error():
    assert not issubclass(copystream.CopyRefused, psycopg2.Error)


needs_libpq = pytest.mark.skipif(not copystream.available(), reason="compiled helpers built without libpq")


@needs_libpq
def test_the_compiled_reader_links_libpq_and_reads_only_connections_it_opened(pg_conn):
    """No lookup through psycopg2's private module: the extension links libpq and opens its own connections."""
    compiled = speedups.compiled
    assert not hasattr(compiled, "bind_libpq")
    linked = subprocess.run(["ldd", compiled.__file__], capture_output=True, text=True, check=True).stdout
    assert "libpq" in linked
    with copystream.LibpqConnection.like(pg_conn) as own:
        assert own.execute(b"SELECT 1; SET application_name = 'x'") is None
        assert own.execute(b"SELECT 1/0")[0] == "22012"
        # a message longer than the error buffer, cut inside a character: decoded with a replacement, not raised
        code, message = own.execute("DO $$ BEGIN RAISE EXCEPTION '%', repeat('é', 600); END $$".encode())
        assert code == "P0001" and message.endswith("\ufffd") and own.backend_pid() > 0
        with pytest.raises(ValueError):  # a raw pointer (e.g. psycopg2's pgconn_ptr) is refused
            compiled.copy_start(pg_conn.pgconn_ptr, b"COPY (SELECT 1) TO STDOUT")
    with pytest.raises(ValueError):  # closed: the capsule cannot be used again
        compiled.copy_start(own.handle, b"COPY (SELECT 1) TO STDOUT")


@needs_libpq
def test_connection_keywords_leave_out_newer_defaults_and_refuse_newer_settings(pg_conn):
    known = speedups.compiled.pq_options()
    params = copystream.connection_keywords(pg_conn, known, client_encoding="UTF8")
    assert params["dbname"] == pg_conn.info.dbname and params["client_encoding"] == "UTF8"
    older = {k: v for k, v in known.items() if k != "sslnegotiation"}
    assert "sslnegotiation" not in copystream.connection_keywords(pg_conn, older, sslnegotiation="postgres")
    with pytest.raises(copystream.UnsupportedConnection, match="sslnegotiation"):
        copystream.connection_keywords(pg_conn, older, sslnegotiation="direct")


@needs_libpq
def test_a_session_whose_settings_the_linked_libpq_lacks_is_read_through_the_cursor(drain_source, monkeypatch):
    cur, hook = drain_source
    workload(cur, 10)
    expected = list(hook.peek_changes("s1", "pub"))
    known = {k: v for k, v in speedups.compiled.pq_options().items() if k != "application_name"}
    monkeypatch.setattr(speedups.compiled, "pq_options", lambda: known)
    got = list(hook.peek_changes("s1", "pub"))  # the session's application_name is not a default: refused
    assert all(isinstance(data, memoryview) for _, _, data in got)
    assert [(lsn, xid, bytes(d)) for lsn, xid, d in got] == expected
