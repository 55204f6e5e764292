"""The Codec contract: one object per (type, typmod) turning 'b'/'t' bytes into Python and Arrow values."""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

from airflow_provider_pglogical.decoding.values.vector import Column
from airflow_provider_pglogical.exceptions import DecodeError

Notes = dict[str, str]
"""Exactness notes of one row image: value path → text, for values the Arrow field cannot hold alone."""

# Errors a malformed value can raise from the stdlib; each becomes a DecodeError without the value.
MALFORMED = (ValueError, struct.error, IndexError, UnicodeDecodeError, OverflowError, ArithmeticError, TypeError)


class Codec:
    """Decodes one type. Subclasses override ``from_binary``/``from_text`` (Python values) and,
    where the Arrow-ready value differs from the Python one, ``arrow_from_binary``/``arrow_from_text``.

    ``arrow_column`` is the optional vectorised path for a whole column; ``None`` means "use the
    per-value path". Paths in ``notes`` are ``col``, ``col.field``, ``col[i]`` (flat element index).
    """

    name = "value"
    arrow_type: pa.DataType = pa.binary()

    def from_binary(self, raw: bytes) -> Any:
        raise DecodeError(f"{self.name} has no binary form")

    def from_text(self, text: str) -> Any:
        raise DecodeError(f"{self.name} has no text form")

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> Any:
        return self.from_binary(raw)

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> Any:
        return self.from_text(text)

    def arrow_column(self, col: Column) -> pa.Array | None:
        return None

    # --- guarded entry points: every malformed input becomes DecodeError(short reason) ---

    def python(self, kind: str, raw: bytes) -> Any:
        try:
            if kind == "b":
                return self.from_binary(raw)
            if kind == "t":
                return self.from_text(decode_text(raw))
        except DecodeError:
            raise
        except MALFORMED:
            raise DecodeError(f"invalid {self.name} {'binary' if kind == 'b' else 'text'} value") from None
        raise DecodeError(f"column kind {kind!r} carries no value")

    def arrow(self, kind: str, raw: bytes, notes: Notes, path: str) -> Any:
        try:
            if kind == "b":
                return self.arrow_from_binary(raw, notes, path)
            if kind == "t":
                return self.arrow_from_text(decode_text(raw), notes, path)
        except DecodeError:
            raise
        except MALFORMED:
            raise DecodeError(f"invalid {self.name} {'binary' if kind == 'b' else 'text'} value") from None
        raise DecodeError(f"column kind {kind!r} carries no value")


def decode_text(raw: bytes) -> str:
    """Text arrives in the session's client_encoding; the consumer sets it to UTF8 (see docs/types.md)."""
    try:
        return raw.decode("utf-8") if isinstance(raw, bytes) else bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError("text value is not valid utf-8") from None


def expect_len(raw: bytes, size: int, name: str) -> None:
    if len(raw) != size:
        raise DecodeError(f"{name} binary value must be {size} bytes, got {len(raw)}")


class Reader:
    """A bounds-checked cursor over one binary value (array, range, record bodies)."""

    __slots__ = ("buf", "pos", "name")

    _I32 = struct.Struct("!i")
    _U32 = struct.Struct("!I")

    def __init__(self, buf: bytes, name: str) -> None:
        self.buf = buf
        self.pos = 0
        self.name = name

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise DecodeError(f"truncated {self.name} binary value")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        return self.take(1)[0]

    def int32(self) -> int:
        value: int = self._I32.unpack(self.take(4))[0]
        return value

    def uint32(self) -> int:
        value: int = self._U32.unpack(self.take(4))[0]
        return value

    def counted(self) -> bytes | None:
        """Int32 length (−1 = NULL) followed by that many bytes."""
        n = self.int32()
        if n == -1:
            return None
        if n < 0:
            raise DecodeError(f"negative length in {self.name} binary value")
        return self.take(n)

    def finish(self) -> None:
        if self.pos != len(self.buf):
            raise DecodeError(f"trailing bytes in {self.name} binary value")
