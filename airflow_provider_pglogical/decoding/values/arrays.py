"""Arrays: nested Python lists; in Arrow a flat list in storage order plus a shape note when not 1-D from 1."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from airflow_provider_pglogical.decoding.values.codec import Codec, Notes, Reader
from airflow_provider_pglogical.decoding.values.sentinels import PgArray
from airflow_provider_pglogical.exceptions import DecodeError

MAXDIM = 6  # utils/array.h
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
