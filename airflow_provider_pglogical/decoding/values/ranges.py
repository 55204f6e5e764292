"""Ranges (Range records / Arrow structs with inclusivity and empty flags) and multiranges (lists of them)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from airflow_provider_pglogical.decoding.values.codec import Codec, Notes, Reader
from airflow_provider_pglogical.decoding.values.composite import split_fields
from airflow_provider_pglogical.decoding.values.sentinels import Range
from airflow_provider_pglogical.exceptions import DecodeError

# range flags (utils/rangetypes.h)
RANGE_EMPTY = 0x01
RANGE_LB_INC = 0x02
RANGE_UB_INC = 0x04
RANGE_LB_INF = 0x08
RANGE_UB_INF = 0x10

Bounds = tuple[Any, Any, bool, bool, bool]


def _binary_bounds(raw: bytes) -> tuple[int, bytes | None, bytes | None]:
    r = Reader(raw, "range")
    flags = r.byte()
    lower = upper = None
    if not flags & (RANGE_EMPTY | RANGE_LB_INF):
        lower = r.counted()
        if lower is None:
            raise DecodeError("range bound is null")
    if not flags & (RANGE_EMPTY | RANGE_UB_INF):
        upper = r.counted()
        if upper is None:
            raise DecodeError("range bound is null")
    r.finish()
    return flags, lower, upper


def _text_bounds(text: str) -> tuple[bool, str | None, str | None, bool, bool]:
    """range_out syntax: 'empty' or [ ( lower , upper ] ) with empty bare bounds unbounded."""
    if text == "empty":
        return True, None, None, False, False
    if not text or text[0] not in "[(":
        raise DecodeError("invalid range text value")
    fields, end = split_fields(text, ")]", "range")
    if end != len(text) - 1 or len(fields) != 2:
        raise DecodeError("invalid range text value")
    lower, upper = fields
    return False, lower, upper, text[0] == "[" and lower is not None, text[-1] == "]" and upper is not None


class RangeCodec(Codec):
    """Arrow struct<lower, upper, lower_inclusive, upper_inclusive, empty>; a null bound is unbounded
    (range bounds themselves can never be SQL NULL)."""

    def __init__(self, name: str, subtype: Codec) -> None:
        self.name = name
        self.subtype = subtype
        self.arrow_type = pa.struct([
            ("lower", subtype.arrow_type), ("upper", subtype.arrow_type),
            ("lower_inclusive", pa.bool_()), ("upper_inclusive", pa.bool_()), ("empty", pa.bool_()),
        ])

    def _record(self, empty: bool, lower: Any, upper: Any, li: bool, ui: bool) -> Range:
        return Range(None, None, False, False, True) if empty else Range(lower, upper, li, ui, False)

    def from_binary(self, raw: bytes) -> Range:
        flags, lo, up = _binary_bounds(raw)
        st = self.subtype
        return self._record(bool(flags & RANGE_EMPTY), None if lo is None else st.python("b", lo),
                            None if up is None else st.python("b", up),
                            bool(flags & RANGE_LB_INC) and lo is not None, bool(flags & RANGE_UB_INC) and up is not None)

    def from_text(self, text: str) -> Range:
        empty, lo, up, li, ui = _text_bounds(text)
        st = self.subtype
        return self._record(empty, None if lo is None else st.from_text(lo), None if up is None else st.from_text(up),
                            li, ui)

    @staticmethod
    def _arrow(r: Range) -> dict[str, Any]:
        return {"lower": r.lower, "upper": r.upper, "lower_inclusive": r.lower_inclusive,
                "upper_inclusive": r.upper_inclusive, "empty": r.empty}

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> dict[str, Any]:
        flags, lo, up = _binary_bounds(raw)
        st = self.subtype
        return self._arrow(self._record(
            bool(flags & RANGE_EMPTY), None if lo is None else st.arrow("b", lo, notes, f"{path}.lower"),
            None if up is None else st.arrow("b", up, notes, f"{path}.upper"),
            bool(flags & RANGE_LB_INC) and lo is not None, bool(flags & RANGE_UB_INC) and up is not None))

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> dict[str, Any]:
        empty, lo, up, li, ui = _text_bounds(text)
        st = self.subtype
        return self._arrow(self._record(
            empty, None if lo is None else st.arrow_from_text(lo, notes, f"{path}.lower"),
            None if up is None else st.arrow_from_text(up, notes, f"{path}.upper"), li, ui))


def _split_multirange(text: str) -> list[str]:
    """'{[1,3),[5,7)}' → ['[1,3)', '[5,7)'], honouring quotes inside bounds."""
    if len(text) < 2 or text[0] != "{" or text[-1] != "}":
        raise DecodeError("invalid multirange text value")
    out, pos, n = [], 1, len(text) - 1
    while pos < n:
        start, quoted = pos, False
        while pos < n and (quoted or text[pos] not in ")]"):
            if text[pos] == "\\":
                pos += 1
            elif text[pos] == '"':
                quoted = not quoted
            pos += 1
        if pos >= n:
            raise DecodeError("invalid multirange text value")
        out.append(text[start:pos + 1])
        pos += 1
        if pos < n:
            if text[pos] != ",":
                raise DecodeError("invalid multirange text value")
            pos += 1
    return out


class MultirangeCodec(Codec):
    def __init__(self, name: str, range_codec: RangeCodec) -> None:
        self.name = name
        self.range = range_codec
        self.arrow_type = pa.list_(range_codec.arrow_type)

    @staticmethod
    def _binary_ranges(raw: bytes) -> list[bytes]:
        r = Reader(raw, "multirange")
        count = r.int32()
        if count < 0 or count > len(raw):
            raise DecodeError("invalid multirange range count")
        out = []
        for _ in range(count):
            item = r.counted()
            if item is None:
                raise DecodeError("multirange element is null")
            out.append(item)
        r.finish()
        return out

    def from_binary(self, raw: bytes) -> list[Range]:
        return [self.range.from_binary(item) for item in self._binary_ranges(raw)]

    def from_text(self, text: str) -> list[Range]:
        return [self.range.from_text(item) for item in _split_multirange(text)]

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> list[dict[str, Any]]:
        return [self.range.arrow_from_binary(item, notes, f"{path}[{i}]")
                for i, item in enumerate(self._binary_ranges(raw))]

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> list[dict[str, Any]]:
        return [self.range.arrow_from_text(item, notes, f"{path}[{i}]")
                for i, item in enumerate(_split_multirange(text))]
