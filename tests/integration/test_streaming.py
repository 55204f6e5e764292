"""Streamed transactions (streaming on/parallel) from a real server decode to what the table holds."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg2
import pytest

from airflow_provider_pglogical.decoding import ChangeAssembler, SpilledChanges, parse_message
from airflow_provider_pglogical.decoding.messages import StreamAbortMessage
from airflow_provider_pglogical.decoding.model import Transaction
from scripts.harness.pgserver import drop_database, make_database
from tests.integration.test_decoder_protocol import decode, int4, kinds, slot_rows

# The suite's servers run with logical_decoding_work_mem = 64kB: a few thousand rows stream.
ROWS = 2000


@pytest.fixture
def cur(pg_conn):
    with pg_conn.cursor() as cursor:
        cursor.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
        cursor.execute("CREATE PUBLICATION p FOR TABLE t")
        cursor.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        yield cursor


def insert(cur, first: int, last: int) -> None:
    cur.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(%s, %s) g", (first, last))


def table_ids(cur) -> list[int]:
    cur.execute("SELECT id FROM t ORDER BY id")
    return [r[0] for r in cur.fetchall()]


def net_ids(transactions: list[Transaction]) -> list[int]:
    """Replay inserts/deletes on a set: what the table must hold if decoding dropped the right rows."""
    ids: set[int] = set()
    for tx in transactions:
        for change in tx.changes:
            if change.op == "I":
                ids.add(int4(change.new.values[0]))
            elif change.op == "D":
                ids.discard(int4(change.old.values[0]))
    return sorted(ids)


def stream_aborts(rows) -> list[StreamAbortMessage]:
    return [parse_message(d) for _, _, d in rows if bytes(d[:1]) == b"A"]


@pytest.mark.parametrize("proto", ["2", "3"])
def test_big_committed_transaction_streams_and_decodes_whole(pg_conn, cur, proto):
    insert(cur, 1, ROWS)
    cur.execute("DELETE FROM t WHERE id % 10 = 0")
    rows = slot_rows(pg_conn, proto=proto, streaming="on")
    streamed_part = kinds(rows)[:kinds(rows).index("c")]
    assert streamed_part.count("S") > 1 and "B" not in streamed_part
    streamed, plain = decode(rows)
    assert streamed.streamed and not plain.streamed
    assert len(streamed.changes) == ROWS and streamed.end_lsn == rows[kinds(rows).index("c")][0]
    assert net_ids([streamed, plain]) == table_ids(cur)


def test_aborted_streamed_transaction_is_discarded(pg_conn, cur):
    cur.execute("BEGIN")
    insert(cur, 1, ROWS)
    cur.execute("ROLLBACK")
    insert(cur, ROWS + 1, ROWS + 2)
    rows = slot_rows(pg_conn, streaming="on")
    [abort] = stream_aborts(rows)
    assert abort.xid == abort.subxid and abort.abort_lsn is None  # no abort info before streaming=parallel
    # Over SQL the abort is already in WAL when decoding runs: PostgreSQL 15 notices it at the first
    # catalog access and stops the stream, so the aborted transaction streams as empty S…E blocks.
    assert kinds(rows).startswith("SE")
    [tx] = decode(rows)
    assert net_ids([tx]) == table_ids(cur) == [ROWS + 1, ROWS + 2]


def test_rollback_to_savepoint_discards_only_that_subtransaction(pg_conn, cur):
    cur.execute("BEGIN")
    insert(cur, 1, ROWS)
    cur.execute("SAVEPOINT s1")
    insert(cur, ROWS + 1, 2 * ROWS)
    cur.execute("ROLLBACK TO SAVEPOINT s1")
    insert(cur, 2 * ROWS + 1, 3 * ROWS)
    cur.execute("COMMIT")
    rows = slot_rows(pg_conn, streaming="on")
    [abort] = stream_aborts(rows)
    assert abort.subxid != abort.xid
    [tx] = decode(rows)
    assert tx.streamed and net_ids([tx]) == table_ids(cur)
    assert len(tx.changes) == 2 * ROWS


def test_nested_subtransactions_rolled_back_together_are_all_discarded(pg_conn, cur):
    cur.execute("BEGIN")
    insert(cur, 1, 500)
    cur.execute("SAVEPOINT outer_sp")
    insert(cur, 501, ROWS)
    cur.execute("SAVEPOINT inner_sp")
    insert(cur, ROWS + 1, 2 * ROWS)
    cur.execute("RELEASE SAVEPOINT inner_sp")
    insert(cur, 2 * ROWS + 1, 3 * ROWS)
    cur.execute("ROLLBACK TO SAVEPOINT outer_sp")
    cur.execute("SAVEPOINT kept")
    insert(cur, 3 * ROWS + 1, 4 * ROWS)
    cur.execute("RELEASE SAVEPOINT kept")
    cur.execute("DELETE FROM t WHERE id <= 10")
    cur.execute("COMMIT")
    rows = slot_rows(pg_conn, streaming="on")
    assert len({a.subxid for a in stream_aborts(rows)}) == 2  # one per aborted subxact, inner one included
    [tx] = decode(rows)
    assert net_ids([tx]) == table_ids(cur)


def test_streamed_transaction_over_the_memory_budget_spills_and_matches(pg_conn, cur, tmp_path):
    cur.execute("BEGIN")
    insert(cur, 1, ROWS)
    cur.execute("SAVEPOINT s1")
    insert(cur, ROWS + 1, 2 * ROWS)
    cur.execute("ROLLBACK TO SAVEPOINT s1")
    cur.execute("ALTER TABLE t ADD COLUMN extra int")
    insert(cur, 2 * ROWS + 1, 3 * ROWS)
    cur.execute("COMMIT")
    rows = slot_rows(pg_conn, streaming="on")
    [expected] = decode(rows)
    with ChangeAssembler(memory_budget=32 * 1024, spill_dir=tmp_path) as asm:
        [tx] = list(asm.feed_rows(rows))
        assert isinstance(tx.changes, SpilledChanges)
        assert list(tx.changes) == list(expected.changes)
        assert [c.relation.version for c in (tx.changes[0], tx.changes[-1])] == [1, 2]
        assert net_ids([tx]) == table_ids(cur)


def test_in_progress_streamed_transaction_stays_pending_until_a_later_call(pg_conn, pg_dsn, cur):
    other = psycopg2.connect(pg_dsn)
    try:
        with other.cursor() as open_cur:  # psycopg2 opens a transaction: it stays in progress
            insert(open_cur, 10, ROWS)
            insert(cur, 1, 5)  # this commit flushes the WAL of the open transaction too
            rows = slot_rows(pg_conn, streaming="on")
        other.commit()
    finally:
        other.close()
    asm = ChangeAssembler()
    [small] = list(asm.feed_rows(rows))
    assert "S" in kinds(rows) and "c" not in kinds(rows)
    assert len(asm.pending()) == 1 and asm.last_commit_end_lsn == small.end_lsn
    assert asm.finish() != () and asm.pending() == ()
    # the next call re-sends the whole transaction from its first segment
    events = list(asm.feed_rows(slot_rows(pg_conn, streaming="on")))
    assert net_ids(events) == table_ids(cur)


@pytest.fixture
def pg17_conn(pg17_server) -> Iterator[psycopg2.extensions.connection]:
    dbname = make_database(pg17_server)
    conn = psycopg2.connect(pg17_server.dsn(dbname))
    conn.autocommit = True
    try:
        with conn.cursor() as c:
            c.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
            c.execute("CREATE PUBLICATION p FOR TABLE t")
            c.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        yield conn
    finally:
        conn.close()
        drop_database(pg17_server, dbname)


@pytest.mark.parametrize("streaming,abort_info", [("parallel", True), ("on", False)])
def test_protocol_4_stream_abort_has_abort_lsn_and_time_only_with_parallel(pg17_conn, streaming, abort_info):
    with pg17_conn.cursor() as cur:
        cur.execute("BEGIN")
        insert(cur, 1, ROWS)
        cur.execute("SAVEPOINT s1")
        insert(cur, ROWS + 1, 2 * ROWS)
        cur.execute("ROLLBACK TO SAVEPOINT s1")
        cur.execute("COMMIT")
        # The slot functions decode only flushed WAL (slot_rows waits for it): this transaction is
        # streamed too and ends in a top-level Stream Abort (subxid == xid).
        cur.execute("BEGIN")
        insert(cur, 2 * ROWS + 1, 3 * ROWS)
        cur.execute("ROLLBACK")
        rows = slot_rows(pg17_conn, proto="4", streaming=streaming)
        aborts = stream_aborts(rows)
        [sub] = [a for a in aborts if a.subxid != a.xid]
        [top] = [a for a in aborts if a.subxid == a.xid]
        assert sub.xid != top.xid
        for abort in (sub, top):
            assert (abort.abort_lsn is not None) == abort_info
            if abort_info:
                assert abort.abort_lsn > 0 and abort.abort_time_us > 0
        if abort_info:
            assert top.abort_lsn > sub.abort_lsn
        [tx] = decode(rows)
        assert net_ids([tx]) == table_ids(cur) and len(tx.changes) == ROWS
