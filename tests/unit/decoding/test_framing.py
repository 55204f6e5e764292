"""Vectorised TupleData framing and WireTuple: always the same answer, and the same errors, as read_tuple."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding import ChangeAssembler
from airflow_provider_pglogical.decoding.model import RowChange, Transaction, TupleData
from airflow_provider_pglogical.decoding.values import RowImageConverter
from airflow_provider_pglogical.decoding.values.framing import frame_images
from airflow_provider_pglogical.decoding.values.vector import Column
from airflow_provider_pglogical.decoding.wiretuple import WireTuple, decode_to_end, encode_tuple
from airflow_provider_pglogical.exceptions import DecodeError
from tests.support import wire as w
from tests.unit.decoding.test_values_rowimage import REL, image

column = st.one_of(
    st.tuples(st.just("b"), st.binary(max_size=12)), st.tuples(st.just("t"), st.binary(max_size=12)),
    st.just(("n",)), st.just(("u",)))


def frame_rows(framed, n: int, ncols: int) -> list[TupleData]:
    """Rebuild per-row TupleData from framed columns (what read_tuple returns)."""
    cols = [framed.column(j) for j in range(ncols)]
    kinds = [c.kinds_str() for c in cols]
    raws = [c.raws() for c in cols]
    return [TupleData("".join(k[i] for k in kinds), tuple(r[i] for r in raws)) for i in range(n)]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 6).flatmap(lambda ncols: st.lists(st.lists(column, min_size=ncols, max_size=ncols),
                                                       min_size=1, max_size=20)))
def test_framing_many_rows_equals_read_tuple_row_by_row(rows):
    ncols = len(rows[0])
    messages = [w.insert(1, w.tup(*row)) for row in rows]
    framed = frame_images(messages, [6] * len(messages), ncols, list(range(len(messages))))
    assert frame_rows(framed, len(rows), ncols) == [decode_to_end(m, 6, i) for i, m in enumerate(messages)]


def mutate(data: bytes, draw) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(6, max(len(out) - 1, 6)))
        op = draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "flip" and pos < len(out):
            out[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=6))
        else:
            del out[pos:pos + draw(st.integers(1, 6))]
    return bytes(out)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_mutated_tuples_frame_exactly_when_read_tuple_reads_them_and_fail_with_its_error(data):
    rows = data.draw(st.lists(st.lists(column, min_size=3, max_size=3), min_size=1, max_size=8))
    messages = [w.insert(1, w.tup(*row)) for row in rows]
    bad = data.draw(st.integers(0, len(messages) - 1))
    messages[bad] = mutate(messages[bad], data.draw)
    lsns = [100 + i for i in range(len(messages))]
    try:
        expected = [decode_to_end(m, 6, lsn) for m, lsn in zip(messages, lsns, strict=True)]
        expected_error = None
        if any(len(t.kinds) != 3 for t in expected):
            expected_error = DecodeError("column count")
    except DecodeError as exc:
        expected_error = exc
    if expected_error is None:
        framed = frame_images(messages, [6] * len(messages), 3, lsns)
        assert frame_rows(framed, len(messages), 3) == expected
    else:
        with pytest.raises(DecodeError) as info:
            frame_images(messages, [6] * len(messages), 3, lsns)
        if expected_error.lsn is not None:  # a framing error: the first bad row's own error
            assert (info.value.lsn, info.value.offset, info.value.reason) == (
                expected_error.lsn, expected_error.offset, expected_error.reason)


def test_a_truncated_row_names_its_lsn_and_offset():
    good = w.insert(1, w.tup(("b", b"12345678"), ("n",)))
    truncated = good[:-3]
    with pytest.raises(DecodeError) as info:
        frame_images([good, truncated, good], [6, 6, 6], 2, [10, 20, 30])
    assert info.value.lsn == 20 and info.value.offset == 9 and "exceeds the message" in info.value.reason


def test_a_row_with_another_column_count_is_an_error():
    with pytest.raises(DecodeError, match="2 columns, the relation has 3"):
        frame_images([w.insert(1, w.tup(("n",), ("n",)))], [6], 3, [10])


def test_wire_tuple_equals_and_hashes_like_its_tuple_data():
    data = w.insert(1, w.tup(("b", b"\x00\x01"), ("u",), ("t", b"x")))
    wire = WireTuple(data, 6, 5)
    td = TupleData("but", (b"\x00\x01", None, b"x"))
    assert wire == td and td == wire and hash(wire) == hash(td)
    assert RowChange("I", REL, 5, None, wire) == RowChange("I", REL, 5, None, td)
    assert "but" in repr(wire)


def test_wire_tuple_raises_on_first_access_with_lsn():
    wire = WireTuple(w.insert(1, w.tup(("b", b"abc")))[:-1], 6, 77)
    with pytest.raises(DecodeError) as info:
        _ = wire.kinds
    assert info.value.lsn == 77


def test_encode_tuple_is_the_inverse_of_read_tuple():
    td = TupleData("bnut", (b"\x01", None, None, "é".encode()))
    assert decode_to_end(b"x" + encode_tuple(td), 1, None) == td


def test_column_from_raws_gives_back_its_raws():
    col = Column.from_raws("bnut", [b"ab", None, None, b""])
    assert col.raws() == [b"ab", None, None, b""] and col.kinds_str() == "bnut"


def test_converter_gives_the_same_arrow_for_wire_decoded_and_missing_images():
    tuples = [image(1), image(2, None, "bunbbb"), image(3, "é")]
    wires = [WireTuple(w.insert(7, encode_tuple(t)), 6, i) for i, t in enumerate(tuples)]
    mixed = [wires[0], None, tuples[1], wires[2]]
    conv = RowImageConverter(REL)
    expected = conv.convert([tuples[0], None, tuples[1], tuples[2]])
    got = conv.convert(mixed)
    assert got.array.equals(expected.array)
    assert got.unchanged.to_pylist() == [[], [], ["body"], []]
    assert conv.convert(wires).array.equals(conv.convert(tuples).array)


def test_assembler_keeps_plain_dml_tuples_unsplit_and_they_decode_on_access():
    rel = w.relation(1, "t", [("id", 20, -1, 1), ("v", 25, -1, 0)])
    row = w.tup(("b", struct.pack("!q", 1)), ("t", b"x"))
    rows = [w.begin(90, 7), rel, w.insert(1, row), w.update(1, row), w.delete(1, w.tup(("b", b"\0" * 8), ("n",)), "K"),
            w.update(1, row, row, "O"), w.commit(90, 100)]
    with ChangeAssembler() as asm:
        (tx,) = [e for e in asm.feed_rows((i + 10, 7, d) for i, d in enumerate(rows)) if isinstance(e, Transaction)]
    ins, upd, dele, full = tx.changes
    assert type(ins.new) is WireTuple and type(upd.new) is WireTuple and type(dele.old) is WireTuple
    # An update's two tuples too: the old one ends where the new one's 'N' tag starts.
    assert type(full.old) is WireTuple and type(full.new) is WireTuple and not full.old_key_only
    assert full.old == full.new == TupleData("bt", (struct.pack("!q", 1), b"x"))
    assert ins.new == TupleData("bt", (struct.pack("!q", 1), b"x")) and dele.old_key_only


def test_an_update_with_an_old_image_is_framed_with_both_tuples_and_fails_precisely_when_damaged():
    """Old and new images of REPLICA IDENTITY FULL / key-change updates frame a row group at a time (old ones
    end mid-message); a damaged old tuple still fails when the message is read, naming its LSN."""
    rel = w.relation(1, "t", [("id", 20, -1, 1), ("v", 25, -1, 0)])
    rows = [w.tup(("b", struct.pack("!q", i)), ("t", b"v" * i) if i % 3 else ("n",)) for i in range(6)]
    updates = [w.update(1, rows[i], rows[i - 1], "O" if i % 2 else "K") for i in range(1, 6)]
    with ChangeAssembler() as asm:
        (tx,) = [e for e in asm.feed_rows((i + 10, 7, d) for i, d in enumerate([w.begin(90, 7), rel, *updates,
                                                                                   w.commit(90, 100)]))
                 if isinstance(e, Transaction)]
    conv = RowImageConverter(tx.changes[0].relation)
    old = conv.convert([c.old for c in tx.changes]).array.to_pylist()
    new = conv.convert([c.new for c in tx.changes]).array.to_pylist()
    assert [r["id"] for r in old] == [0, 1, 2, 3, 4] and [r["id"] for r in new] == [1, 2, 3, 4, 5]
    assert [r["v"] for r in new] == ["v", "vv", None, "vvvv", "vvvvv"]
    assert [c.old_key_only for c in tx.changes] == [False, True, False, True, False]
    broken = w.update(1, rows[1], rows[0][:-3], "O")  # the old tuple runs short: no 'N' where it ends
    with ChangeAssembler() as asm, pytest.raises(DecodeError) as info:
        list(asm.feed_rows((i + 10, 7, d) for i, d in enumerate([w.begin(90, 7), rel, broken, w.commit(90, 100)])))
    assert info.value.lsn == 12


def test_a_malformed_insert_inside_a_transaction_fails_when_its_values_are_read():
    rel = w.relation(1, "t", [("id", 20, -1, 1)])
    broken = w.insert(1, w.tup(("b", struct.pack("!q", 1))))[:-2]
    with ChangeAssembler() as asm:
        events = list(asm.feed_rows((i + 10, 7, d) for i, d in enumerate([w.begin(90, 7), rel, broken,
                                                                           w.commit(90, 100)])))
    (change,) = events[0].changes
    with pytest.raises(DecodeError) as info:
        RowImageConverter(change.relation).convert([change.new])
    assert info.value.lsn == 12


def test_a_negative_length_is_an_error_not_an_out_of_range_read():
    data = bytearray(w.insert(1, w.tup(("b", b"abcd"), ("b", b"efgh"))))
    data[9:13] = struct.pack("!i", -2**31)
    with pytest.raises(DecodeError) as info:
        frame_images([bytes(data)], [6], 2, [5])
    assert info.value.lsn == 5


def test_memoryviews_whose_items_are_bytes_take_the_fast_path_too():
    """psycopg2 returns bytea as memoryviews of format 'c' (items are bytes, not ints)."""
    rel = w.relation(1, "t", [("id", 20, -1, 1)])
    rows = [w.begin(90, 7), rel, w.insert(1, w.tup(("b", struct.pack("!q", 5)))), w.commit(90, 100)]
    with ChangeAssembler() as asm:
        (tx,) = asm.feed_rows((i, 7, memoryview(d).cast("c")) for i, d in enumerate(rows))
    (change,) = tx.changes
    assert type(change.new) is WireTuple and change.new.values == (struct.pack("!q", 5),)


_column = st.sampled_from([("b", struct.pack("!q", 7)), ("t", b"abc"), ("n",), ("u",), ("t", b"")])


@settings(max_examples=300, deadline=None)
@given(st.lists(_column, max_size=4), st.lists(_column, max_size=4), st.sampled_from("KO"),
       st.integers(-1, 40), st.integers(0, 255))
def test_an_unsplit_update_with_an_old_image_equals_the_eager_parse(old, new, tag, damage_at, byte):
    """``unsplit_row_change`` of an update with two tuples (each framed later, a row group at a time) gives the
    images ``parse_row`` splits eagerly (the reference), or None where the eager parse is the one to judge."""
    from airflow_provider_pglogical.decoding.messages import parse_row
    from airflow_provider_pglogical.decoding.relations import unsplit_row_change

    data = bytearray(w.update(1, w.tup(*new), w.tup(*old), tag))
    if 0 <= damage_at < len(data):
        data[damage_at] = byte
    message = bytes(data)
    try:
        _, _, eager_old, key_only, eager_new = parse_row(message, 5, False)
    except DecodeError:
        eager_old = None
    change = unsplit_row_change(message, 5, lambda relid: REL)
    if change is None:
        return
    if message[0] != ord("U") or message[5] not in b"KO":  # damage made it another shape (plain tests cover)
        return
    assert type(change.old) is WireTuple and type(change.new) is WireTuple
    if eager_old is None:  # the eager parse fails: then so does framing the unsplit images
        with pytest.raises(DecodeError):
            change.old.decode()
            change.new.decode()
        return
    assert (change.old.decode(), change.new.decode(), change.old_key_only) == (eager_old, eager_new, key_only)
