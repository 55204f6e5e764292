"""Fixed-width scalars: bool, int2/4/8, oid, float4/8, money, pg_lsn."""

from __future__ import annotations

import re
import struct

import pyarrow as pa

from airflow_provider_pglogical.decoding.values.codec import Codec, expect_len
from airflow_provider_pglogical.decoding.values.vector import Column, fixed_width, with_mask
from airflow_provider_pglogical.exceptions import DecodeError


class FixedCodec(Codec):
    """A type whose binary form is one big-endian number; the column path is a numpy view."""

    width = 0
    fmt = struct.Struct("!q")
    dtype = ">i8"

    def from_binary(self, raw: bytes) -> int | float | bool:
        expect_len(raw, self.width, self.name)
        value: int | float | bool = self.fmt.unpack(raw)[0]
        return value

    def arrow_column(self, col: Column) -> pa.Array | None:
        got = fixed_width(col, self.width, self.dtype)
        return None if got is None else with_mask(got[0], got[1], self.arrow_type)


class BoolCodec(FixedCodec):
    name, width, arrow_type = "bool", 1, pa.bool_()
    dtype = "u1"

    def from_binary(self, raw: bytes) -> bool:
        expect_len(raw, 1, self.name)
        if raw[0] > 1:
            raise DecodeError("bool binary value must be 0 or 1")
        return raw[0] == 1

    def from_text(self, text: str) -> bool:
        if text not in ("t", "f"):
            raise DecodeError("bool text value must be t or f")
        return text == "t"

    def arrow_column(self, col: Column) -> pa.Array | None:
        got = fixed_width(col, 1, "u1")
        if got is None or (got[0] > 1).any():
            return None
        return with_mask(got[0].astype(bool), got[1], self.arrow_type)


class IntCodec(FixedCodec):
    def from_text(self, text: str) -> int:
        if not re.fullmatch(r"-?[0-9]+", text):
            raise DecodeError(f"invalid {self.name} text value")
        return int(text)


class Int2Codec(IntCodec):
    name, width, fmt, dtype, arrow_type = "int2", 2, struct.Struct("!h"), ">i2", pa.int16()


class Int4Codec(IntCodec):
    name, width, fmt, dtype, arrow_type = "int4", 4, struct.Struct("!i"), ">i4", pa.int32()


class Int8Codec(IntCodec):
    name, width, fmt, dtype, arrow_type = "int8", 8, struct.Struct("!q"), ">i8", pa.int64()


class OidCodec(IntCodec):
    # int64 rather than uint32: every OID fits, and Spark has no unsigned types
    name, width, fmt, dtype, arrow_type = "oid", 4, struct.Struct("!I"), ">u4", pa.int64()


class MoneyCodec(IntCodec):
    """money as int64 minor units (cents for 2 fraction digits), exactly as cash_send sends it."""

    name, width, fmt, dtype, arrow_type = "money", 8, struct.Struct("!q"), ">i8", pa.int64()

    def from_text(self, text: str) -> int:
        # cash_out is locale-formatted ("$1,234.56", "-$1.00"; C locale): every digit is part of
        # the minor-unit count because the fraction is always printed in full.
        negative = text.startswith("-") or text.startswith("(") or "-" in text
        digits = "".join(ch for ch in text if ch.isdigit())
        if not digits:
            raise DecodeError("invalid money text value")
        return -int(digits) if negative else int(digits)


class Float4Codec(FixedCodec):
    name, width, fmt, dtype, arrow_type = "float4", 4, struct.Struct("!f"), ">f4", pa.float32()

    def from_text(self, text: str) -> float:
        if text not in ("NaN", "Infinity", "-Infinity") and not re.fullmatch(r"-?[0-9.]+(e[-+][0-9]+)?", text):
            raise DecodeError(f"invalid {self.name} text value")
        # float4out prints the shortest text that round-trips *as float4*: round through float4 again
        value: float = self.fmt.unpack(self.fmt.pack(float(text)))[0]
        return value


class Float8Codec(Float4Codec):
    name, width, fmt, dtype, arrow_type = "float8", 8, struct.Struct("!d"), ">f8", pa.float64()


class PgLsnCodec(FixedCodec):
    name, width, fmt, dtype, arrow_type = "pg_lsn", 8, struct.Struct("!Q"), ">u8", pa.uint64()

    def from_text(self, text: str) -> int:
        m = re.fullmatch(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})", text)
        if not m:
            raise DecodeError("invalid pg_lsn text value")
        return int(m.group(1), 16) << 32 | int(m.group(2), 16)
