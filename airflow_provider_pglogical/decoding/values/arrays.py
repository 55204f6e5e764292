"""Arrays: nested Python lists; in Arrow a flat list in storage order plus a shape note when not 1-D from 1."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_provider_pglogical.decoding.values.codec import Codec, Notes, Reader
from airflow_provider_pglogical.decoding.values.sentinels import PgArray
from airflow_provider_pglogical.decoding.values.vector import (
    KIND_BINARY,
    KIND_NULL,
    KIND_TEXT,
    Column,
    big_endian,
    validity_buffer,
)
from airflow_provider_pglogical.exceptions import DecodeError

MAXDIM = 6  # utils/array.h
# The vectorised path frames element j of every array in one numpy step; longer arrays go value by value.
VECTOR_MAX_ELEMENTS = 4096
_DIMS = re.compile(r"((?:\[-?\d+:-?\d+\])+)=")
_BOUND = re.compile(r"\[(-?\d+):(-?\d+)\]")


def shape_note(dims: list[int], lbs: list[int]) -> str | None:
    """PostgreSQL's own dimension decoration ('[0:1][1:3]'), needed unless the array is 1-D from 1."""
    if not dims or (len(dims) == 1 and lbs[0] == 1):
        return None
    return "".join(f"[{lb}:{lb + d - 1}]" for d, lb in zip(dims, lbs, strict=True))


def _nest(flat: list[Any], dims: list[int]) -> list[Any]:
    if len(dims) <= 1:
        return flat
    step = len(flat) // dims[0] if dims[0] else 0
    return [_nest(flat[i * step:(i + 1) * step], dims[1:]) for i in range(dims[0])]


def _binary_layout(raw: bytes) -> tuple[list[int], list[int], list[bytes | None]]:
    r = Reader(raw, "array")
    ndim, has_nulls = r.int32(), r.int32()
    r.uint32()  # element type OID: publisher-local, the column's type already fixes the element codec
    if not 0 <= ndim <= MAXDIM or has_nulls not in (0, 1):
        raise DecodeError("invalid array binary header")
    dims, lbs = [], []
    for _ in range(ndim):
        d, lb = r.int32(), r.int32()
        if d < 0:
            raise DecodeError("negative array dimension")
        dims.append(d)
        lbs.append(lb)
    count = 1
    for d in dims:
        count *= d
    if ndim == 0:
        count = 0
    if count > len(raw):  # each element needs at least its 4-byte length
        raise DecodeError("array element count exceeds the value size")
    elems = [r.counted() for _ in range(count)]
    r.finish()
    return dims, lbs, elems


def parse_array_text(text: str) -> tuple[list[int], list[int], list[str | None]]:
    """array_out syntax: optional '[lb:ub]...=' then nested braces; elements quoted or bare, NULL bare."""
    bounds: list[tuple[int, int]] | None = None
    pos = 0
    m = _DIMS.match(text)
    if m:
        bounds = [(int(a), int(b)) for a, b in _BOUND.findall(m.group(1))]
        pos = m.end()
    flat: list[str | None] = []
    sizes: dict[int, int] = {}
    depth_max = 0
    n = len(text)

    def parse_level(pos: int, depth: int) -> int:
        nonlocal depth_max
        if pos >= n or text[pos] != "{":
            raise DecodeError("invalid array text value")
        depth_max = max(depth_max, depth + 1)
        pos += 1
        count = 0
        if pos < n and text[pos] == "}":
            pos += 1
        else:
            while True:
                if pos < n and text[pos] == "{":
                    pos = parse_level(pos, depth + 1)
                else:
                    pos = _element(pos)
                count += 1
                if pos >= n:
                    raise DecodeError("invalid array text value")
                if text[pos] == ",":
                    pos += 1
                    continue
                if text[pos] == "}":
                    pos += 1
                    break
                raise DecodeError("invalid array text value")
        if sizes.setdefault(depth, count) != count:
            raise DecodeError("multidimensional array text value is not rectangular")
        return pos

    def _element(pos: int) -> int:
        if pos < n and text[pos] == '"':
            out = []
            pos += 1
            while pos < n and text[pos] != '"':
                if text[pos] == "\\":
                    pos += 1
                if pos >= n:
                    raise DecodeError("invalid array text value")
                out.append(text[pos])
                pos += 1
            if pos >= n:
                raise DecodeError("invalid array text value")
            flat.append("".join(out))
            return pos + 1
        end = pos
        while end < n and text[end] not in ",}{\"":
            end += 1
        token = text[pos:end].strip()
        if not token:
            raise DecodeError("invalid array text value")
        flat.append(None if token.upper() == "NULL" else token.replace("\\", ""))
        return end

    end = parse_level(pos, 0)
    if end != n:
        raise DecodeError("invalid array text value")
    dims = [sizes[d] for d in range(depth_max)] if flat or sizes.get(0) else []
    if dims and dims[0] == 0:
        dims = []
    if bounds is None:
        return dims, [1] * len(dims), flat
    if [ub - lb + 1 for lb, ub in bounds] != dims:
        raise DecodeError("array dimension decoration does not match its value")
    return dims, [lb for lb, _ in bounds], flat


class ArrayCodec(Codec):
    def __init__(self, element: Codec) -> None:
        self.element = element
        self.name = f"{element.name}[]"
        self.arrow_type = pa.list_(element.arrow_type)

    def _python(self, dims: list[int], lbs: list[int], values: list[Any]) -> Any:
        nested = _nest(values, dims)
        return PgArray(tuple(lbs), nested) if any(lb != 1 for lb in lbs) else nested

    def from_binary(self, raw: bytes) -> Any:
        dims, lbs, elems = _binary_layout(raw)
        el = self.element
        return self._python(dims, lbs, [None if e is None else el.python("b", e) for e in elems])

    def from_text(self, text: str) -> Any:
        dims, lbs, elems = parse_array_text(text)
        el = self.element
        return self._python(dims, lbs, [None if e is None else el.from_text(e) for e in elems])

    def arrow_column(self, col: Column) -> pa.Array | None:
        """Binary 1-D arrays from 1 (and empty ones) of an element type with a vectorised path, as one
        ListArray over the element codec's column: no Python object per value or element.

        Anything else — text values, more dimensions or other lower bounds (they need a shape note),
        element types without a vectorised path, malformed values — returns None, and the per-value
        path converts the column (and raises the precise error).
        """
        return _vector_arrays(self, col)

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> list[Any]:
        dims, lbs, elems = _binary_layout(raw)
        el = self.element
        out = [None if e is None else el.arrow("b", e, notes, f"{path}[{i}]") for i, e in enumerate(elems)]
        note = shape_note(dims, lbs)
        if note:
            notes[path] = note
        return out

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> list[Any]:
        dims, lbs, elems = parse_array_text(text)
        el = self.element
        out = [None if e is None else el.arrow_from_text(e, notes, f"{path}[{i}]") for i, e in enumerate(elems)]
        note = shape_note(dims, lbs)
        if note:
            notes[path] = note
        return out


def _vector_arrays(codec: ArrayCodec, col: Column) -> pa.Array | None:
    """``ArrayCodec.arrow_column``: frame every element into one ``Column``, convert it at once."""
    if col.has(KIND_TEXT):
        return None
    n = len(col)
    valid = col.kinds == KIND_BINARY
    rows = np.flatnonzero(valid)
    starts, lengths = col.starts[rows], col.lengths[rows]
    if (lengths < 12).any():  # ndim, has_nulls, element type
        return None
    i32 = big_endian(col.buf, ">i4")
    ndim, has_nulls = i32[starts], i32[starts + 4]
    one = ndim == 1
    if not ((ndim == 0) | one).all() or not ((has_nulls == 0) | (has_nulls == 1)).all():
        return None
    if (lengths[one] < 20).any():  # ndim 1: plus its dimension and lower bound
        return None
    at = np.where(one, starts, 0)
    counts = np.where(one, i32[at + 12], 0).astype(np.int64)
    lower = np.where(one, i32[at + 16], 1)
    if (counts < 0).any() or (lower != 1).any() or (4 * counts > lengths).any():
        return None
    if len(counts) and counts.max() > VECTOR_MAX_ELEMENTS:
        return None
    ends = starts + lengths
    first = np.zeros(len(rows) + 1, dtype=np.int64)  # index of each array's first element
    np.cumsum(counts, out=first[1:])
    total = int(first[-1])
    kinds = np.full(total, KIND_NULL, dtype=np.uint8)
    e_starts = np.zeros(total, dtype=np.int64)
    e_lengths = np.zeros(total, dtype=np.int64)
    pos = starts + np.where(one, 20, 12)
    active = np.flatnonzero(counts > 0)
    j = 0
    while len(active):
        p = pos[active]
        if (p + 4 > ends[active]).any():
            return None
        length = i32[p]
        if (length < -1).any():
            return None
        has_value = length >= 0
        out = first[active] + j
        kinds[out] = np.where(has_value, KIND_BINARY, KIND_NULL)
        e_starts[out] = np.where(has_value, p + 4, 0)
        e_lengths[out] = np.where(has_value, length, 0)
        pos[active] = p + 4 + np.where(has_value, length, 0)
        j += 1
        active = active[counts[active] > j]
    if (pos != ends).any():  # an element runs past its value, or trailing bytes
        return None
    values = codec.element.arrow_column(Column(kinds, col.data, col.buf, e_starts, e_lengths))
    if values is None or values.type != codec.element.arrow_type:
        return None
    offsets = np.zeros(n + 1, dtype=np.int32)
    per_row = np.zeros(n, dtype=np.int64)
    per_row[rows] = counts
    if total > 2**31 - 1:
        return None
    np.cumsum(per_row, out=offsets[1:])
    return pa.Array.from_buffers(codec.arrow_type, n, [validity_buffer(valid), pa.py_buffer(offsets)],
                                 null_count=int(n - len(rows)), children=[values])
