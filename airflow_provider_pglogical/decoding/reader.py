"""Bounds-checked reads of pgoutput bytes: a field cursor, and the fast TupleData reader."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import fields

from airflow_provider_pglogical.decoding.model import TupleData
from airflow_provider_pglogical.exceptions import DecodeError

# Compiled once: every pgoutput integer is network byte order (pq_sendintN).
INT8 = struct.Struct("!b")  # Int8: flags, first_segment, relreplident
UINT8 = struct.Struct("!B")  # Byte1 read as a number
INT16 = struct.Struct("!h")  # Int16: natts / ncols
UINT16 = struct.Struct("!H")  # Int16 column counts are never negative on the wire
INT32 = struct.Struct("!i")  # Int32: lengths, atttypmod
UINT32 = struct.Struct("!I")  # Int32 holding an Oid or TransactionId (unsigned in PostgreSQL)
INT64 = struct.Struct("!q")  # Int64: timestamps, µs since 2000-01-01
UINT64 = struct.Struct("!Q")  # Int64 holding an XLogRecPtr (LSN, unsigned)

_NUL = b"\x00"


class Reader:
    """Reads fields from ``buf`` starting at ``pos``; a short read raises :class:`DecodeError`.

    ``lsn`` and ``message_type`` only label errors. ``buf`` is normalised to ``bytes`` because
    NUL searches and slices that yield ``bytes`` are what callers need.
    """

    __slots__ = ("buf", "pos", "end", "lsn", "message_type")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0, *, lsn: int | None = None,
                 message_type: str | None = None) -> None:
        self.buf = buf if type(buf) is bytes else bytes(buf)
        self.pos = pos
        self.end = len(self.buf)
        self.lsn = lsn
        self.message_type = message_type

    def error(self, reason: str, offset: int | None = None) -> DecodeError:
        return DecodeError(reason, lsn=self.lsn, offset=self.pos if offset is None else offset,
                           message_type=self.message_type)

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def _take(self, n: int, what: str) -> int:
        """Reserve ``n`` bytes and return their start offset."""
        start = self.pos
        if n < 0 or start + n > self.end:
            raise self.error(f"truncated message: {what} needs {n} bytes, {self.end - start} left", start)
        self.pos = start + n
        return start

    def int8(self) -> int:
        value: int = INT8.unpack_from(self.buf, self._take(1, "Int8"))[0]
        return value

    def byte1(self) -> str:
        """One byte as a character, e.g. a submessage tag like 'N' or a relreplident."""
        return chr(self.buf[self._take(1, "Byte1")])

    def int16(self) -> int:
        value: int = INT16.unpack_from(self.buf, self._take(2, "Int16"))[0]
        return value

    def uint16(self) -> int:
        value: int = UINT16.unpack_from(self.buf, self._take(2, "Int16"))[0]
        return value

    def int32(self) -> int:
        value: int = INT32.unpack_from(self.buf, self._take(4, "Int32"))[0]
        return value

    def uint32(self) -> int:
        value: int = UINT32.unpack_from(self.buf, self._take(4, "Int32"))[0]
        return value

    def int64(self) -> int:
        value: int = INT64.unpack_from(self.buf, self._take(8, "Int64"))[0]
        return value

    def uint64(self) -> int:
        value: int = UINT64.unpack_from(self.buf, self._take(8, "Int64"))[0]
        return value

    def bytes(self, n: int) -> bytes:
        if n < 0:
            raise self.error(f"negative length {n}")
        start = self._take(n, "Byte[n]")
        return self.buf[start:start + n]

    def string(self) -> str:
        """A NUL-terminated String, UTF-8 (the consumer session's client_encoding)."""
        start = self.pos
        nul = self.buf.find(_NUL, start, self.end)
        if nul < 0:
            raise self.error("truncated message: String without NUL terminator", start)
        self.pos = nul + 1
        try:
            return self.buf[start:nul].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error("String is not valid UTF-8", start + exc.start) from exc

    def expect_end(self) -> None:
        if self.pos != self.end:
            raise self.error(f"{self.end - self.pos} trailing bytes after message")


# A frozen dataclass __init__ sets each field through object.__setattr__; writing the slots
# directly builds the same object in half the time, which matters once per row on the hot path.
if tuple(f.name for f in fields(TupleData)) != ("kinds", "values"):
    raise RuntimeError("model.TupleData fields changed: update reader._tuple_data")
_new = object.__new__
# The slot descriptors themselves (``TupleData.kinds``, read from the class __dict__ so mypy does
# not take them for instance attributes).
_set_kinds: Callable[[TupleData, str], None] = TupleData.__dict__["kinds"].__set__
_set_values: Callable[[TupleData, tuple[bytes | None, ...]], None] = TupleData.__dict__["values"].__set__


def _tuple_data(kinds: str, values: tuple[bytes | None, ...]) -> TupleData:
    obj = _new(TupleData)
    _set_kinds(obj, kinds)
    _set_values(obj, values)
    return obj


_u16 = UINT16.unpack_from
_i32 = INT32.unpack_from
_CHR = tuple(chr(i) for i in range(256))


def read_tuple(data: bytes, pos: int, lsn: int | None, mtype: str) -> tuple[TupleData, int]:
    """TupleData at ``pos``: Int16 ncols, then per column Byte1 kind [+ Int32 len + Byte[len]].

    The hot path of decoding: locals only, one slice per value, no per-column objects besides
    the value bytes. Returns the tuple and the offset just past it.
    """
    end = len(data)
    start = pos
    try:
        ncols = _u16(data, pos)[0]
        pos += 2
        kinds = ""
        values: list[bytes | None] = []
        append = values.append
        for _ in range(ncols):
            k = data[pos]
            pos += 1
            if k == 98 or k == 116:  # 'b' binary, 't' text: Int32 length + bytes
                n = _i32(data, pos)[0]
                pos += 4
                nxt = pos + n
                if n < 0 or nxt > end:
                    raise DecodeError(f"column value length {n} exceeds the message", lsn=lsn, offset=pos - 4,
                                      message_type=mtype)
                append(data[pos:nxt])
                pos = nxt
            elif k == 110 or k == 117:  # 'n' null, 'u' unchanged TOAST: nothing follows
                append(None)
            else:
                raise DecodeError(f"unknown TupleData column kind {chr(k)!r}", lsn=lsn, offset=pos - 1,
                                  message_type=mtype)
            kinds += _CHR[k]
    except (IndexError, struct.error):
        raise DecodeError(f"truncated TupleData starting at offset {start}", lsn=lsn, offset=min(pos, end),
                          message_type=mtype) from None
    return _tuple_data(kinds, tuple(values)), pos
