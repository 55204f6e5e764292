"""Scalar codecs: bool, integers, oid, floats, money, pg_lsn, text family, "char", bytea, uuid, bit, mac, inet."""

from __future__ import annotations

import math
import struct
import uuid

import pyarrow as pa
import pytest

from airflow_provider_pglogical.decoding.model import ColumnDef
from airflow_provider_pglogical.decoding.values import arrow_type_for, decode_value
from airflow_provider_pglogical.decoding.values import oids as O
from airflow_provider_pglogical.exceptions import DecodeError


def col(oid: int, typmod: int = -1) -> ColumnDef:
    return ColumnDef("c", oid, typmod, False)


def dec(oid: int, kind: str, raw: bytes | str, typmod: int = -1):
    return decode_value(kind, raw.encode() if isinstance(raw, str) else raw, col(oid, typmod))


BINARY_CASES = [
    (O.BOOL, b"\x01", True), (O.BOOL, b"\x00", False),
    (O.INT2, struct.pack("!h", -32768), -32768), (O.INT4, struct.pack("!i", 2**31 - 1), 2**31 - 1),
    (O.INT8, struct.pack("!q", -(2**63)), -(2**63)), (O.OID, struct.pack("!I", 2**32 - 1), 2**32 - 1),
    (O.FLOAT8, struct.pack("!d", -math.inf), -math.inf), (O.FLOAT4, struct.pack("!f", 1.5), 1.5),
    (O.MONEY, struct.pack("!q", -123456), -123456), (O.PG_LSN, struct.pack("!Q", 2**64 - 1), 2**64 - 1),
    (O.TEXT, "héllo ✓".encode(), "héllo ✓"), (O.BPCHAR, b"ab  ", "ab  "), (O.VARCHAR, b"", ""),
    (O.NAME, b"relname", "relname"), (O.JSON, b'{"a": 1}', '{"a": 1}'), (O.JSONB, b'\x01{"a": 1}', '{"a": 1}'),
    (O.CHAR, b"x", "x"), (O.CHAR, b"\xc9", "\\311"), (O.CHAR, b"", ""),
    (O.BYTEA, b"\x00\xff", b"\x00\xff"), (O.BYTEA, b"", b""),
    (O.UUID, bytes(range(16)), uuid.UUID(bytes=bytes(range(16)))),
    (O.BIT, struct.pack("!i", 5) + b"\xa8", "10101"), (O.VARBIT, struct.pack("!i", 0), ""),
    (O.VARBIT, struct.pack("!i", 9) + b"\xff\x80", "111111111"),
    (O.MACADDR, bytes([8, 0, 0x2B, 1, 2, 3]), "08:00:2b:01:02:03"),
    (O.MACADDR8, bytes([255] * 8), "ff:ff:ff:ff:ff:ff:ff:ff"),
]


@pytest.mark.parametrize(("oid", "raw", "want"), BINARY_CASES)
def test_binary_values_decode_exactly(oid, raw, want):
    got = dec(oid, "b", raw)
    assert got == want and type(got) is type(want)


TEXT_CASES = [
    (O.BOOL, "t", True), (O.BOOL, "f", False), (O.INT2, "-32768", -32768), (O.INT8, "9223372036854775807", 2**63 - 1),
    (O.OID, "4294967295", 2**32 - 1), (O.FLOAT8, "1e+300", 1e300), (O.FLOAT8, "-0", -0.0),
    (O.FLOAT8, "-Infinity", -math.inf), (O.FLOAT4, "0.1", struct.unpack("!f", struct.pack("!f", 0.1))[0]),
    (O.MONEY, "$1,234.56", 123456), (O.MONEY, "-$92,233,720,368,547,758.08", -(2**63)), (O.MONEY, "$0.00", 0),
    (O.PG_LSN, "16/B374D848", 0x16B374D848), (O.TEXT, "a\tb\n", "a\tb\n"), (O.CHAR, "\\311", "\\311"),
    (O.BYTEA, "\\x00ff10", b"\x00\xff\x10"), (O.BYTEA, "\\x", b""), (O.BYTEA, "a\\\\b\\000", b"a\\b\x00"),
    (O.UUID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    (O.BIT, "0101", "0101"), (O.JSONB, '{"a": 1}', '{"a": 1}'), (O.INET, "10.0.0.1/8", "10.0.0.1/8"),
]


@pytest.mark.parametrize(("oid", "text", "want"), TEXT_CASES)
def test_text_values_parse_exactly(oid, text, want):
    got = dec(oid, "t", text)
    assert got == want and type(got) is type(want)


def test_float_nan_decodes_in_both_forms():
    assert math.isnan(dec(O.FLOAT8, "t", "NaN")) and math.isnan(dec(O.FLOAT4, "b", struct.pack("!f", math.nan)))


# expected texts are what PostgreSQL 15's network_out printed for these addresses
INET_CASES = [
    (2, 32, [192, 168, 0, 1], False, "192.168.0.1"), (2, 24, [192, 168, 0, 1], False, "192.168.0.1/24"),
    (2, 8, [10, 0, 0, 0], True, "10.0.0.0/8"), (3, 128, [0] * 15 + [1], False, "::1"),
    (3, 128, [0, 1] + [0] * 14, False, "1::"), (3, 128, [0] * 12 + [1, 2, 3, 4], False, "::1.2.3.4"),
    (3, 128, [0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1], False, "1:0:0:1::1"), (3, 128, [0] * 16, False, "::"),
    (3, 128, [0] * 10 + [255, 255, 0, 0, 0, 0], False, "::ffff:0.0.0.0"),
    (3, 128, [0x20, 1, 0xD, 0xB8, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1], False, "2001:db8::1:0:0:1"),
    (3, 128, [0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 0], False, "1:2:3:4:5:6:7:0"),
    (3, 128, [0] * 10 + [255, 255, 1, 2, 3, 4], True, "::ffff:1.2.3.4/128"),
    (3, 32, [0x20, 1, 0xD, 0xB8] + [0] * 12, True, "2001:db8::/32"),
]


@pytest.mark.parametrize(("family", "bits", "addr", "is_cidr", "want"), INET_CASES)
def test_inet_binary_renders_like_network_out(family, bits, addr, is_cidr, want):
    raw = bytes([family, bits, int(is_cidr), len(addr), *addr])
    assert dec(O.CIDR if is_cidr else O.INET, "b", raw) == want


@pytest.mark.parametrize(("oid", "raw"), [
    (O.BOOL, b"\x02"), (O.BOOL, b""), (O.INT4, b"\x00\x00\x01"), (O.INT8, bytes(9)), (O.FLOAT8, bytes(4)),
    (O.UUID, bytes(15)), (O.JSONB, b"\x02{}"), (O.JSONB, b""), (O.BIT, struct.pack("!i", 9) + b"\x00"),
    (O.BIT, b"\x00"), (O.MACADDR, bytes(7)), (O.INET, bytes([2, 33, 0, 4, 1, 2, 3, 4])), (O.INET, bytes([9, 0, 0, 0])),
    (O.TEXT, b"\xff\xfe"), (O.CHAR, b"ab"),
])
def test_malformed_binary_values_raise_decode_error(oid, raw):
    with pytest.raises(DecodeError):
        dec(oid, "b", raw)


@pytest.mark.parametrize(("oid", "text"), [
    (O.BOOL, "true"), (O.INT4, "1.5"), (O.INT8, ""), (O.FLOAT8, "inf"), (O.BYTEA, "\\xZZ"), (O.BYTEA, "a\\b"),
    (O.UUID, "nope"), (O.PG_LSN, "1-2"), (O.BIT, "012"), (O.MONEY, "$"),
])
def test_malformed_text_values_raise_decode_error(oid, text):
    with pytest.raises(DecodeError):
        dec(oid, "t", text)


def test_decode_errors_never_quote_the_value():
    secret = "s3cr3t-value"
    with pytest.raises(DecodeError) as exc:
        dec(O.INT8, "t", secret)
    assert secret not in str(exc.value) and exc.value.__cause__ is None


@pytest.mark.parametrize("kind", ["n", "u", "x"])
def test_kinds_without_a_value_are_rejected(kind):
    with pytest.raises(DecodeError):
        decode_value(kind, b"", col(O.INT4))


@pytest.mark.parametrize(("oid", "want"), [
    (O.BOOL, pa.bool_()), (O.INT2, pa.int16()), (O.INT4, pa.int32()), (O.INT8, pa.int64()), (O.OID, pa.int64()),
    (O.FLOAT4, pa.float32()), (O.FLOAT8, pa.float64()), (O.MONEY, pa.int64()), (O.PG_LSN, pa.uint64()),
    (O.TEXT, pa.string()), (O.CHAR, pa.string()), (O.BYTEA, pa.binary()), (O.UUID, pa.string()),
    (O.JSONB, pa.string()), (O.INET, pa.string()), (O.BIT, pa.string()), (O.MACADDR8, pa.string()),
    (99999, pa.binary()),
])
def test_arrow_types_match_the_documented_table(oid, want):
    assert arrow_type_for(col(oid)) == want
