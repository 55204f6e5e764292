"""WireTuple: a TupleData kept as its message bytes until someone needs it split.

Splitting a TupleData into values is the one per-column loop of decoding. Done row by row in
Python (``reader.read_tuple``) it costs ~2 µs for a 7-column row; done for a whole row group
at once with numpy (``values.framing``), a small fraction of that. So the assembler keeps the
tuple of plain DML as a ``WireTuple``; the Arrow converter frames many together, and any
caller that reads ``.kinds``/``.values`` gets them from ``read_tuple`` on first access, with
the same errors. An UPDATE with an old image (REPLICA IDENTITY FULL, or a key change) carries two
tuples: its old one ends where the new one's 'N' tag starts (``end``), found by ``tuple_end``.
"""

from __future__ import annotations

from airflow_provider_pglogical.decoding.model import RowImage, TupleData
from airflow_provider_pglogical.decoding.reader import INT32, UINT16, read_tuple
from airflow_provider_pglogical.exceptions import DecodeError


class WireTuple:
    """A TupleData not yet split: it starts at ``offset`` of ``message`` and runs to ``end`` (None: the
    message's end).

    Stands in for ``TupleData`` (same ``kinds``/``values``, equal to the TupleData it decodes
    to). ``lsn`` labels errors. Framing errors surface when the tuple is framed — by
    ``frame_images`` (converter) or on first attribute access — never silently.
    """

    __slots__ = ("_decoded", "end", "lsn", "message", "offset")

    def __init__(self, message: bytes, offset: int, lsn: int | None, end: int | None = None) -> None:
        self.message, self.offset, self.lsn, self.end = message, offset, lsn, end
        self._decoded: TupleData | None = None

    def decode(self) -> TupleData:
        if self._decoded is None:
            self._decoded = decode_to_end(self.message, self.offset, self.lsn, self.end)
        return self._decoded

    @property
    def kinds(self) -> str:
        return self.decode().kinds

    @property
    def values(self) -> tuple[bytes | None, ...]:
        return self.decode().values

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (TupleData, WireTuple)):
            return self.kinds == other.kinds and self.values == other.values
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.kinds, self.values))

    def __repr__(self) -> str:
        return f"WireTuple(kinds={self.kinds!r}, values={self.values!r})"


def decode_to_end(message: bytes, offset: int, lsn: int | None, end: int | None = None) -> TupleData:
    """``read_tuple`` that also requires the tuple to end at ``end``, by default the message's end (Insert,
    Delete, an Update's new tuple); an Update's old tuple ends where its new one starts."""
    mtype = chr(message[0]) if message else "?"
    stop = len(message) if end is None else end
    tup, pos = read_tuple(message, offset, lsn, mtype)
    if pos != stop:
        raise DecodeError(f"{stop - pos} trailing bytes after message" if pos < stop
                          else f"tuple runs {pos - stop} bytes past its end", lsn=lsn, offset=pos, message_type=mtype)
    return tup


def tuple_end(data: bytes, pos: int) -> int | None:
    """Where the TupleData at ``pos`` ends, if it frames (known kinds, non-negative lengths inside ``data``);
    None otherwise (``read_tuple`` then raises the precise error). What ``read_tuple`` checks, without
    building values: an Update's old tuple is delimited by it and split later, with the new one."""
    end = len(data)
    if pos + 2 > end:
        return None
    ncols = UINT16.unpack_from(data, pos)[0]
    pos += 2
    for _ in range(ncols):
        if pos >= end:
            return None
        k = data[pos]
        pos += 1
        if k == 98 or k == 116:  # 'b', 't': Int32 length + bytes
            if pos + 4 > end:
                return None
            n = INT32.unpack_from(data, pos)[0]
            pos += 4 + n
            if n < 0 or pos > end:
                return None
        elif k != 110 and k != 117:  # not 'n', 'u'
            return None
    return pos


def encode_tuple(image: RowImage) -> bytes:
    """The wire form of a row image (what ``read_tuple`` reads), so decoded images frame like wire ones."""
    parts = [UINT16.pack(len(image.kinds))]
    for kind, raw in zip(image.kinds, image.values, strict=True):
        parts.append(kind.encode("latin-1"))
        if raw is not None:
            parts.append(INT32.pack(len(raw)))
            parts.append(bytes(raw))
    return b"".join(parts)


