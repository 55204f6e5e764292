"""Column-at-a-time builders: join raw bytes, reinterpret with numpy, wrap as Arrow without per-value Python."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from airflow_provider_pglogical.exceptions import DecodeError

_B = ord("b")
_INT32_MAX = 2**31 - 1


def value_mask(kinds: str) -> np.ndarray:
    """True where the column carries no value ('n' or 'u'); callers decide what a 't' means."""
    return np.frombuffer(kinds.encode("ascii"), dtype=np.uint8) != _B


def fixed_width(kinds: str, raws: Sequence[bytes | None], width: int, dtype: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Big-endian fixed-width binary values as a native numpy array plus a null mask.

    Returns None when the column has text values or a value of the wrong size, so the caller
    falls back to the per-value path (which raises the precise error).
    """
    if "t" in kinds:
        return None
    zero = bytes(width)
    buf = b"".join([zero if r is None else r for r in raws])
    if len(buf) != width * len(raws):
        return None
    values = np.frombuffer(buf, dtype=dtype)
    return values.astype(values.dtype.newbyteorder("=")), value_mask(kinds)


def with_mask(values: np.ndarray, mask: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    if not mask.any():
        return pa.array(values, type=arrow_type)
    return pa.array(values, type=arrow_type, mask=mask)


def varlena(kinds: str, raws: Sequence[bytes | None], arrow_type: pa.DataType, skip: int = 0) -> pa.Array:
    """string/binary array straight from the value bytes: one join, one cumsum, no per-value decode.

    ``skip`` drops a fixed prefix of every value (jsonb's version byte). string arrays are
    validated as UTF-8 in C.
    """
    n = len(raws)
    vals = [b"" if r is None else r for r in raws]
    lens = np.fromiter(map(len, vals), dtype=np.int64, count=n)
    if skip:
        vals = [v[skip:] for v in vals]
        lens = np.maximum(lens - skip, 0)
    data = b"".join(vals)
    if len(data) > _INT32_MAX:
        raise DecodeError("column over 2 GiB in one batch")
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:], dtype=np.int32)
    mask = np.frombuffer(kinds.encode("ascii"), dtype=np.uint8)
    valid = (mask == _B) | (mask == ord("t"))
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    arr = pa.Array.from_buffers(arrow_type, n, [validity, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)],
                                null_count=int(n - valid.sum()))
    if pa.types.is_string(arrow_type):
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            raise DecodeError("text value is not valid utf-8") from None
    return arr
