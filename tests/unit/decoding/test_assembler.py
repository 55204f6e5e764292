"""ChangeAssembler turns ordered slot rows into transactions, enforcing pgoutput's protocol order."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.decoding import ChangeAssembler, RelationCache
from airflow_provider_pglogical.decoding.model import (
    LogicalMessage,
    NonTransactionalMessage,
    PreparedOutcome,
    PreparedTransaction,
    RowChange,
    Transaction,
    TruncateChange,
)
from airflow_provider_pglogical.exceptions import DecodeError, UnknownRelationError
from tests.support import wire as w

REL = w.relation(1, "t", w.T_COLUMNS)
REL2 = w.relation(2, "u", w.T_COLUMNS, namespace="s")


def feed(asm: ChangeAssembler, *rows: bytes, lsn: int = 0x100, xid: int = 700) -> list:
    events = []
    for i, data in enumerate(rows):
        event = asm.feed(lsn + i, xid, data)
        if event is not None:
            events.append(event)
    return events


def ids(tx: Transaction) -> list[tuple[str, int]]:
    return [(c.op, int.from_bytes(((c.new or c.old).values[0]), "big")) for c in tx.changes]


def test_begin_changes_commit_become_one_transaction_in_order():
    asm = ChangeAssembler()
    [tx] = feed(asm, w.begin(0x900, 700, ts=5), REL, REL2, w.insert(1, w.row(1)), w.insert(2, w.row(2)),
                w.update(1, w.row(1, "y"), w.tup(w.int4(1), ("n",)), "K"), w.delete(2, w.row(2), "O"),
                w.commit(0x900, 0x928, ts=6))
    assert isinstance(tx, Transaction)
    assert (tx.xid, tx.commit_lsn, tx.end_lsn, tx.commit_time_us, tx.streamed) == (700, 0x900, 0x928, 6, False)
    assert [(c.op, c.relation.qualified_name) for c in tx.changes] == [
        ("I", "public.t"), ("I", "s.u"), ("U", "public.t"), ("D", "s.u")]
    assert tx.changes[2].old_key_only and not tx.changes[3].old_key_only
    assert tx.changes[0].lsn == 0x103
    assert asm.last_commit_end_lsn == 0x928 and asm.pending() == ()


def test_update_without_old_tuple_has_no_old_image():
    [tx] = feed(ChangeAssembler(), w.begin(9, 1), REL, w.update(1, w.row(1)), w.commit(9, 10))
    assert tx.changes[0].old is None and tx.changes[0].new.kinds == "bb"


def test_truncate_and_transactional_message_are_changes_with_order():
    [tx] = feed(ChangeAssembler(), w.begin(9, 1), REL, REL2, w.truncate([1, 2], 3),
                w.message("pfx", b"body", transactional=True, lsn=0x77), w.commit(9, 10))
    trunc, msg = tx.changes
    assert isinstance(trunc, TruncateChange) and trunc.cascade and trunc.restart_identity
    assert [r.name for r in trunc.relations] == ["t", "u"]
    assert msg == LogicalMessage(0x77, True, "pfx", b"body")


def test_non_transactional_message_is_emitted_at_once_with_the_row_xid():
    [event] = feed(ChangeAssembler(), w.message("p", b"x", transactional=False, lsn=0x88), xid=0)
    assert event == NonTransactionalMessage(LogicalMessage(0x88, False, "p", b"x"), 0)


def test_origin_after_begin_is_recorded_with_zero_lsn_as_unknown():
    [tx] = feed(ChangeAssembler(), w.begin(9, 1), w.origin("node_a", 0x55), REL, w.insert(1, w.row(1)),
                w.commit(9, 10))
    assert (tx.origin, tx.origin_lsn) == ("node_a", 0x55)
    [tx] = feed(ChangeAssembler(), w.begin(9, 1), w.origin("node_b"), w.commit(9, 10))
    assert (tx.origin, tx.origin_lsn) == ("node_b", None)


def test_type_messages_are_kept_on_the_transaction_and_in_the_cache():
    asm = ChangeAssembler()
    [tx] = feed(asm, w.begin(9, 1), w.type_(16500, "", "text"), REL, w.commit(9, 10))
    assert tx.types[0].namespace == "pg_catalog" and asm.relations.type_info(16500).name == "text"


def test_change_for_an_unknown_relation_raises_with_its_lsn():
    asm = ChangeAssembler()
    feed(asm, w.begin(9, 1))
    with pytest.raises(UnknownRelationError) as info:
        asm.feed(0xABC, 1, w.insert(5, w.row(1)))
    assert info.value.lsn == 0xABC and "OID 5" in str(info.value)
    with pytest.raises(UnknownRelationError):
        asm.feed(0xABD, 1, w.truncate([5]))


def test_relation_cache_survives_across_calls_and_identical_resends_keep_the_version():
    cache = RelationCache()
    feed(ChangeAssembler(cache), w.begin(9, 1), REL, w.commit(9, 10))
    [tx] = feed(ChangeAssembler(cache), w.begin(19, 2), REL, w.insert(1, w.row(1)), w.commit(19, 20))
    assert tx.changes[0].relation.version == 1
    altered = w.relation(1, "t", w.T_COLUMNS + [("extra", w.INT4, -1, 0)])
    [tx] = feed(ChangeAssembler(cache), w.begin(29, 3), altered, w.insert(1, w.row(1)), w.commit(29, 30))
    assert tx.changes[0].relation.version == 2


@pytest.mark.parametrize("rows,error", [
    ([w.commit(9, 10)], "outside a transaction"),
    ([w.begin(9, 1), w.begin(9, 2)], "inside a transaction"),
    ([w.stream_stop()], "outside a transaction"),
    ([w.insert(1, w.row(1))], "outside a transaction"),
    ([REL], "outside a transaction"),
    ([w.origin("x")], "outside a transaction"),
    ([w.message("p", b"", transactional=True)], "outside a transaction"),
    ([w.begin(9, 1), w.commit(8, 10)], "differs from Begin"),
    ([w.begin(9, 1), w.prepare(9, 10, 1, "g")], "inside a transaction"),
    ([w.begin_prepare(9, 10, 1, "g"), w.commit(9, 10)], "inside a transaction"),
    ([w.begin_prepare(9, 10, 1, "g"), w.prepare(9, 10, 1, "h")], "does not match"),
    ([w.stream_start(5, False)], "first segment was not seen"),
    ([w.stream_start(5, True), w.stream_stop(), w.stream_start(5, True)], "already streaming"),
    ([w.stream_start(5, True), w.stream_start(5, False)], "inside a streaming block"),
    ([w.stream_start(5, True), w.begin(9, 1)], "inside a streaming block"),
    ([w.stream_start(5, True), w.stream_commit(5, 9, 10)], "inside a streaming block"),
    ([w.stream_commit(5, 9, 10)], "never streamed"),
    ([w.stream_abort(5, 5)], "not streaming"),
    ([w.prepare(9, 10, 1, "g", kind="p")], "never streamed"),
    ([w.begin(9, 1), w.stream_start(5, True)], "inside a transaction"),
    ([w.begin(9, 1), w.stream_abort(5, 5)], "inside a transaction"),
])
def test_protocol_order_violations_raise_decode_error(rows, error):
    with pytest.raises(DecodeError, match=error):
        feed(ChangeAssembler(), *rows)


def test_memoryview_rows_are_accepted():
    [tx] = feed(ChangeAssembler(), *(memoryview(r) for r in (w.begin(9, 1), REL, w.insert(1, w.row(3)),
                                                               w.commit(9, 10))))
    assert ids(tx) == [("I", 3)]


def test_feed_rows_yields_the_events():
    rows = [(i, 1, r) for i, r in enumerate([w.begin(9, 1), REL, w.insert(1, w.row(1)), w.commit(9, 10),
                                             w.message("p", b"", transactional=False)])]
    events = list(ChangeAssembler().feed_rows(rows))
    assert [type(e) for e in events] == [Transaction, NonTransactionalMessage]


def test_two_phase_messages_become_prepared_transaction_and_outcomes():
    events = feed(ChangeAssembler(), w.begin_prepare(0x50, 0x60, 7, "gid1"), w.origin("o"), REL,
                  w.insert(1, w.row(1)), w.prepare(0x50, 0x60, 7, "gid1"), w.commit_prepared(0x70, 0x80, 7, "gid1"),
                  w.rollback_prepared(0x60, 0x90, 8, "gid2"))
    prepared, committed, rolled_back = events
    assert isinstance(prepared, PreparedTransaction)
    assert (prepared.gid, prepared.prepare_lsn, prepared.end_lsn, len(prepared.changes)) == ("gid1", 0x50, 0x60, 1)
    assert committed == PreparedOutcome(7, "gid1", True, 0x80, 1000)
    assert rolled_back == PreparedOutcome(8, "gid2", False, 0x90, 20)


# -- streaming ----------------------------------------------------------------------------------

def stream(xid: int, first: bool, *rows: bytes) -> list[bytes]:
    return [w.stream_start(xid, first), *rows, w.stream_stop()]


def test_streamed_transaction_is_emitted_at_stream_commit_across_blocks_and_interleaving():
    asm = ChangeAssembler()
    rows = (stream(50, True, w.origin("o"), w.relation(1, "t", w.T_COLUMNS, xid=50), w.insert(1, w.row(1), xid=50))
            + [w.begin(0x200, 60), REL2, w.insert(2, w.row(100)), w.commit(0x200, 0x210)]
            + stream(50, False, w.insert(1, w.row(2), xid=51), w.message("m", b"c", transactional=True, xid=51))
            + [w.stream_commit(50, 0x300, 0x310, 9)])
    plain, streamed = feed(asm, *rows)
    assert ids(plain) == [("I", 100)]
    assert streamed.streamed and (streamed.xid, streamed.commit_lsn, streamed.end_lsn) == (50, 0x300, 0x310)
    assert ids_of(streamed.changes[:2]) == [1, 2] and isinstance(streamed.changes[2], LogicalMessage)
    assert (streamed.origin, streamed.origin_lsn) == ("o", None)
    assert asm.pending() == ()


def ids_of(changes) -> list[int]:
    return [int.from_bytes(c.new.values[0], "big") for c in changes]


def test_stream_abort_of_the_top_level_xid_discards_the_transaction():
    asm = ChangeAssembler()
    events = feed(asm, *stream(50, True, w.relation(1, "t", w.T_COLUMNS, xid=50), w.insert(1, w.row(1), xid=50)),
                  w.stream_abort(50, 50))
    assert events == [] and asm.pending() == () and 1 not in asm.relations


def test_stream_abort_of_a_subxact_discards_only_that_subxids_changes():
    asm = ChangeAssembler()
    rows = (stream(50, True, w.relation(1, "t", w.T_COLUMNS, xid=51), w.insert(1, w.row(1), xid=51),
                   w.insert(1, w.row(2), xid=50), w.insert(1, w.row(3), xid=52))
            + [w.stream_abort(50, 51, 0x400, 5)]
            + stream(50, False, w.insert(1, w.row(4), xid=53)) + [w.stream_abort(50, 52)]
            + [w.stream_commit(50, 0x300, 0x310)])
    [tx] = feed(asm, *rows)
    # the Relation message came with the aborted subxact and must still describe rows 2 and 4
    assert ids_of(tx.changes) == [2, 4] and tx.changes[0].relation.name == "t"


def test_change_of_an_aborted_subxact_afterwards_is_a_protocol_error():
    with pytest.raises(DecodeError, match="after its Stream Abort"):
        feed(ChangeAssembler(), *stream(50, True, w.relation(1, "t", w.T_COLUMNS, xid=50)), w.stream_abort(50, 51),
             *stream(50, False, w.insert(1, w.row(1), xid=51)))


def test_unknown_relation_inside_a_stream_is_reported_when_fed():
    with pytest.raises(UnknownRelationError):
        feed(ChangeAssembler(), w.stream_start(50, True), w.insert(9, w.row(1), xid=50))


def test_relation_change_inside_an_aborted_stream_never_reaches_the_cache():
    cache = RelationCache()
    asm = ChangeAssembler(cache)
    feed(asm, w.begin(9, 1), REL, w.commit(9, 10))
    altered = w.relation(1, "t", w.T_COLUMNS[:1], xid=50)
    feed(asm, *stream(50, True, altered, w.insert(1, w.tup(w.int4(1)), xid=50)), w.stream_abort(50, 50))
    assert cache.get(1).version == 1
    [tx] = feed(asm, *stream(51, True, altered, w.insert(1, w.tup(w.int4(1)), xid=51)),
                w.stream_commit(51, 0x30, 0x40))
    assert tx.changes[0].relation.version == 2 and cache.get(1).version == 2


def test_non_transactional_message_inside_a_stream_block_is_emitted_at_once():
    [event] = feed(ChangeAssembler(), w.stream_start(50, True),
                   w.message("p", b"x", transactional=False, xid=50))
    assert isinstance(event, NonTransactionalMessage) and event.xid == 50


def test_stream_prepare_emits_a_prepared_transaction():
    [event] = feed(ChangeAssembler(), *stream(50, True, w.relation(1, "t", w.T_COLUMNS, xid=50),
                                            w.insert(1, w.row(1), xid=50)),
                   w.prepare(0x10, 0x20, 50, "g", kind="p"))
    assert isinstance(event, PreparedTransaction) and len(event.changes) == 1


def test_pending_reports_open_streams_and_finish_drops_them():
    asm = ChangeAssembler()
    feed(asm, *stream(50, True, w.relation(1, "t", w.T_COLUMNS, xid=50), w.insert(1, w.row(1), xid=50)))
    feed(asm, w.begin(9, 60), REL)
    assert set(asm.pending()) == {50, 60}
    assert set(asm.finish()) == {50, 60} and asm.pending() == ()
    # the next SQL call re-sends everything from the first segment
    [tx] = feed(asm, *stream(50, True, w.insert(1, w.row(1), xid=50)), w.stream_commit(50, 9, 10))
    assert ids(tx) == [("I", 1)]


def test_pending_while_a_stream_block_is_open():
    asm = ChangeAssembler()
    feed(asm, w.stream_start(50, True))
    assert asm.pending() == (50,)


def test_last_commit_end_lsn_tracks_every_completed_transaction_kind():
    asm = ChangeAssembler()
    feed(asm, w.begin(9, 1), w.commit(9, 10))
    assert asm.last_commit_end_lsn == 10
    feed(asm, w.stream_start(5, True), w.stream_stop(), w.stream_commit(5, 19, 20))
    assert asm.last_commit_end_lsn == 20
    feed(asm, w.commit_prepared(29, 30, 5, "g"))
    assert asm.last_commit_end_lsn == 30


def test_row_change_records_are_the_model_types():
    [tx] = feed(ChangeAssembler(), w.begin(9, 1), REL, w.insert(1, w.row(1)), w.commit(9, 10))
    assert type(tx.changes) is tuple and isinstance(tx.changes[0], RowChange)
