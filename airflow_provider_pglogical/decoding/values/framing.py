"""TupleData framing for many rows at once: message bytes → per-column kinds/starts/lengths with numpy.

The vectorised twin of ``reader.read_tuple`` (see ``decoding.wiretuple`` for why): every step
is one numpy operation over all rows of a row group, per column.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from airflow_provider_pglogical.decoding.values.vector import PAD, Column, big_endian
from airflow_provider_pglogical.decoding.wiretuple import decode_to_end
from airflow_provider_pglogical.exceptions import DecodeError

_KIND_B, _KIND_T, _KIND_N, _KIND_U = b"btnu"


class FramedImages:
    """n row images of one relation split into columns: ``column(j)`` is a ``vector.Column``."""

    __slots__ = ("buf", "data", "kinds", "lengths", "starts")

    def __init__(self, data: bytes, buf: np.ndarray, kinds: np.ndarray, starts: np.ndarray,
                 lengths: np.ndarray) -> None:
        self.data, self.buf, self.kinds, self.starts, self.lengths = data, buf, kinds, starts, lengths

    def column(self, j: int) -> Column:
        return Column(self.kinds[j], self.data, self.buf, self.starts[j], self.lengths[j])

    def expand(self, rows: np.ndarray) -> FramedImages:
        """These images placed at the True positions of ``rows``; the other rows are all 'n'."""
        shape = (self.kinds.shape[0], len(rows))
        kinds = np.full(shape, _KIND_N, dtype=np.uint8)
        starts, lengths = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
        kinds[:, rows], starts[:, rows], lengths[:, rows] = self.kinds, self.starts, self.lengths
        return FramedImages(self.data, self.buf, kinds, starts, lengths)

    def columns_with(self, kind: int) -> np.ndarray:
        """(ncols, n) bool: where a column has ``kind`` (e.g. 'u' for unchanged TOAST)."""
        mask: np.ndarray = self.kinds == kind  # numpy types == as Any
        return mask


def frame_images(messages: Sequence[bytes], offsets: Sequence[int], ncols: int,
                 lsns: Sequence[int | None], tuple_ends: Sequence[int | None] | None = None) -> FramedImages:
    """Frame ``messages[i][offsets[i]:tuple_ends[i]]`` (each one whole TupleData of ``ncols`` columns) in one pass.

    ``tuple_ends[i]`` None (or no ``tuple_ends``): the tuple runs to its message's end; an Update's old
    tuple ends where its new one starts. Per column, over all rows at once: read the kind byte, read
    the Int32 length where the kind carries a value, advance. Validation is deferred to three checks
    at the end: every kind is one of 'btnu', no length is negative, and every row ends exactly at its
    end (a row that ran short or long cannot end there, as positions only move forward). A row that
    fails is re-read with ``read_tuple`` to raise the precise ``DecodeError`` with its LSN and
    byte offset.
    """
    n = len(messages)
    sizes = np.fromiter(map(len, messages), dtype=np.int64, count=n)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    if tuple_ends is not None and any(e is not None for e in tuple_ends):
        ends = starts + np.fromiter((s if e is None else e for s, e in zip(sizes.tolist(), tuple_ends, strict=True)),
                                    dtype=np.int64, count=n)
    data = b"".join(messages) + bytes(PAD)
    framed, bad = _frame(data, starts + np.asarray(offsets, dtype=np.int64), ends, ncols)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        _raise_first(messages[i], offsets[i], ncols, lsns[i], None if tuple_ends is None else tuple_ends[i])
    return framed


def frame_joined(data: bytes, starts: np.ndarray, ends: np.ndarray, ncols: int) -> FramedImages | None:
    """``frame_images`` over messages already joined in ``data`` (which ends with ``PAD`` zero bytes):
    row i is the TupleData from ``starts[i]`` to exactly ``ends[i]``. None when any row does not
    frame (the caller then frames through ``frame_images`` for the precise error)."""
    framed, bad = _frame(data, starts, ends, ncols)
    return None if bad.any() else framed


def _frame(data: bytes, starts: np.ndarray, ends: np.ndarray, ncols: int) -> tuple[FramedImages, np.ndarray]:
    n = len(starts)
    buf = np.frombuffer(data, dtype=np.uint8)
    limit = len(data) - PAD  # positions are clipped here so a garbled row never reads out of range
    pos = np.minimum(starts, limit)
    bad = big_endian(buf, ">u2")[pos] != ncols
    pos += 2
    int32_at = big_endian(buf, ">i4")
    kinds = np.empty((ncols, n), dtype=np.uint8)
    value_starts = np.zeros((ncols, n), dtype=np.int64)
    lengths = np.zeros((ncols, n), dtype=np.int64)
    for j in range(ncols):
        np.clip(pos, 0, limit, out=pos)  # a negative length can move a garbled row backwards
        kind = kinds[j] = buf[pos]
        valued = (kind == _KIND_B) | (kind == _KIND_T)
        length = np.where(valued, int32_at[pos + 1], 0)
        lengths[j] = length
        value_starts[j] = np.where(valued, pos + 5, 0)
        pos += np.where(valued, 5 + length, 1)
    bad |= pos != ends
    bad |= ((kinds != _KIND_B) & (kinds != _KIND_T) & (kinds != _KIND_N) & (kinds != _KIND_U)).any(axis=0)
    bad |= (lengths < 0).any(axis=0)
    return FramedImages(data, buf, kinds, value_starts, lengths), bad


def _raise_first(message: bytes, offset: int, ncols: int, lsn: int | None, end: int | None) -> None:
    tup = decode_to_end(message, offset, lsn, end)  # raises for every framing error
    if len(tup.kinds) != ncols:
        raise DecodeError(f"row image has {len(tup.kinds)} columns, the relation has {ncols}", lsn=lsn,
                          offset=offset, message_type=chr(message[0]) if message else None)
    raise DecodeError("tuple does not frame", lsn=lsn, offset=offset)  # unreachable if both agree
