"""Reader reads big-endian fields and refuses every short read with a located DecodeError."""

from __future__ import annotations

import struct

import pytest

from airflow_provider_pglogical.decoding.reader import Reader
from airflow_provider_pglogical.exceptions import DecodeError

FIELDS = b"\xff" + struct.pack("!hHiIqQ", -2, 65535, -3, 4294967295, -4, 2**64 - 1) + b"ab\x00xyz"


def test_reader_decodes_each_field_width_with_its_sign():
    r = Reader(memoryview(FIELDS))
    assert [r.int8(), r.int16(), r.uint16(), r.int32(), r.uint32(), r.int64(), r.uint64()] == [
        -1, -2, 65535, -3, 4294967295, -4, 2**64 - 1]
    assert r.string() == "ab"
    assert r.bytes(3) == b"xyz"
    r.expect_end()


@pytest.mark.parametrize("method,size", [("int8", 1), ("byte1", 1), ("int16", 2), ("uint16", 2), ("int32", 4),
                                         ("uint32", 4), ("int64", 8), ("uint64", 8)])
def test_short_read_of_any_width_raises_decode_error_with_lsn_offset_and_type(method, size):
    r = Reader(b"\x00" * (size + 1), 2, lsn=0x10, message_type="I")
    with pytest.raises(DecodeError) as info:
        getattr(r, method)()
    assert (info.value.lsn, info.value.offset, info.value.message_type) == (0x10, 2, "I")
    assert "truncated" in str(info.value) and "0/10" in str(info.value)


def test_short_byte_run_and_negative_length_raise_decode_error():
    with pytest.raises(DecodeError, match="Byte\\[n\\] needs 5 bytes, 4 left"):
        Reader(b"abcd").bytes(5)
    with pytest.raises(DecodeError, match="negative length"):
        Reader(b"abcd").bytes(-1)


def test_string_without_terminator_raises_decode_error():
    with pytest.raises(DecodeError, match="NUL"):
        Reader(b"abc").string()


def test_trailing_bytes_are_reported():
    r = Reader(b"\x00\x00")
    r.int8()
    with pytest.raises(DecodeError, match="1 trailing bytes") as info:
        r.expect_end()
    assert info.value.offset == 1
