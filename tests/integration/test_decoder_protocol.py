"""The decoder against a real PostgreSQL: every non-streaming pgoutput message, decoded from a slot."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

import psycopg2
import pytest

from airflow_provider_pglogical.decoding import ChangeAssembler, RelationCache, parse_message
from airflow_provider_pglogical.decoding.model import (
    Event,
    LogicalMessage,
    NonTransactionalMessage,
    PreparedOutcome,
    PreparedTransaction,
    RowChange,
    Transaction,
    TruncateChange,
)
from scripts.harness.pgserver import start_server, stop_server

Row = tuple[int, int, memoryview]


def lsn_int(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def wait_wal_flushed(conn, timeout_s: float = 30.0) -> None:
    """Wait until all WAL inserted so far is flushed.

    The slot functions decode only flushed WAL, and a ROLLBACK's abort record is not flushed
    at once (the WAL writer does it within ``wal_writer_delay``); under load a peek right after
    a ROLLBACK can see the transaction's changes but not its end.
    """
    deadline = time.monotonic() + timeout_s
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn()")
        [(target,)] = cur.fetchall()
        while True:
            cur.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", [target])
            [(flushed,)] = cur.fetchall()
            if flushed:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"WAL not flushed through {target} in {timeout_s} s")
            time.sleep(0.02)


def slot_rows(conn, slot: str = "s", *, proto: str = "3", publication: str = "p", binary: str = "true",
              messages: str = "true", streaming: str | None = None, upto_nchanges: int | None = None,
              extra: Sequence[str] = ()) -> list[Row]:
    """``(lsn, xid, data)`` rows of pg_logical_slot_peek_binary_changes, as the hook returns them."""
    options = ["proto_version", proto, "publication_names", publication, "binary", binary, "messages", messages]
    if streaming is not None:
        options += ["streaming", streaming]
    options += list(extra)
    placeholders = ", ".join(["%s"] * len(options))
    wait_wal_flushed(conn)
    with conn.cursor() as cur:
        cur.execute(f"SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_peek_binary_changes("
                    f"%s, NULL, %s, {placeholders})", [slot, upto_nchanges, *options])
        return [(lsn_int(lsn), xid, data) for lsn, xid, data in cur.fetchall()]


def decode(rows: Sequence[Row], relations: RelationCache | None = None, **kwargs) -> list[Event]:
    """Assemble all rows; the slot output must end on a transaction boundary."""
    with ChangeAssembler(relations, **kwargs) as asm:
        events = list(asm.feed_rows(rows))
        assert asm.pending() == ()
        # materialise spilled changes before the assembler closes their files
        return [replace(e, changes=tuple(e.changes)) if hasattr(e, "changes") else e for e in events]


def transactions(events: Sequence[Event]) -> list[Transaction]:
    return [e for e in events if isinstance(e, Transaction)]


def int4(value: bytes | None) -> int | None:
    return None if value is None else struct.unpack("!i", value)[0]


def kinds(rows: Sequence[Row]) -> str:
    return "".join(bytes(data[:1]).decode() for _, _, data in rows)


@pytest.fixture
def cur(pg_conn):
    with pg_conn.cursor() as cursor:
        yield cursor


def setup_slot(cur, tables: str = "ALL TABLES") -> None:
    cur.execute(f"CREATE PUBLICATION p FOR {tables}")
    cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")


@pytest.mark.parametrize("proto", ["1", "2", "3"])
def test_multi_table_dml_with_key_and_full_identity_decodes_to_the_expected_images(pg_conn, cur, proto):
    cur.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    cur.execute("CREATE TABLE b (id int PRIMARY KEY, w int)")
    cur.execute("ALTER TABLE b REPLICA IDENTITY FULL")
    setup_slot(cur)
    cur.execute("BEGIN")
    cur.execute("INSERT INTO a VALUES (1, 'one'), (2, NULL)")
    cur.execute("INSERT INTO b VALUES (10, 100)")
    cur.execute("UPDATE a SET v = 'uno' WHERE id = 1")  # identity unchanged: no old tuple
    cur.execute("UPDATE a SET id = 3 WHERE id = 2")  # identity changed: 'K' image
    cur.execute("UPDATE b SET w = 101")  # RI FULL: 'O' image
    cur.execute("DELETE FROM a WHERE id = 1")
    cur.execute("DELETE FROM b")
    cur.execute("COMMIT")
    rows = slot_rows(pg_conn, proto=proto, messages="false" if proto == "1" else "true")
    [tx] = decode(rows)
    ops = [(c.op, c.relation.name) for c in tx.changes]
    assert ops == [("I", "a"), ("I", "a"), ("I", "b"), ("U", "a"), ("U", "a"), ("U", "b"), ("D", "a"), ("D", "b")]
    ins_a2, upd_a1, upd_a2, upd_b, del_a, del_b = (tx.changes[i] for i in (1, 3, 4, 5, 6, 7))
    assert ins_a2.new.kinds == "bn"
    assert upd_a1.old is None and upd_a1.new.values[1] == b"uno"
    assert upd_a2.old_key_only and upd_a2.old.kinds == "bn" and int4(upd_a2.old.values[0]) == 2
    assert not upd_b.old_key_only and [int4(v) for v in upd_b.old.values] == [10, 100]
    assert del_a.old_key_only and int4(del_a.old.values[0]) == 1 and del_a.new is None
    assert not del_b.old_key_only and [int4(v) for v in del_b.old.values] == [10, 101]
    assert tx.changes[0].relation.identity_columns == ("id",)
    assert tx.changes[2].relation.replica_identity == "f"
    assert tx.changes[2].relation.identity_columns == ("id", "w")
    # LSN semantics: the Commit row's lsn is the transaction's end LSN, change rows their own LSN
    assert rows[-1][0] == tx.end_lsn and tx.commit_lsn < tx.end_lsn
    assert [c.lsn for c in tx.changes] == [lsn for lsn, _, d in rows if bytes(d[:1]) in (b"I", b"U", b"D")]
    assert {xid for _, xid, _ in rows} == {tx.xid}


def test_every_row_parses_as_one_message_with_nothing_left_over(pg_conn, cur):
    cur.execute("CREATE TYPE mood AS ENUM ('ok', 'sad')")
    cur.execute("CREATE TABLE t (id bigint PRIMARY KEY, m mood, a int[], j jsonb, n numeric(12,2))")
    setup_slot(cur)
    cur.execute("INSERT INTO t VALUES (1, 'ok', '{1,2}', '{\"a\": 1}', 3.14)")
    rows = slot_rows(pg_conn)
    assert kinds(rows) == "BYRIC"
    assert [type(parse_message(d, lsn=lsn)).__name__ for lsn, _, d in rows] == [
        "BeginMessage", "TypeMessage", "RelationMessage", "InsertMessage", "CommitMessage"]
    [tx] = decode(rows)
    assert [(t.namespace, t.name) for t in tx.types] == [("public", "mood")]
    assert tx.changes[0].new.kinds == "bbbbb"


def test_unchanged_toasted_column_arrives_as_u_in_the_new_image(pg_conn, cur):
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, big text, n int)")
    setup_slot(cur)
    cur.execute("INSERT INTO t SELECT 1, string_agg(md5(i::text), ''), 0 FROM generate_series(1, 400) i")
    cur.execute("UPDATE t SET n = 1")
    ins, upd = (tx.changes[0] for tx in decode(slot_rows(pg_conn)))
    assert ins.new.kinds == "bbb" and len(ins.new.values[1]) == 400 * 32
    assert upd.new.kinds == "bub" and upd.new.values[1] is None and int4(upd.new.values[2]) == 1


def test_truncate_carries_cascade_and_restart_identity_flags(pg_conn, cur):
    cur.execute("CREATE TABLE parent (id serial PRIMARY KEY)")
    cur.execute("CREATE TABLE child (id int PRIMARY KEY, pid int REFERENCES parent)")
    cur.execute("CREATE TABLE counter (id serial PRIMARY KEY)")
    setup_slot(cur)
    cur.execute("INSERT INTO parent DEFAULT VALUES")
    cur.execute("TRUNCATE parent CASCADE")
    cur.execute("TRUNCATE counter RESTART IDENTITY")
    _, cascade, restart = (tx.changes[0] for tx in decode(slot_rows(pg_conn)))
    assert isinstance(cascade, TruncateChange)
    assert sorted(r.name for r in cascade.relations) == ["child", "parent"]
    assert (cascade.cascade, cascade.restart_identity) == (True, False)
    assert [r.name for r in restart.relations] == ["counter"]
    assert (restart.cascade, restart.restart_identity) == (False, True)


def test_logical_messages_transactional_in_order_and_non_transactional_at_once(pg_conn, cur):
    cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
    setup_slot(cur)
    cur.execute("SELECT pg_logical_emit_message(false, 'nt', 'outside'::bytea)::text")
    nt_lsn = lsn_int(cur.fetchone()[0])
    cur.execute("BEGIN")
    cur.execute("INSERT INTO t VALUES (1)")
    cur.execute("SELECT pg_logical_emit_message(true, 'tx', '\\x00ff'::bytea)::text")
    tx_lsn = lsn_int(cur.fetchone()[0])
    cur.execute("INSERT INTO t VALUES (2)")
    cur.execute("COMMIT")
    nt, tx = decode(slot_rows(pg_conn))
    assert nt == NonTransactionalMessage(LogicalMessage(nt_lsn, False, "nt", b"outside"), 0)
    assert isinstance(tx.changes[0], RowChange) and isinstance(tx.changes[2], RowChange)
    assert tx.changes[1] == LogicalMessage(tx_lsn, True, "tx", b"\x00\xff")


def test_replication_origin_of_the_session_is_attached_to_the_transaction(pg_conn, cur):
    cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
    setup_slot(cur)
    cur.execute("SELECT pg_replication_origin_create('node_a')")
    cur.execute("SELECT pg_replication_origin_session_setup('node_a')")
    cur.execute("BEGIN")
    cur.execute("SELECT pg_replication_origin_xact_setup('0/ABCDEF', now())")
    cur.execute("INSERT INTO t VALUES (1)")
    cur.execute("COMMIT")
    cur.execute("SELECT pg_replication_origin_session_reset()")
    cur.execute("INSERT INTO t VALUES (2)")
    rows = slot_rows(pg_conn)
    assert kinds(rows).startswith("BORIC")
    with_origin, without = decode(rows)
    assert (with_origin.origin, with_origin.origin_lsn) == ("node_a", 0xABCDEF)
    assert (without.origin, without.origin_lsn) == (None, None)


def test_alter_table_between_changes_creates_a_new_schema_version(pg_conn, cur):
    cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
    setup_slot(cur)
    cur.execute("INSERT INTO t VALUES (1)")
    cur.execute("BEGIN")
    cur.execute("INSERT INTO t VALUES (2)")
    cur.execute("ALTER TABLE t ADD COLUMN v text")
    cur.execute("INSERT INTO t VALUES (3, 'x')")
    cur.execute("COMMIT")
    cur.execute("INSERT INTO t VALUES (4, 'y')")
    cache = RelationCache()
    first, second, third = decode(slot_rows(pg_conn), cache)
    versions = [(c.relation.version, c.relation.column_names) for tx in (first, second, third) for c in tx.changes]
    assert versions == [(1, ("id",)), (1, ("id",)), (2, ("id", "v")), (2, ("id", "v"))]
    # After the slot moves past these, the next SQL call re-sends the (identical) Relation message:
    # a cache restored from saved state keeps version 2 instead of starting over.
    cur.execute("SELECT pg_replication_slot_advance('s', %s::pg_lsn)", (f"{third.end_lsn >> 32:X}/{third.end_lsn & 0xFFFFFFFF:X}",))
    cur.execute("INSERT INTO t VALUES (5, 'z')")
    rows = slot_rows(pg_conn)
    assert "R" in kinds(rows)
    [fourth] = decode(rows, RelationCache.from_state(cache.to_state()))
    assert fourth.changes[0].relation == third.changes[0].relation


def test_text_mode_output_decodes_as_text_columns(pg_conn, cur):
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    setup_slot(cur)
    cur.execute("INSERT INTO t VALUES (42, 'forty-two')")
    [tx] = decode(slot_rows(pg_conn, binary="false"))
    assert tx.changes[0].new.kinds == "tt" and tx.changes[0].new.values == (b"42", b"forty-two")


def test_a_batch_cut_by_upto_nchanges_still_ends_on_a_complete_transaction(pg_conn, cur):
    cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
    setup_slot(cur)
    for i in range(5):
        cur.execute("INSERT INTO t SELECT g FROM generate_series(%s, %s) g", (i * 10, i * 10 + 9))
    rows = slot_rows(pg_conn, upto_nchanges=15)
    events = decode(rows)
    assert len(events) == 2 and rows[-1][0] == events[-1].end_lsn


@pytest.fixture(scope="module")
def twophase_conn() -> Iterator[psycopg2.extensions.connection]:
    """A server of our own: PREPARE TRANSACTION needs max_prepared_transactions > 0."""
    server = start_server(settings={"max_prepared_transactions": "4"})
    try:
        conn = psycopg2.connect(server.dsn())
        conn.autocommit = True
        yield conn
        conn.close()
    finally:
        stop_server(server)


def test_two_phase_slot_decodes_prepare_commit_prepared_and_rollback_prepared(twophase_conn):
    cur = twophase_conn.cursor()
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    cur.execute("CREATE PUBLICATION p FOR TABLE t")
    cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, true)")  # two_phase
    for base, (gid, outcome, rows) in enumerate((("g1", "COMMIT", 3), ("g2", "ROLLBACK", 2), ("big", "COMMIT", 3000))):
        cur.execute("BEGIN")
        cur.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(%s, %s) g",
                    (base * 10000, base * 10000 + rows - 1))
        cur.execute(f"PREPARE TRANSACTION '{gid}'")
        cur.execute(f"{outcome} PREPARED '{gid}'")
    plain = slot_rows(twophase_conn, extra=["two_phase", "on"])
    assert kinds(plain).replace("I", "") == "bRPKbPrbPK"
    streamed = slot_rows(twophase_conn, streaming="on", extra=["two_phase", "on"])
    assert "p" in kinds(streamed)  # the big one: Stream Prepare
    for rows in (plain, streamed):
        p1, c1, p2, r2, p3, c3 = decode(rows)
        assert isinstance(p1, PreparedTransaction) and (p1.gid, len(p1.changes)) == ("g1", 3)
        assert isinstance(c1, PreparedOutcome) and (c1.gid, c1.committed, c1.xid) == ("g1", True, p1.xid)
        assert isinstance(r2, PreparedOutcome) and (r2.gid, r2.committed) == ("g2", False)
        assert (p3.gid, len(p3.changes)) == ("big", 3000) and c3.committed
        assert c3.end_lsn == rows[-1][0]
    cur.execute("SELECT pg_drop_replication_slot('s')")
