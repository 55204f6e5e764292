"""Binary COPY rows → the decoder's column framing (pure, no I/O).

``COPY ... TO STDOUT (FORMAT binary)`` sends each row as one CopyData message (psycopg2 hands
them to ``write`` one at a time): ``int16`` field count, then per field an ``int32`` length
(``-1`` = NULL) and the value in the type's binary send format — the same bytes pgoutput sends
for a ``b`` column. So a row group of COPY rows frames into the decoder's ``FramedImages``
(kind ``b`` or ``n`` per field) with one numpy pass per column, and the decoder's codecs turn it
into exactly the Arrow types of staged changes.

The first message carries the 19-byte file header (signature, flags, extension length) before
the first row; the last one is the trailer (``int16 -1``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from airflow_provider_pglogical.decoding.values.framing import FramedImages
from airflow_provider_pglogical.decoding.values.vector import PAD, big_endian
from airflow_provider_pglogical.exceptions import DecodeError

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
TRAILER = b"\xff\xff"
_KIND_B, _KIND_N = ord("b"), ord("n")


def header_length(first: bytes) -> int:
    """The length of the binary COPY file header at the start of the first CopyData message."""
    if not first.startswith(SIGNATURE) or len(first) < 19:
        raise DecodeError("binary COPY data does not start with the PGCOPY signature")
    flags = int.from_bytes(first[11:15], "big")
    if flags & 0xFFFF0000:
        raise DecodeError(f"binary COPY header has unknown critical flags {flags:#x}")
    return 19 + int.from_bytes(first[15:19], "big")


def join_rows(rows: Sequence[bytes]) -> tuple[bytes, np.ndarray]:
    """Rows (one CopyData message each) back to back, and each one's length: ``frame_copy_block``'s input."""
    return b"".join(rows), np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))


def frame_copy_block(rows: bytes, sizes: np.ndarray, ncols: int) -> FramedImages:
    """Frame whole binary COPY rows, given back to back with each one's length in ``sizes``, into ``ncols``
    columns at once."""
    n = len(sizes)
    ends = np.cumsum(sizes)
    data = rows + bytes(PAD)
    buf = np.frombuffer(data, dtype=np.uint8)
    limit = len(data) - PAD
    pos = ends - sizes
    bad = big_endian(buf, ">i2")[np.minimum(pos, limit)] != ncols
    pos = pos + 2
    int32_at = big_endian(buf, ">i4")
    kinds = np.empty((ncols, n), dtype=np.uint8)
    starts = np.zeros((ncols, n), dtype=np.int64)
    lengths = np.zeros((ncols, n), dtype=np.int64)
    for j in range(ncols):
        np.clip(pos, 0, limit, out=pos)
        length = int32_at[pos]
        valued = length >= 0
        bad |= length < -1
        kinds[j] = np.where(valued, _KIND_B, _KIND_N)
        lengths[j] = np.where(valued, length, 0)
        starts[j] = np.where(valued, pos + 4, 0)
        pos = pos + 4 + lengths[j]
    bad |= pos != ends
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DecodeError(f"binary COPY row {i} of this group does not frame as {ncols} fields "
                          f"({int(sizes[i])} bytes)")
    return FramedImages(data, buf, kinds, starts, lengths)
