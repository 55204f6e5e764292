"""Byte-string families: text/varchar/bpchar/name/json/enum, "char", bytea, jsonb, uuid, bit, unknown."""

from __future__ import annotations

import re
import struct
import uuid

import pyarrow as pa

from airflow_provider_pglogical.decoding.values.codec import Codec, Notes, decode_text, expect_len
from airflow_provider_pglogical.decoding.values.vector import KIND_BINARY, KIND_TEXT, Column, uuid_strings, varlena
from airflow_provider_pglogical.exceptions import DecodeError


class TextCodec(Codec):
    """Types whose binary and text forms are the same characters (textsend, enum_send, json_send)."""

    arrow_type = pa.string()

    def __init__(self, name: str = "text") -> None:
        self.name = name

    def from_binary(self, raw: bytes) -> str:
        return decode_text(raw)

    def from_text(self, text: str) -> str:
        return text

    def arrow_column(self, col: Column) -> pa.Array:
        return varlena(col, pa.string())


class JsonbCodec(TextCodec):
    """jsonb_send prefixes the (normalised) text with a version byte, which is 1 in every release."""

    def __init__(self) -> None:
        super().__init__("jsonb")

    def from_binary(self, raw: bytes) -> str:
        if not raw or raw[0] != 1:
            raise DecodeError("unsupported jsonb binary version")
        return decode_text(raw[1:])

    def arrow_column(self, col: Column) -> pa.Array | None:
        binary = col.kinds == KIND_BINARY
        if col.has(KIND_TEXT) or (col.lengths[binary] < 1).any() or (col.buf[col.starts[binary]] != 1).any():
            return None
        return varlena(col, pa.string(), skip=1)


class CharCodec(Codec):
    """The one-byte "char" type, rendered as charout does so both forms agree: '' for \\0, \\ooo above 127."""

    name, arrow_type = '"char"', pa.string()

    def from_binary(self, raw: bytes) -> str:
        if len(raw) > 1:
            raise DecodeError('"char" binary value must be at most 1 byte')
        if not raw or raw[0] == 0:
            return ""
        return chr(raw[0]) if raw[0] < 128 else f"\\{raw[0]:03o}"

    def from_text(self, text: str) -> str:
        return text


_HEX = re.compile(r"\\x([0-9a-fA-F]*)")
_ESCAPE = re.compile(rb"\\\\|\\([0-3][0-7]{2})")
_ESCAPED = re.compile(rb"(?:[^\\]|\\\\|\\[0-3][0-7]{2})*")


class ByteaCodec(Codec):
    name, arrow_type = "bytea", pa.binary()

    def from_binary(self, raw: bytes) -> bytes:
        return bytes(raw)

    def from_text(self, text: str) -> bytes:
        m = _HEX.fullmatch(text)
        if m:
            return bytes.fromhex(m.group(1))
        # bytea_output = 'escape': printable bytes as-is, \\ and \ooo escapes
        raw = text.encode("utf-8")
        if not _ESCAPED.fullmatch(raw):
            raise DecodeError("invalid bytea text value")
        return _ESCAPE.sub(lambda e: b"\\" if e.group(1) is None else bytes([int(e.group(1), 8)]), raw)

    def arrow_column(self, col: Column) -> pa.Array | None:
        return None if col.has(KIND_TEXT) else varlena(col, pa.binary())


class UuidCodec(Codec):
    """Arrow: the canonical 36-character lower-case string (Spark and SQL engines have no uuid type)."""

    name, arrow_type = "uuid", pa.string()

    def from_binary(self, raw: bytes) -> uuid.UUID:
        expect_len(raw, 16, self.name)
        return uuid.UUID(bytes=bytes(raw))

    def from_text(self, text: str) -> uuid.UUID:
        return uuid.UUID(text)

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> str:
        return str(self.from_binary(raw))

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> str:
        return str(self.from_text(text))

    def arrow_column(self, col: Column) -> pa.Array | None:
        return uuid_strings(col, "a uuid column")


_BITLEN = struct.Struct("!i")  # bit length, then ceil(len/8) bytes MSB-first


class BitCodec(Codec):
    """bit(n)/varbit as a string of '0'/'1' characters, the text form itself."""

    arrow_type = pa.string()

    def __init__(self, name: str = "bit") -> None:
        self.name = name

    def from_binary(self, raw: bytes) -> str:
        if len(raw) < 4:
            raise DecodeError(f"truncated {self.name} binary value")
        (nbits,) = _BITLEN.unpack_from(raw)
        if nbits < 0 or len(raw) - 4 != (nbits + 7) // 8:
            raise DecodeError(f"{self.name} binary length does not match its bit count")
        bits = "".join(f"{b:08b}" for b in raw[4:])
        return bits[:nbits]

    def from_text(self, text: str) -> str:
        if text.strip("01"):
            raise DecodeError(f"invalid {self.name} text value")
        return text


class MacaddrCodec(Codec):
    """macaddr/macaddr8 in macaddr_out's form: lower-case hex pairs joined by ':'."""

    arrow_type = pa.string()

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size

    def from_binary(self, raw: bytes) -> str:
        expect_len(raw, self.size, self.name)
        return ":".join(f"{b:02x}" for b in raw)

    def from_text(self, text: str) -> str:
        return text


class RawCodec(Codec):
    """A type we know nothing about: the bytes exactly as sent (send format for 'b', output text for 't')."""

    name, arrow_type = "unknown type", pa.binary()

    def from_binary(self, raw: bytes) -> bytes:
        return bytes(raw)

    def from_text(self, text: str) -> str:
        return text

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> bytes:
        return text.encode("utf-8")

    def arrow_column(self, col: Column) -> pa.Array:
        return varlena(col, pa.binary())


class TextOnlyCodec(TextCodec):
    """A user base type without a send function: pgoutput always sends its output text."""

    def from_binary(self, raw: bytes) -> str:
        raise DecodeError(f"{self.name} has no binary form")

    def arrow_column(self, col: Column) -> pa.Array | None:
        return None if col.has(KIND_BINARY) else varlena(col, pa.string())
