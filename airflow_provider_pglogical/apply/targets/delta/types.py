"""Staged Arrow values → the closest Delta Lake types, exactly, or a typed error (docs/types.md, "Delta Lake").

Delta holds booleans, 8–64-bit signed ints, float/double, ``decimal(p ≤ 38, s)``, string, binary,
date, timestamp (µs, UTC), timestamp_ntz (µs), arrays, structs and maps. Every staged value maps
onto those without loss:

* ``time`` (time64[us]) → ``long`` microseconds since midnight (Delta has no time type; 24:00:00 is
  86 400 000 000); a ``timetz`` struct keeps its offset field beside it.
* ``pg_lsn`` and other unsigned ints → the next wider signed type, ``uint64`` → ``decimal(20,0)``.
* ``decimal256`` (``numeric(p,s)`` with p > 38) → ``string``, the exact decimal text (``staged_arrow.decimal_text``;
  read through Spark, such a column arrives as that text already).
* ``money`` (staged as int64 minor units) → ``decimal(19,2)``, the same digits.
* timestamps → µs, ``timestamptz`` as UTC.

What Delta cannot hold is refused, never rounded: ±infinity dates and timestamps (PostgreSQL's raw
INT32/INT64 extremes overflow every Delta reader's calendar) raise ``DeltaValueError`` naming the
table, column and batch, as does a value with an exactness note (``numeric`` NaN, arrays that are
multi-dimensional or do not start at 1), which the apply checks before converting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.apply.staged_arrow import decimal_text
from airflow_provider_pglogical.exceptions import ApplyError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MONEY = pa.decimal128(19, 2)
_UNSIGNED = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64(), pa.uint64(): pa.decimal128(20, 0)}


class DeltaValueError(ApplyError):
    """A staged value that no Delta type holds exactly (the message names the column, never the value)."""


@dataclass(frozen=True)
class Lake:
    """The table format a conversion writes for, as its errors name it: the mapping below is shared by the
    lake targets whose types are the same (Delta, Iceberg), each refusing values with its own error."""

    name: str
    error: type[ApplyError]


DELTA = Lake("Delta", DeltaValueError)


def delta_type(dtype: pa.DataType, type_name: str | None = None) -> pa.DataType:
    """The Delta-writable Arrow type for a staged (or Spark-read) Arrow type; ``type_name`` is the
    relation's SQL type of a top-level column (only ``money`` needs it)."""
    if type_name == "money" and pa.types.is_integer(dtype):
        return MONEY
    if pa.types.is_time(dtype):
        return pa.int64()
    if dtype in _UNSIGNED:
        return _UNSIGNED[dtype]
    if pa.types.is_decimal256(dtype):
        return pa.string() if dtype.precision > 38 else pa.decimal128(dtype.precision, dtype.scale)
    if pa.types.is_timestamp(dtype):
        return pa.timestamp("us", tz="UTC" if dtype.tz is not None else None)
    if pa.types.is_date(dtype):
        return pa.date32()
    if pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return pa.string()
    if pa.types.is_large_binary(dtype) or pa.types.is_binary_view(dtype) or pa.types.is_fixed_size_binary(dtype):
        return pa.binary()
    if pa.types.is_struct(dtype):
        return pa.struct([pa.field(f.name, delta_type(f.type), nullable=True) for f in dtype])
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        return pa.list_(pa.field("element", delta_type(dtype.value_type), nullable=True))
    if pa.types.is_map(dtype):
        return pa.map_(delta_type(dtype.key_type), delta_type(dtype.item_type))
    if pa.types.is_dictionary(dtype):
        return delta_type(dtype.value_type)
    if pa.types.is_null(dtype):
        return pa.string()  # an all-NULL column Spark could not type; written as null strings
    if pa.types.is_interval(dtype) or pa.types.is_duration(dtype):
        raise ApplyError(f"Arrow type {dtype} has no Delta mapping")  # never staged (interval is a struct)
    return dtype


def delta_schema(schema: pa.Schema, type_names: Mapping[str, str | None] | None = None) -> pa.Schema:
    names = type_names or {}
    return pa.schema([pa.field(f.name, delta_type(f.type, names.get(f.name)), nullable=True) for f in schema])


def _money(arr: pa.Array) -> pa.Array:
    """int64 minor units → decimal(19,2) holding the same unscaled integer: the exact cast to decimal(19,0),
    relabelled with scale 2 (no float, no arithmetic, so nothing rounds or wraps, NULLs or not)."""
    units = pc.cast(arr, pa.decimal128(19, 0))
    return pa.Array.from_buffers(MONEY, len(units), units.buffers(), units.null_count, units.offset)


def _check_finite(arr: pa.Array, low: int, high: int, path: str, where: str, lsns: pa.Array | None,
                  lake: Lake = DELTA) -> None:
    raw = pc.cast(arr, pa.int32() if high == INT32_MAX else pa.int64())
    infinite = pc.fill_null(pc.or_(pc.equal(raw, low), pc.equal(raw, high)), False)
    if pc.any(infinite).as_py():
        at = f" (change at LSN {pc.min(lsns.filter(infinite)).as_py():X})" if lsns is not None else ""
        raise lake.error(f"{where}: column {path}{at} holds ±infinity, which no {lake.name} date/timestamp can hold")


def convert_array(arr: pa.Array, target: pa.DataType, path: str, where: str, type_name: str | None = None,
                  lsns: pa.Array | None = None, lake: Lake = DELTA) -> pa.Array:
    """One array to ``target`` (from ``delta_type``), checking what cannot be held exactly; ``lsns`` (aligned
    with ``arr``) name the first offending change in an error."""
    src = arr.type
    if isinstance(arr, pa.DictionaryArray):
        arr, src = arr.dictionary_decode(), src.value_type
    if src == target and not (pa.types.is_timestamp(src) or pa.types.is_date(src)
                              or pa.types.is_struct(src) or pa.types.is_list(src)):
        return arr
    if target == MONEY and type_name == "money" and pa.types.is_integer(src):
        return _money(arr)
    if pa.types.is_decimal(src) and pa.types.is_string(target):
        return decimal_text(arr)  # Arrow's own cast would print 1E-7 and 0E-10
    if pa.types.is_time(src):
        try:  # a safe cast refuses to drop nanoseconds
            return pc.cast(pc.cast(arr, pa.time64("us"), safe=True), pa.int64())
        except pa.ArrowInvalid as exc:
            raise lake.error(f"{where}: column {path} has nanoseconds, {lake.name} holds microseconds") from exc
    if pa.types.is_date(src):
        out = pc.cast(arr, pa.date32())
        _check_finite(out, INT32_MIN, INT32_MAX, path, where, lsns, lake)
        return out
    if pa.types.is_timestamp(src):
        _check_finite(arr, INT64_MIN, INT64_MAX, path, where, lsns, lake)
        try:
            return pc.cast(arr, target, safe=True)
        except pa.ArrowInvalid as exc:
            raise lake.error(f"{where}: column {path} has nanoseconds, {lake.name} holds microseconds") from exc
    if pa.types.is_struct(src):
        fields = [convert_array(arr.field(i), target.field(i).type, f"{path}.{target.field(i).name}", where,
                                lsns=lsns, lake=lake)
                  for i in range(src.num_fields)]
        mask = pc.is_null(arr) if arr.null_count else None
        return pa.StructArray.from_arrays(fields, fields=list(target), mask=mask)
    if pa.types.is_list(src) or pa.types.is_large_list(src) or pa.types.is_fixed_size_list(src):
        if not isinstance(arr, pa.ListArray):
            arr = pc.cast(arr, pa.list_(src.value_type))
        values = convert_array(arr.flatten(), target.value_type, path + "[]", where, lake=lake)
        offsets = pc.subtract(arr.offsets, arr.offsets[0]) if arr.offset else arr.offsets
        mask = pc.is_null(arr) if arr.null_count else None
        return pa.ListArray.from_arrays(offsets, values, type=target, mask=mask)
    return pc.cast(arr, target, safe=True)


def to_delta(table: pa.Table, schema: pa.Schema, where: str,
             type_names: Mapping[str, str | None] | None = None, lsn_column: str | None = None,
             lake: Lake = DELTA) -> pa.Table:
    """``table`` with every column converted to its field in ``schema`` (columns absent from ``schema`` pass)."""
    names = type_names or {}
    if lsn_column is not None and lsn_column not in table.column_names:
        lsn_column = None
    if lsn_column is not None:
        table = table.combine_chunks()  # every column chunked like the LSNs
    columns, fields = [], []
    for field in table.schema:
        target = schema.field(field.name).type if field.name in schema.names else field.type
        col = table.column(field.name)
        lsns: list[pa.Array | None] = list(table.column(lsn_column).chunks) if lsn_column else [None] * col.num_chunks
        chunks = [convert_array(c, target, field.name, where, names.get(field.name), lsns=lsn, lake=lake)
                  for c, lsn in zip(col.chunks, lsns, strict=True)]
        columns.append(pa.chunked_array(chunks, type=target))
        fields.append(pa.field(field.name, target, nullable=True))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


# Folded exactness notes (``apply/notes.py``): struct<_pgl_value, _pgl_note[, _pgl_element_notes]>.
_VALUE, _NOTE, _ELEMENT_NOTES = "_pgl_value", "_pgl_note", "_pgl_element_notes"


def _is_folded(dtype: pa.DataType) -> bool:
    return pa.types.is_struct(dtype) and [f.name for f in dtype] in ([_VALUE, _NOTE], [_VALUE, _NOTE, _ELEMENT_NOTES])


def _noted(arr: pa.StructArray) -> pa.Array:
    """Per row: whether the folded value carries a note (whole value, or any element)."""
    children = arr.flatten()
    noted = pc.is_valid(children[1])
    if len(children) > 2:
        elements = children[2]
        flat_valid = pc.is_valid(pc.list_flatten(elements))
        counts = pc.list_value_length(elements)
        has = np.zeros(len(arr), dtype=bool)
        if len(flat_valid):
            parents = pc.list_parent_indices(elements).to_numpy(zero_copy_only=False)
            np.logical_or.at(has, parents, flat_valid.to_numpy(zero_copy_only=False))
        noted = pc.or_(noted, pc.and_(pc.fill_null(pc.greater(counts, 0), False), pa.array(has)))
    return pc.fill_null(noted, False)


def _unwrap(arr: pa.Array, path: str, where: str, lsns: pa.Array | None, lake: Lake = DELTA) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):  # pragma: no cover - callers pass chunks
        raise TypeError("pass chunks")
    if _is_folded(arr.type):
        noted = _noted(arr)
        if pc.any(noted).as_py():
            at = "" if lsns is None else f" (change at LSN {pc.min(lsns.filter(noted)).as_py():X})"
            raise lake.error(
                f"{where}: column {path}{at} holds a value no {lake.name} type holds exactly (numeric NaN, or an "
                "array that is multi-dimensional or does not start at 1); see docs/types.md")
        return _unwrap(arr.flatten()[0], path, where, lsns, lake)
    if pa.types.is_struct(arr.type) and any(_has_folded(f.type) for f in arr.type):
        children = [_unwrap(c, f"{path}.{f.name}", where, lsns, lake)
                    for c, f in zip(arr.flatten(), arr.type, strict=True)]
        mask = pc.is_null(arr) if arr.null_count else None
        return pa.StructArray.from_arrays(children, names=[f.name for f in arr.type], mask=mask)
    return arr


def _has_folded(dtype: pa.DataType) -> bool:
    return _is_folded(dtype) or (pa.types.is_struct(dtype) and any(_has_folded(f.type) for f in dtype))


def unwrap_notes(table: pa.Table, where: str, lsn_column: str | None = None, lake: Lake = DELTA) -> pa.Table:
    """``table`` with every folded value (top level or inside a struct such as an old image) replaced by the
    value itself; a value whose note survives into the rows written raises ``DeltaValueError`` naming the
    column and the first LSN (never the value). Notes of changes netted away do not matter."""
    if not any(_has_folded(f.type) for f in table.schema):
        return table
    table = table.combine_chunks()
    lsns = table.column(lsn_column).chunk(0) if lsn_column and table.num_rows else None
    for i, f in enumerate(table.schema):
        if _has_folded(f.type):
            col = table.column(i)
            arr = col.chunk(0) if col.num_chunks else pa.array([], f.type)
            out = _unwrap(arr, f.name, where, lsns, lake)
            table = table.set_column(i, f.name, out)
    return table
