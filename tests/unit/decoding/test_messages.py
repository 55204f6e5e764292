"""parse_message decodes every pgoutput message type and rejects anything malformed."""

from __future__ import annotations

import struct

import pytest

from airflow_provider_pglogical.decoding import messages as m
from airflow_provider_pglogical.decoding.messages import parse_message, read_tuple
from airflow_provider_pglogical.decoding.model import ColumnDef, TupleData
from airflow_provider_pglogical.exceptions import DecodeError
from tests.support import wire as w

NEW = w.tup(w.int4(7), ("t", b"seven"), ("n",), ("u",))
NEW_DATA = TupleData("btnu", (struct.pack("!i", 7), b"seven", None, None))
KEY = w.tup(w.int4(7), ("n",), ("n",), ("n",))
KEY_DATA = TupleData("bnnn", (struct.pack("!i", 7), None, None, None))
COLS = [("id", 23, -1, 1), ("name", 1043, 36, 0)]
COL_DEFS = (ColumnDef("id", 23, -1, True), ColumnDef("name", 1043, 36, False))

# (wire bytes built with xid=None, the same inside a stream with xid 900, expected, expected in stream)
STREAMABLE = {
    "relation": (lambda x: w.relation(16384, "t", COLS, namespace="", ident="f", xid=x),
                 lambda x: m.RelationMessage(x, 16384, "", "t", "f", COL_DEFS)),
    "type": (lambda x: w.type_(16500, "public", "mood", xid=x), lambda x: m.TypeMessage(x, 16500, "public", "mood")),
    "insert": (lambda x: w.insert(16384, NEW, xid=x), lambda x: m.InsertMessage(x, 16384, NEW_DATA)),
    "update with key image": (lambda x: w.update(16384, NEW, KEY, "K", xid=x),
                              lambda x: m.UpdateMessage(x, 16384, KEY_DATA, True, NEW_DATA)),
    "update with old row": (lambda x: w.update(16384, NEW, NEW, "O", xid=x),
                            lambda x: m.UpdateMessage(x, 16384, NEW_DATA, False, NEW_DATA)),
    "update without old tuple": (lambda x: w.update(16384, NEW, xid=x),
                                 lambda x: m.UpdateMessage(x, 16384, None, False, NEW_DATA)),
    "delete with key": (lambda x: w.delete(16384, KEY, "K", xid=x),
                        lambda x: m.DeleteMessage(x, 16384, KEY_DATA, True)),
    "delete with old row": (lambda x: w.delete(16384, NEW, "O", xid=x),
                            lambda x: m.DeleteMessage(x, 16384, NEW_DATA, False)),
    "truncate": (lambda x: w.truncate([16384, 4294967295], 3, xid=x),
                 lambda x: m.TruncateMessage(x, (16384, 4294967295), True, True)),
    "truncate restart identity only": (lambda x: w.truncate([1], 2, xid=x),
                                       lambda x: m.TruncateMessage(x, (1,), False, True)),
    "transactional message": (lambda x: w.message("p", b"\x00\xff", transactional=True, lsn=0x1_0000_0000, xid=x),
                              lambda x: m.LogicalDecodingMessage(x, True, 0x1_0000_0000, "p", b"\x00\xff")),
    "non-transactional message": (lambda x: w.message("pré", b"", transactional=False, xid=x),
                                  lambda x: m.LogicalDecodingMessage(x, False, 0x500, "pré", b"")),
}

UNSTREAMED = {
    "begin": (w.begin(0xFFFF_FFFF_0000_0001, 4294967295, ts=-5), m.BeginMessage(0xFFFF_FFFF_0000_0001, -5, 4294967295)),
    "commit": (w.commit(0x100, 0x128, ts=77), m.CommitMessage(0, 0x100, 0x128, 77)),
    "origin": (w.origin("node_a", 0x42), m.OriginMessage(0x42, "node_a")),
    "stream start first": (w.stream_start(900, True), m.StreamStartMessage(900, True)),
    "stream start later": (w.stream_start(900, False), m.StreamStartMessage(900, False)),
    "stream stop": (w.stream_stop(), m.StreamStopMessage()),
    "stream commit": (w.stream_commit(900, 0x200, 0x228, 5), m.StreamCommitMessage(900, 0, 0x200, 0x228, 5)),
    "stream abort": (w.stream_abort(900, 901), m.StreamAbortMessage(900, 901)),
    "stream abort with abort info": (w.stream_abort(900, 900, 0x300, 9), m.StreamAbortMessage(900, 900, 0x300, 9)),
    "begin prepare": (w.begin_prepare(0x10, 0x20, 5, "g1"), m.BeginPrepareMessage(0x10, 0x20, 1000, 5, "g1")),
    "prepare": (w.prepare(0x10, 0x20, 5, "g1"), m.PrepareMessage(0, 0x10, 0x20, 1000, 5, "g1")),
    "stream prepare": (w.prepare(0x10, 0x20, 5, "g1", kind="p"), m.StreamPrepareMessage(0, 0x10, 0x20, 1000, 5, "g1")),
    "commit prepared": (w.commit_prepared(0x30, 0x40, 5, "g1"), m.CommitPreparedMessage(0, 0x30, 0x40, 1000, 5, "g1")),
    "rollback prepared": (w.rollback_prepared(0x20, 0x50, 5, "g1"),
                          m.RollbackPreparedMessage(0, 0x20, 0x50, 10, 20, 5, "g1")),
}


def all_valid_messages() -> list[tuple[str, bytes, bool]]:
    cases = [(name, build(None), False) for name, (build, _) in STREAMABLE.items()]
    cases += [(name + " in stream", build(900), True) for name, (build, _) in STREAMABLE.items()]
    cases += [(name, data, in_stream) for name, (data, _) in UNSTREAMED.items() for in_stream in (False, True)]
    return cases


@pytest.mark.parametrize("name", STREAMABLE)
def test_streamable_message_decodes_without_xid_outside_a_stream(name):
    build, expected = STREAMABLE[name]
    assert parse_message(build(None), lsn=1) == expected(None)


@pytest.mark.parametrize("name", STREAMABLE)
def test_streamable_message_decodes_its_xid_inside_a_stream(name):
    build, expected = STREAMABLE[name]
    assert parse_message(memoryview(build(900)), lsn=1, in_stream=True) == expected(900)


@pytest.mark.parametrize("name", UNSTREAMED)
def test_control_message_decodes_the_same_in_and_out_of_a_stream(name):
    data, expected = UNSTREAMED[name]
    assert parse_message(data) == expected
    assert parse_message(bytearray(data), in_stream=True) == expected


@pytest.mark.parametrize("name,data,in_stream", all_valid_messages(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_truncation_of_a_valid_message_raises_decode_error(name, data, in_stream):
    for cut in range(len(data)):
        if name.startswith("stream abort with abort info") and cut == 9:
            continue  # xid + subxid alone is the valid short form
        with pytest.raises(DecodeError) as info:
            parse_message(data[:cut], lsn=0x1234, in_stream=in_stream)
        assert info.value.lsn == 0x1234
        assert info.value.offset is not None and 0 <= info.value.offset <= cut


@pytest.mark.parametrize("name,data,in_stream", all_valid_messages(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_trailing_byte_after_a_valid_message_raises_decode_error(name, data, in_stream):
    with pytest.raises(DecodeError, match="trailing|stream abort body|bytes follow"):
        parse_message(data + b"\x00", lsn=1, in_stream=in_stream)


def test_unknown_message_type_raises_decode_error_naming_the_type():
    with pytest.raises(DecodeError, match="unknown message type 'Z'") as info:
        parse_message(b"Z\x00\x00", lsn=0x1_0000_00AB)
    assert "at LSN 1/AB" in str(info.value)
    assert info.value.message_type == "Z"


def test_empty_message_raises_decode_error():
    with pytest.raises(DecodeError, match="empty"):
        parse_message(b"")


def test_stream_abort_of_any_other_length_is_rejected():
    with pytest.raises(DecodeError, match="expected 8 or 24"):
        parse_message(w.stream_abort(1, 1) + b"\x00" * 8)


def test_unknown_column_kind_raises_decode_error_at_its_offset():
    data = w.insert(1, struct.pack("!h", 1) + b"x")
    with pytest.raises(DecodeError, match="column kind") as info:
        parse_message(data)
    assert info.value.offset == len(data) - 1


def test_negative_column_length_raises_decode_error():
    data = w.insert(1, struct.pack("!h", 1) + b"b" + struct.pack("!i", -1))
    with pytest.raises(DecodeError, match="length -1"):
        parse_message(data)


def test_insert_with_an_old_tuple_tag_is_rejected():
    with pytest.raises(DecodeError, match="expected 'N'"):
        parse_message(w.insert(1, NEW).replace(b"N", b"K", 1))


def test_delete_without_key_or_old_tag_is_rejected():
    with pytest.raises(DecodeError, match="expected 'K' or 'O'"):
        parse_message(w.delete(1, NEW, tag="N"))


def test_update_with_an_unknown_tuple_tag_is_rejected():
    with pytest.raises(DecodeError, match="where 'N' was expected"):
        parse_message(w.update(1, NEW, NEW, tag="X"))


def test_truncate_relid_count_must_match_the_bytes_that_follow():
    with pytest.raises(DecodeError, match="lists 2 relations"):
        parse_message(w.truncate([1])[:1] + struct.pack("!ib", 2, 0) + struct.pack("!I", 1))


def test_relation_with_a_negative_column_count_is_rejected():
    data = b"R" + struct.pack("!I", 1) + b"\x00t\x00d" + struct.pack("!h", -1)
    with pytest.raises(DecodeError, match="negative column count"):
        parse_message(data)


def test_string_that_is_not_utf8_raises_decode_error():
    with pytest.raises(DecodeError, match="UTF-8"):
        parse_message(b"O" + struct.pack("!Q", 0) + b"\xff\xfe\x00")


def test_tuple_data_keeps_null_and_unchanged_toast_apart():
    data, end = read_tuple(b"\x00\x00" + NEW + b"zz", 2, None, "I")
    assert data.kinds == "btnu" and data.values[2] is None and data.values[3] is None
    assert end == 2 + len(NEW)


def test_zero_column_tuple_is_valid():
    assert parse_message(w.insert(1, w.tup())) == m.InsertMessage(None, 1, TupleData("", ()))


def test_column_values_are_bytes_even_for_memoryview_input():
    msg = parse_message(memoryview(w.insert(1, NEW)))
    assert all(type(v) is bytes for v in msg.new.values if v is not None)


def test_decode_errors_never_quote_row_values():
    secret = b"SECRET-card-4111"
    data = w.insert(1, w.tup(("b", secret), ("t", secret)))
    corrupted = [data[:cut] for cut in range(len(data))] + [data + b"!", data.replace(b"b\x00", b"x\x00", 1)]
    for bad in corrupted:
        with pytest.raises(DecodeError) as info:
            parse_message(bad, lsn=1)
        assert b"SECRET" not in str(info.value).encode() and "card" not in str(info.value)
