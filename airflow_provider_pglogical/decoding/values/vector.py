"""Column-at-a-time builders: values as slices of one buffer, reinterpreted with numpy, wrapped as Arrow.

A ``Column`` is one column of n row images without a Python object per value: the TupleData
kind byte of every row plus (start, length) of its value inside one shared byte buffer. The
framer (``decoding.framing``) builds it straight from the message bytes; ``Column.from_raws``
builds it from already-split values. Codecs with a vectorised path read it with numpy; the
others ask for ``kinds_str()``/``raws()`` and go value by value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from airflow_provider_pglogical.decoding import speedups
from airflow_provider_pglogical.exceptions import DecodeError

KIND_BINARY, KIND_TEXT, KIND_NULL, KIND_UNCHANGED = ord("b"), ord("t"), ord("n"), ord("u")
_INT32_MAX = 2**31 - 1
# Every buffer ends in this many zero bytes so a fixed-width gather at a placeholder start
# (rows without a value point at 0) never reads past the end.
PAD = 16
_PADDING = bytes(PAD)


class Column:
    """n values of one column: ``kinds`` (uint8 'b','t','n','u'), and ``starts``/``lengths`` into ``buf``.

    ``data`` is ``buf`` as ``bytes`` (slicing it is the cheapest way to a Python ``bytes``).
    Rows without a value have start 0 and length 0.
    """

    __slots__ = ("buf", "data", "kinds", "lengths", "starts")

    def __init__(self, kinds: np.ndarray, data: bytes, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.kinds, self.data, self.buf, self.starts, self.lengths = kinds, data, buf, starts, lengths

    @classmethod
    def from_raws(cls, kinds: str, raws: Sequence[bytes | None]) -> Column:
        vals = [b"" if r is None else r for r in raws]
        n = len(vals)
        lengths = np.fromiter(map(len, vals), dtype=np.int64, count=n)
        starts = np.zeros(n, dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        data = b"".join(vals) + _PADDING
        return cls(np.frombuffer(kinds.encode("latin-1"), dtype=np.uint8), data,
                   np.frombuffer(data, dtype=np.uint8), starts, lengths)

    def __len__(self) -> int:
        return len(self.kinds)

    @property
    def valued(self) -> np.ndarray:
        """True where the row carries a value ('b' or 't')."""
        k = self.kinds
        valued: np.ndarray = (k == KIND_BINARY) | (k == KIND_TEXT)  # numpy types == as Any
        return valued

    def has(self, kind: int) -> bool:
        return bool((self.kinds == kind).any())

    def kinds_str(self) -> str:
        return self.kinds.tobytes().decode("latin-1")

    def raws(self) -> list[bytes | None]:
        """Per row the value bytes, None for 'n'/'u' (the per-value codecs' input)."""
        data = self.data
        return [data[s:s + n] if v else None
                for v, s, n in zip(self.valued.tolist(), self.starts.tolist(), self.lengths.tolist(), strict=True)]


def big_endian(buf: np.ndarray, dtype: str) -> np.ndarray:
    """``buf`` seen as overlapping numbers: element k is the ``dtype`` starting at byte k.

    One gather at any byte offsets then reads fixed-width values, unaligned, in place.
    """
    width = np.dtype(dtype).itemsize
    return np.ndarray(shape=(max(len(buf) - width + 1, 0),), dtype=dtype, buffer=buf, strides=(1,))


def fixed_width(col: Column, width: int, dtype: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Big-endian fixed-width binary values as a native numpy array plus a null mask.

    Returns None when the column has text values or a value of the wrong size, so the caller
    falls back to the per-value path (which raises the precise error).
    """
    if col.has(KIND_TEXT):
        return None
    valid = col.kinds == KIND_BINARY
    if (col.lengths[valid] != width).any():
        return None
    values = big_endian(col.buf, dtype)[np.where(valid, col.starts, 0)]
    values = values.astype(values.dtype.newbyteorder("="))
    values[~valid] = 0  # rows without a value carry zeros, so output is stable
    return values, ~valid


def _numpy_dtype(arrow_type: pa.DataType) -> np.dtype:
    """The native numpy dtype with the memory layout of a fixed-width Arrow type."""
    width = arrow_type.bit_width // 8
    if pa.types.is_floating(arrow_type):
        return np.dtype(f"f{width}")
    return np.dtype(f"u{width}" if pa.types.is_unsigned_integer(arrow_type) else f"i{width}")


def with_mask(values: np.ndarray, mask: np.ndarray | None, arrow_type: pa.DataType) -> pa.Array:
    """A fixed-width Arrow array over ``values`` (null where ``mask``), built from buffers.

    ``pa.array(ndarray)`` would import pandas on first use (a quarter second).
    """
    n = len(values)
    if pa.types.is_boolean(arrow_type):
        data = np.packbits(values.astype(bool), bitorder="little")
    else:
        data = np.ascontiguousarray(values, dtype=_numpy_dtype(arrow_type))
    nulls = 0 if mask is None else int(mask.sum())
    return pa.Array.from_buffers(arrow_type, n, [validity_buffer(~mask) if mask is not None and nulls else None, pa.py_buffer(data)],
                                 null_count=nulls)


def string_array(values: Sequence[str], what: str) -> pa.Array:
    """A string array of ``values`` (no nulls), built from buffers: ``pa.array(list)`` would import pandas
    on its first call in a process (1–4.5 s in a snapshot reader under load). ``what``: the array, for errors."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    check_string_bytes(int(offsets[-1]), len(encoded), what)
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets.astype(np.int32)),
                                                             pa.py_buffer(b"".join(encoded))], null_count=0)


def repeated_string(value: str, n: int, what: str) -> pa.Array:
    """``value`` n times as a string array (no nulls), from buffers (see ``string_array``)."""
    raw = value.encode()
    offsets = np.arange(n + 1, dtype=np.int64) * len(raw)
    check_string_bytes(int(offsets[-1]), n, what)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(raw * n)], null_count=0)


def check_string_bytes(total: int, n: int, what: str) -> None:
    """An Arrow string array's 32-bit offsets hold 2 GiB; its entries' count bounds its size, and the decode's
    ``row_group_rows`` bounds that count (a snapshot's row groups are bounded by their COPY bytes as well)."""
    if total > _INT32_MAX:
        raise DecodeError(f"{what}: {total} bytes in {n} entries, over the 2 GiB one Arrow string array holds; "
                          "stage fewer rows per row group (the decode's row_group_rows)")


def validity_buffer(valid: np.ndarray) -> pa.Buffer | None:
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())


def varlena(col: Column, arrow_type: pa.DataType, skip: int = 0) -> pa.Array:
    """string/binary array straight from the value slices: one gather, one cumsum, no per-value decode.

    ``skip`` drops a fixed prefix of every value (jsonb's version byte; callers check it exists).
    string arrays are validated as UTF-8 in C.
    """
    n = len(col)
    valid = col.valued
    lens = np.where(valid, col.lengths - skip, 0)
    total = int(lens.sum())
    if total > _INT32_MAX:
        raise DecodeError("column over 2 GiB in one batch")
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    try:
        data = _gather(col.data, np.where(valid, col.starts + skip, 0), lens, total) if total else b""
    except ValueError as e:  # the framer's slices do not fit its buffer: a framing fault, never a short value
        raise DecodeError(f"row images' value bytes: {e}") from None
    arr = pa.Array.from_buffers(arrow_type, n, [validity_buffer(valid), pa.py_buffer(offsets.astype(np.int32)),
                                                pa.py_buffer(data)], null_count=int(n - valid.sum()))
    if pa.types.is_string(arrow_type):
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            raise DecodeError("text value is not valid utf-8") from None
    return arr


def gather_slices_py(data: bytes, starts: np.ndarray, lengths: np.ndarray, total: int) -> bytes:
    """``data[starts[i]:starts[i] + lengths[i]]`` joined (int64 arrays, ``total`` the lengths' sum): the reference
    of ``_speedups.gather_slices`` (typing's largest numpy step in the drain), refusing what it refuses with its
    ValueError: arrays of two sizes, a slice outside ``data``, a total that is not the lengths' sum."""
    if len(starts) != len(lengths) or total < 0:
        raise ValueError("gather_slices: starts and lengths must be int64 arrays of one size")
    ends = starts + lengths
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    outside = (starts < 0) | (lengths < 0) | (starts > len(data)) | (ends > len(data)) | (offsets[1:] > total)
    if outside.any():
        raise ValueError(f"gather_slices: slice {int(np.argmax(outside))} is outside the buffer or the total")
    if int(offsets[-1]) != total:
        raise ValueError(f"gather_slices: the slices hold {int(offsets[-1])} bytes, not {total}")
    # index of every output byte in data: each value's start, shifted by its output offset
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(total)
    gathered: bytes = np.frombuffer(data, dtype=np.uint8)[index].tobytes()
    return gathered


# Bound once: a compiled module built before gather_slices existed (a stale build) types with the numpy path.
_gather_slices_c = getattr(speedups.compiled, "gather_slices", None)


def _gather(data: bytes, starts: np.ndarray, lengths: np.ndarray, total: int) -> bytes:
    if _gather_slices_c is None:
        return gather_slices_py(data, starts, lengths, total)
    gathered: bytes = _gather_slices_c(
        data, np.ascontiguousarray(starts, dtype=np.int64), np.ascontiguousarray(lengths, dtype=np.int64), total)
    return gathered


_HEX = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), dtype=np.uint8).reshape(256, 2)
# where the 32 hex digits of a uuid go in its 36-character form (hyphens at 8, 13, 18, 23)
_UUID_DIGITS = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])
_UUID_TEMPLATE = np.frombuffer(b"00000000-0000-0000-0000-000000000000", dtype=np.uint8)


def uuid_strings(col: Column, what: str) -> pa.Array | None:
    """16-byte binary uuids as their canonical lower-case 36-character strings (``str(uuid.UUID)``), from buffers.

    None when the column has text values or a value of another size: the per-value path raises the precise error.
    """
    if col.has(KIND_TEXT):
        return None
    valid = col.kinds == KIND_BINARY
    if (col.lengths[valid] != 16).any():
        return None
    n, m = len(col), int(valid.sum())
    check_string_bytes(36 * m, m, what)
    digits = _HEX[col.buf[col.starts[valid][:, None] + np.arange(16)]].reshape(m, 32)  # 2 hex digits per byte
    text = np.tile(_UUID_TEMPLATE, (m, 1))
    text[:, _UUID_DIGITS] = digits
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.where(valid, 36, 0), out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), n, [validity_buffer(valid), pa.py_buffer(offsets),
                                                  pa.py_buffer(text.tobytes())], null_count=n - m)
