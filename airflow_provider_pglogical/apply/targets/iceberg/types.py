"""Staged Arrow values → Iceberg types, exactly, or a typed error (docs/iceberg.md, "Types").

Iceberg and Delta hold the same value domains (booleans, 32/64-bit ints, float/double, ``decimal(p ≤ 38, s)``,
string, binary, date, µs timestamps with and without zone, lists, structs, maps), so the mapping is the Delta
target's (``delta/types.py``: ``time`` as µs since midnight, ``pg_lsn`` as ``decimal(20,0)``, ``money`` as
``decimal(19,2)``, ``numeric`` wider than 38 digits as its exact text, ±infinity and noted values refused),
with one difference: Iceberg has no 8- or 16-bit integers, so ``smallint`` (and ``uint8``) land in ``int``.
Errors are ``IcebergValueError``, naming table, column and LSN, never a value.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from airflow_provider_pglogical.apply.targets.delta.types import Lake, delta_type, to_delta, unwrap_notes
from airflow_provider_pglogical.exceptions import ApplyError

DOC_PREFIX = "pglogical.type="  # an Iceberg field's doc: the source column's PostgreSQL type (format_type text)


class IcebergValueError(ApplyError):
    """A staged value that no Iceberg type holds exactly (the message names the column, never the value)."""


ICEBERG = Lake("Iceberg", IcebergValueError)


def _iceberg(dtype: pa.DataType) -> pa.DataType:
    if pa.types.is_int8(dtype) or pa.types.is_int16(dtype):
        return pa.int32()
    if pa.types.is_struct(dtype):
        return pa.struct([pa.field(f.name, _iceberg(f.type), nullable=True) for f in dtype])
    if pa.types.is_list(dtype):
        return pa.list_(pa.field("element", _iceberg(dtype.value_type), nullable=True))
    if pa.types.is_map(dtype):
        return pa.map_(_iceberg(dtype.key_type), _iceberg(dtype.item_type))
    return dtype


def iceberg_type(dtype: pa.DataType, type_name: str | None = None) -> pa.DataType:
    """The Iceberg-writable Arrow type of a staged (or Spark-read) Arrow type (``type_name``: the source SQL type)."""
    return _iceberg(delta_type(dtype, type_name))


def iceberg_schema(schema: pa.Schema, type_names: Mapping[str, str | None] | None = None) -> pa.Schema:
    names = type_names or {}
    return pa.schema([pa.field(f.name, iceberg_type(f.type, names.get(f.name)), nullable=True) for f in schema])


def documented(schema: pa.Schema, type_names: Mapping[str, str | None]) -> pa.Schema:
    """``schema`` with each column's source type as its Iceberg doc (what ``describe`` and schema changes read)."""
    return pa.schema([f.with_metadata({"doc": DOC_PREFIX + str(type_names[f.name])}) if type_names.get(f.name) else f
                      for f in schema])


def source_type(doc: str | None) -> str | None:
    return doc.removeprefix(DOC_PREFIX) if doc and doc.startswith(DOC_PREFIX) else None


def to_iceberg(table: pa.Table, schema: pa.Schema, where: str, type_names: Mapping[str, str | None] | None = None,
               lsn_column: str | None = None) -> pa.Table:
    """``table`` with every column converted to its field in ``schema`` (from ``iceberg_schema``)."""
    return to_delta(table, schema, where, type_names, lsn_column=lsn_column, lake=ICEBERG)


def unwrap(table: pa.Table, where: str, lsn_column: str | None = None) -> pa.Table:
    """Folded exactness notes unwrapped; a noted value in a written row raises ``IcebergValueError``."""
    return unwrap_notes(table, where, lsn_column, lake=ICEBERG)
