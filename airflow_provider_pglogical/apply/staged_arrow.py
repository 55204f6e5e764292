"""Staged Arrow → the Arrow types Spark holds, exactly as Spark's own Parquet reader gives them.

The apply reads a staged file either with Spark's Parquet reader (local staging) or with pyarrow on the
driver and hands the table to ``createDataFrame`` (object stores, ``batches.read_changes``). Both must give
every target the same Spark types and values, so the driver route converts what Spark cannot take the way
the Parquet reader does:

* unsigned integers (``pg_lsn`` is ``uint64``) → the next wider signed type, ``uint64`` → ``decimal(20,0)``
  (Arrow-to-Spark conversion has no unsigned types at all);
* ``decimal256`` (``numeric(p,s)`` with 39 ≤ p ≤ 76) → ``string``, the value's exact text with its ``s``
  fraction digits, as ``numeric_out`` prints it (``0.0000000000``, never exponent notation). Spark decimals
  stop at 38 digits, so its Parquet reader cannot read such a file at all: a local file holding one is read
  through the driver too (``spark_readable``). A NaN (staged as a null plus the note ``"NaN"``, docs/types.md)
  becomes the text ``NaN``: a string column is not folded with its notes (``apply/notes.py``), so the value
  itself must carry it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

NAN = "NaN"
_UNSIGNED = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64(), pa.uint64(): pa.decimal128(20, 0)}
_MAX_DECIMAL = 38  # Spark's (and Delta's) widest decimal
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def spark_type(dtype: pa.DataType) -> pa.DataType:
    """The Arrow type Spark's Parquet reader gives a staged column of ``dtype`` (itself where Spark takes it)."""
    if dtype in _UNSIGNED:
        return _UNSIGNED[dtype]
    if pa.types.is_decimal256(dtype):
        return pa.string() if dtype.precision > _MAX_DECIMAL else pa.decimal128(dtype.precision, dtype.scale)
    if pa.types.is_struct(dtype):
        return pa.struct([f.with_type(spark_type(f.type)) for f in dtype])
    if pa.types.is_map(dtype):
        return pa.map_(spark_type(dtype.key_type), dtype.item_field.with_type(spark_type(dtype.item_type)))
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return pa.list_(dtype.value_field.with_type(spark_type(dtype.value_type)))
    return dtype


def castable_from_text(dtype: pa.DataType, text: str) -> bool:
    """Whether Spark's cast of PostgreSQL's text output ``text`` (a fast default) to a column Spark holds as
    ``dtype`` (``spark_type`` of the staged type) is exact: integers, floats, decimals but NaN, strings, booleans,
    ISO dates. The one list both the Spark reader's defaults and the in-process union's (``versions``) follow."""
    if pa.types.is_decimal(dtype):
        return text.lower() != "nan"
    if (pa.types.is_signed_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_string(dtype)
            or pa.types.is_large_string(dtype) or pa.types.is_boolean(dtype)):
        return True
    return pa.types.is_date32(dtype) and _ISO_DATE.fullmatch(text) is not None


def spark_readable(schema: pa.Schema) -> bool:
    """Whether Spark's Parquet reader reads a file of ``schema`` (no decimal wider than 38 digits anywhere)."""
    return not any(holds(f.type, _wide_decimal) for f in schema)


def _wide_decimal(dtype: pa.DataType) -> bool:
    return pa.types.is_decimal256(dtype) and bool(dtype.precision > _MAX_DECIMAL)


def holds(dtype: pa.DataType, leaf: Callable[[pa.DataType], bool]) -> bool:
    """Whether ``leaf`` holds for ``dtype`` or a type nested in it (struct fields, map keys and items, elements)."""
    if leaf(dtype):
        return True
    if pa.types.is_struct(dtype):
        return any(holds(f.type, leaf) for f in dtype)
    if pa.types.is_map(dtype):
        return holds(dtype.key_type, leaf) or holds(dtype.item_type, leaf)
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return holds(dtype.value_type, leaf)
    return False


def decimal_text(arr: pa.Array) -> pa.Array:
    """A decimal array as exact text with exactly ``scale`` fraction digits (Arrow's own cast switches to
    exponent notation for small values and prints zero as ``0E-10``)."""
    dtype = arr.type
    scale = dtype.scale
    if scale < 0:  # never staged (PostgreSQL's negative scales are staged as text); a plain integer otherwise
        return pc.cast(pc.cast(arr, pa.decimal256(76, 0)), pa.string())
    # The unscaled integer: the same buffers read with scale 0, which Arrow prints as plain digits.
    whole = pa.decimal256(76, 0) if pa.types.is_decimal256(dtype) else pa.decimal128(38, 0)
    digits = pc.cast(pa.Array.from_buffers(whole, len(arr), arr.buffers(), arr.null_count, arr.offset), pa.string())
    if scale == 0:
        return digits
    negative = pc.starts_with(digits, "-")
    magnitude = pc.utf8_lpad(pc.utf8_ltrim(digits, "-"), scale + 1, "0")
    text = pc.binary_join_element_wise(pc.utf8_slice_codeunits(magnitude, 0, -scale),
                                       pc.utf8_slice_codeunits(magnitude, -scale), ".")
    return pc.if_else(negative, pc.binary_join_element_wise("-", text, ""), text)


def _convert(arr: pa.Array) -> pa.Array:
    """``arr`` as ``spark_type(arr.type)``."""
    dtype = arr.type
    target = spark_type(dtype)
    if target == dtype:
        return arr
    if dtype in _UNSIGNED or (pa.types.is_decimal256(dtype) and target != pa.string()):
        return pc.cast(arr, target)
    if pa.types.is_decimal256(dtype):
        return decimal_text(arr)
    mask = pc.is_null(arr) if arr.null_count else None
    if isinstance(arr, pa.StructArray):
        return pa.StructArray.from_arrays([_convert(arr.field(i)) for i in range(dtype.num_fields)],
                                          fields=list(target), mask=mask)
    if isinstance(arr, pa.MapArray):
        offsets = pc.subtract(arr.offsets, arr.offsets[0]) if arr.offset else arr.offsets
        return pa.MapArray.from_arrays(offsets, _convert(arr.keys), _convert(arr.items), type=target, mask=mask)
    if isinstance(arr, pa.LargeListArray):
        arr = pc.cast(arr, pa.list_(dtype.value_field))
    if isinstance(arr, pa.ListArray):
        offsets = pc.subtract(arr.offsets, arr.offsets[0]) if arr.offset else arr.offsets
        return pa.ListArray.from_arrays(offsets, _convert(arr.flatten()), type=target, mask=mask)
    raise TypeError(f"no Spark conversion for {dtype}")  # pragma: no cover - spark_type changes nothing else


def _image(arr: pa.StructArray, notes: pa.Array | None) -> pa.Array:
    """A row image (``old``/``new``) converted field by field; a wide decimal field noted ``NaN`` reads ``NaN``."""
    children = []
    for i, f in enumerate(arr.type):
        child = _convert(arr.field(i))
        if notes is not None and _wide_decimal(f.type):
            noted = pc.fill_null(pc.equal(pc.map_lookup(notes, pa.scalar(f.name), "first"), NAN), False)
            child = pc.if_else(noted, NAN, child)
        children.append(child)
    mask = pc.is_null(arr) if arr.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(spark_type(arr.type)), mask=mask)


def to_spark_arrow(table: pa.Table) -> pa.Table:
    """A staged table with every column as ``spark_type`` gives it (the driver route into Spark)."""
    if all(spark_type(f.type) == f.type for f in table.schema):
        return table
    table = table.combine_chunks()
    columns = []
    for field in table.schema:
        col = table.column(field.name)
        arr = col.chunk(0) if col.num_chunks else pa.array([], field.type)
        notes_name = f"{field.name}_value_notes"
        if field.name in ("old", "new") and isinstance(arr, pa.StructArray):
            notes = None
            if notes_name in table.column_names and table.column(notes_name).num_chunks:
                notes = table.column(notes_name).chunk(0)
            columns.append(_image(arr, notes))
        else:
            columns.append(_convert(arr))
    return pa.Table.from_arrays(columns, schema=pa.schema(
        [f.with_type(spark_type(f.type)) for f in table.schema], metadata=table.schema.metadata))
