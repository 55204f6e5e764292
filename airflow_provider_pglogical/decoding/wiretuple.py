"""WireTuple: a TupleData kept as its message bytes until someone needs it split.

Splitting a TupleData into values is the one per-column loop of decoding. Done row by row in
Python (``reader.read_tuple``) it costs ~2 µs for a 7-column row; done for a whole row group
at once with numpy (``values.framing``), a small fraction of that. So the assembler keeps the
tuple of plain DML as a ``WireTuple``; the Arrow converter frames many together, and any
caller that reads ``.kinds``/``.values`` gets them from ``read_tuple`` on first access, with
the same errors.
"""

from __future__ import annotations

from airflow_provider_pglogical.decoding.model import RowImage, TupleData
from airflow_provider_pglogical.decoding.reader import INT32, UINT16, read_tuple
from airflow_provider_pglogical.exceptions import DecodeError


class WireTuple:
    """A TupleData not yet split: it starts at ``offset`` of ``message`` and runs to its end.

    Stands in for ``TupleData`` (same ``kinds``/``values``, equal to the TupleData it decodes
    to). ``lsn`` labels errors. Framing errors surface when the tuple is framed — by
    ``frame_images`` (converter) or on first attribute access — never silently.
    """

    __slots__ = ("_decoded", "lsn", "message", "offset")

    def __init__(self, message: bytes, offset: int, lsn: int | None) -> None:
        self.message, self.offset, self.lsn = message, offset, lsn
        self._decoded: TupleData | None = None

    def decode(self) -> TupleData:
        if self._decoded is None:
            self._decoded = decode_to_end(self.message, self.offset, self.lsn)
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


def decode_to_end(message: bytes, offset: int, lsn: int | None) -> TupleData:
    """``read_tuple`` that also requires the tuple to end the message (Insert, Delete, plain Update)."""
    mtype = chr(message[0]) if message else "?"
    tup, end = read_tuple(message, offset, lsn, mtype)
    if end != len(message):
        raise DecodeError(f"{len(message) - end} trailing bytes after message", lsn=lsn, offset=end,
                          message_type=mtype)
    return tup


def encode_tuple(image: RowImage) -> bytes:
    """The wire form of a row image (what ``read_tuple`` reads), so decoded images frame like wire ones."""
    parts = [UINT16.pack(len(image.kinds))]
    for kind, raw in zip(image.kinds, image.values, strict=True):
        parts.append(kind.encode("latin-1"))
        if raw is not None:
            parts.append(INT32.pack(len(raw)))
            parts.append(bytes(raw))
    return b"".join(parts)


