"""COPY text-format lines built in the JVM: one string per row, so Python executors only stream bytes."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DateType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    TimeType,
)

from airflow_provider_pglogical.apply.notes import ELEMENT_NOTES, NOTE, VALUE, is_folded
from airflow_provider_pglogical.apply.targets.temporal_text import (
    date_text,
    interval_text,
    is_interval,
    is_timetz,
    time_text,
    timestamp_text,
    timetz_text,
)

NULL = "\\N"
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",  # timestamp without time zone → micros
    "spark.sql.timeType.enabled": "true",  # Spark 4 refuses to read time64 Parquet columns without it
}


def _replace_all(c: Column, pairs: list[tuple[str, str]]) -> Column:
    for pattern, replacement in pairs:  # Java regex patterns / replacement strings
        c = F.regexp_replace(c, pattern, replacement)
    return c


def copy_escape(c: Column) -> Column:
    """COPY text escapes: backslash first, then the delimiter and line breaks."""
    return _replace_all(c, [(r"\\", r"\\\\"), ("\t", r"\\t"), ("\n", r"\\n"), ("\r", r"\\r")])


def _array_quote(c: Column) -> Column:
    return F.concat(F.lit('"'), _replace_all(c, [(r"\\", r"\\\\"), ('"', r'\\"')]), F.lit('"'))


def _div(a: Column, b: Column) -> Column:
    return F.call_function("div", a, b)


def _nest(items: Column, shape: Column) -> Column:
    """Flat element texts (row-major) → nested braces, dimensions from a '[lb:ub][lb:ub]…' shape note."""
    lower = F.regexp_extract_all(shape, F.lit(r"\[(-?\d+):"), 1)
    upper = F.regexp_extract_all(shape, F.lit(r":(-?\d+)\]"), 1)
    sizes = F.zip_with(upper, lower, lambda u, lo: u.cast("int") - lo.cast("int") + 1)
    inner_first = F.reverse(F.slice(sizes, F.lit(2), F.size(sizes) - 1))  # every dimension but the first

    def group(acc: Column, size: Column) -> Column:
        return F.transform(F.sequence(F.lit(0), _div(F.size(acc), size) - 1), lambda k: F.concat(
            F.lit("{"), F.array_join(F.slice(acc, k * size + 1, size), ","), F.lit("}")))

    return F.concat(F.lit("{"), F.array_join(F.aggregate(inner_first, items, group), ","), F.lit("}"))


def array_text(c: Column, dtype: ArrayType, shape: Column | None = None,
               element_notes: Column | None = None) -> Column:
    """An array literal. Staged arrays are flat; ``shape`` (the array's note, e.g. '[0:1][-2:0]')
    restores dimensions and lower bounds, ``element_notes`` (aligned with the elements) replaces null
    elements whose value only a note holds (numeric NaN)."""
    element = dtype.elementType
    nested = isinstance(element, ArrayType)  # nested lists from other sources: multi-dimensional, bounds 1

    def one(x: Column, i: Column) -> Column:
        text = pg_text(x, element)
        text = F.when(x.isNull(), F.lit("NULL")).otherwise(text if nested else _array_quote(text))
        if element_notes is None:
            return text
        return F.coalesce(_array_quote(F.try_element_at(element_notes, i + 1)), text)

    items = F.transform(c, one)
    flat = F.concat(F.lit("{"), F.concat_ws(",", items), F.lit("}"))
    if shape is None:
        return flat
    return F.when(shape.isNull(), flat).otherwise(F.concat(shape, F.lit("="), _nest(items, shape)))


def _noted_text(c: Column, dtype: StructType) -> Column:
    """A value folded with its exactness notes (apply/notes.py): the note wins where there is one."""
    value, value_type = c.getField(VALUE), dtype[VALUE].dataType
    if isinstance(value_type, ArrayType):
        elements = c.getField(ELEMENT_NOTES) if ELEMENT_NOTES in dtype.fieldNames() else None
        return F.when(value.isNotNull(), array_text(value, value_type, c.getField(NOTE), elements))
    return F.coalesce(c.getField(NOTE), pg_text(value, value_type))


def pg_text(c: Column, dtype: DataType) -> Column:
    """PostgreSQL input-function text of a value (before COPY escaping); null for null.

    Doubles use Java's shortest round-trip form, which float8in reads (NaN, Infinity, 1.0E-5);
    decimals are plain. Dates, times and intervals: ``temporal_text``.
    """
    if isinstance(dtype, StringType):
        return c
    # format_string / concat_ws / literal branches would turn a null into text ('null', '{}')
    return F.when(c.isNotNull(), _text(c, dtype))


def _text(c: Column, dtype: DataType) -> Column:
    if isinstance(dtype, BinaryType):
        return F.concat(F.lit("\\x"), F.lower(F.hex(c)))
    if isinstance(dtype, DateType):
        return date_text(c)
    if isinstance(dtype, (TimestampType, TimestampNTZType)):
        return timestamp_text(c, with_tz=isinstance(dtype, TimestampType))
    if isinstance(dtype, TimeType):
        return time_text(c)
    if isinstance(dtype, ArrayType):
        return array_text(c, dtype)
    if is_folded(dtype):
        return _noted_text(c, dtype)
    if is_interval(dtype):
        return interval_text(c)
    if is_timetz(dtype):
        return timetz_text(c)
    if isinstance(dtype, (StructType, MapType)):
        return F.to_json(c)  # json/jsonb targets
    return c.cast("string")


def copy_lines(df: DataFrame) -> DataFrame:
    """One column ``line``: the row as a COPY text line (no trailing newline), NULL as ``\\N``.

    The session needs ``SESSION_CONF`` (UTC, and TIME columns readable at all).
    """
    fields = [F.coalesce(copy_escape(pg_text(F.col(f.name), f.dataType)), F.lit(NULL)) for f in df.schema.fields]
    return df.select(F.concat_ws("\t", *fields).alias("line"))
