"""Temp-file spill for transactions over the memory budget, and the lazy change sequence over it."""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import overload

from airflow_provider_pglogical.decoding.model import Change, RelationSchema
from airflow_provider_pglogical.decoding.speedups import compiled
from airflow_provider_pglogical.exceptions import DecodeError

# Spill record header: UInt64 row LSN, UInt32 (sub)xid of the change, UInt32 length of the raw message.
_HEADER = struct.Struct("!QII")
_CHUNK = 1 << 20  # read the file back in 1 MiB slices; one pread per record would be a syscall per row

# (raw message, row lsn, relid → schema as of this record) → the decoded change
ChangeDecoder = Callable[[bytes, int, Mapping[int, RelationSchema]], Change]
SpillRecord = tuple[int, int, bytes]  # (lsn, subxid, raw message)
# The same over a slice of records that share one relation mapping (the compiled path)
ManyDecoder = Callable[[list[SpillRecord], Mapping[int, RelationSchema]], list[Change]]


def _refill(fd: int, buf: bytes, base: int, p: int, need: int) -> tuple[bytes, int, int]:
    """Drop the consumed part of ``buf`` and read on until ``need`` unread bytes are buffered."""
    keep = buf[p:]
    more = os.pread(fd, max(_CHUNK, need - len(keep)), base + len(buf))
    if len(keep) + len(more) < need:
        raise DecodeError(f"spill file ends early at offset {base + len(buf) + len(more)}")
    return keep + more, base + p, 0


class SpillFile:
    """Append-only, length-prefixed raw pgoutput messages in an anonymous temp file.

    ``tempfile.TemporaryFile`` is unlinked at creation on POSIX, so the bytes vanish when the
    file is closed *or the process dies*; nothing is ever left behind in the temp directory.
    Reads use ``os.pread`` so several iterations may run at once without sharing a position.
    """

    __slots__ = ("_file", "records", "size")

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._file = tempfile.TemporaryFile(prefix="pgoutput-spill-", dir=directory)
        self.records = 0
        self.size = 0

    @property
    def closed(self) -> bool:
        return self._file.closed

    def append(self, lsn: int, subxid: int, data: bytes) -> None:
        record = _HEADER.pack(lsn, subxid, len(data)) + data  # one buffered write per record
        self._file.write(record)
        self.records += 1
        self.size += len(record)

    def append_records(self, records: bytes, count: int) -> None:
        """``count`` records already in the file's format (``_speedups.spill_plain``), in one write."""
        self._file.write(records)
        self.records += count
        self.size += len(records)

    def __iter__(self) -> Iterator[tuple[int, int, int, bytes]]:
        """Yield ``(index, lsn, subxid, data)`` for every record in write order."""
        index = 0
        for records in self.chunks():
            for lsn, subxid, data in records:
                yield index, lsn, subxid, data
                index += 1

    def chunks(self) -> Iterator[list[SpillRecord]]:
        """Yield the records ``(lsn, subxid, data)`` in write order, a list per slice read (~1 MiB).

        One generator step per slice rather than per record: reading back a spilled transaction
        then costs about what framing it from the fetch did.
        """
        if self._file.closed:
            raise ValueError("spill file is closed")
        self._file.flush()
        fd, end = self._file.fileno(), self.size
        unpack, hsize = _HEADER.unpack_from, _HEADER.size
        records_of = compiled.spill_records if compiled is not None else None  # the same loop in C
        buf, base, p = b"", 0, 0  # base = file offset of buf[0], p = cursor in buf
        while base + p < end:
            if len(buf) - p < hsize:
                buf, base, p = _refill(fd, buf, base, p, hsize)
            out: list[SpillRecord]
            if records_of is not None:
                out, p = records_of(buf, p)
            else:
                out = []
                limit = len(buf)
                while True:  # every whole record in buf
                    if limit - p < hsize:
                        break
                    lsn, subxid, n = unpack(buf, p)
                    start = p + hsize
                    if limit - start < n:
                        break
                    p = start + n
                    out.append((lsn, subxid, buf[start:p]))
            if out:
                yield out
            elif base + p < end:  # a record larger than what is buffered
                lsn, subxid, n = unpack(buf, p)
                buf, base, p = _refill(fd, buf, base, p, hsize + n)

    def close(self) -> None:
        self._file.close()


class SpilledChanges(Sequence[Change]):
    """``Transaction.changes`` of a transaction that outgrew the memory budget.

    Holds the in-memory prefix (changes decoded before the budget was hit) and a spill file with
    the rest as raw messages, decoded again on each iteration. Relation messages inside the
    spilled part are kept in memory as a timeline of (record index, schema), resolved when the
    transaction completed, so iterating later is independent of the assembler's current cache.
    Iterate it (cheap, streaming); ``len`` is exact; indexing works but re-reads up to the index.
    Close it (or the assembler that emitted it) when done; afterwards iteration raises ValueError.
    """

    __slots__ = ("_prefix", "_spill", "_base", "_timeline", "_aborted", "_count", "_decode", "_decode_many",
                 "__weakref__")

    def __init__(self, prefix: tuple[Change, ...], spill: SpillFile, base: dict[int, RelationSchema],
                 timeline: list[tuple[int, RelationSchema]], aborted: frozenset[int], count: int,
                 decode: ChangeDecoder, decode_many: ManyDecoder | None = None) -> None:
        self._prefix = prefix
        self._spill = spill
        self._base = base
        self._timeline = timeline
        self._aborted = aborted
        self._count = count
        self._decode = decode
        self._decode_many = decode_many

    @property
    def spilled_records(self) -> int:
        return self._spill.records

    @property
    def closed(self) -> bool:
        return self._spill.closed

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Change]:
        for chunk in self.chunks():
            yield from chunk

    def chunks(self) -> Iterator[Sequence[Change]]:
        """The changes in order, a sequence at a time (the in-memory prefix, then about a spill slice
        each): what ``__iter__`` yields, with one generator step per slice instead of per change, for
        consumers that take runs of changes at once (``staging.writer``)."""
        if self._spill.closed:
            raise ValueError("spilled changes are closed")
        if self._prefix:
            yield self._prefix
        relations = dict(self._base)
        timeline, t, nt = self._timeline, 0, len(self._timeline)
        aborted, decode, decode_many = self._aborted, self._decode, self._decode_many
        index = 0
        for records in self._spill.chunks():
            if t == nt and not aborted:  # no schema change ahead, nothing dropped: the common case
                if decode_many is not None:
                    yield decode_many(records, relations)
                else:
                    yield [decode(data, lsn, relations) for lsn, _subxid, data in records]
                index += len(records)
                continue
            out: list[Change] = []
            for lsn, subxid, data in records:
                while t < nt and timeline[t][0] <= index:
                    schema = timeline[t][1]
                    relations[schema.relid] = schema
                    t += 1
                if subxid not in aborted:
                    out.append(decode(data, lsn, relations))
                index += 1
            if out:
                yield out

    @overload
    def __getitem__(self, index: int) -> Change: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Change]: ...

    def __getitem__(self, index: int | slice) -> Change | Sequence[Change]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("change index out of range")
        if index < len(self._prefix):
            return self._prefix[index]
        for i, change in enumerate(self):
            if i == index:
                return change
        raise IndexError("change index out of range")  # pragma: no cover - count and file disagree

    def __repr__(self) -> str:
        return f"SpilledChanges(count={self._count}, in_memory={len(self._prefix)}, spilled={self._spill.records})"

    def close(self) -> None:
        self._spill.close()

    def __enter__(self) -> SpilledChanges:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
