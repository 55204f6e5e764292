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
)

NULL = "\\N"
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)


def _replace_all(c: Column, pairs: list[tuple[str, str]]) -> Column:
    for pattern, replacement in pairs:  # Java regex patterns / replacement strings
        c = F.regexp_replace(c, pattern, replacement)
    return c


def copy_escape(c: Column) -> Column:
    """COPY text escapes: backslash first, then the delimiter and line breaks."""
    return _replace_all(c, [(r"\\", r"\\\\"), ("\t", r"\\t"), ("\n", r"\\n"), ("\r", r"\\r")])


def _array_quote(c: Column) -> Column:
    return F.concat(F.lit('"'), _replace_all(c, [(r"\\", r"\\\\"), ('"', r'\\"')]), F.lit('"'))


def pg_text(c: Column, dtype: DataType) -> Column:
    """PostgreSQL input-function text of a non-null value (before COPY escaping).

    Dates and timestamps must already be text (``temporal_as_text``). Doubles use Java's
    shortest round-trip form, which float8in reads (NaN, Infinity, 1.0E-5); decimals are plain.
    """
    if isinstance(dtype, StringType):
        return c
    if isinstance(dtype, BinaryType):
        return F.concat(F.lit("\\x"), F.lower(F.hex(c)))
    if isinstance(dtype, ArrayType):
        element = dtype.elementType
        nested = isinstance(element, ArrayType)

        def one(x: Column) -> Column:
            text = pg_text(x, element)
            return F.when(x.isNull(), F.lit("NULL")).otherwise(text if nested else _array_quote(text))

        return F.concat(F.lit("{"), F.concat_ws(",", F.transform(c, one)), F.lit("}"))
    if isinstance(dtype, (StructType, MapType)):
        return F.to_json(c)  # json/jsonb targets
    return c.cast("string")


def temporal_as_text(df: DataFrame) -> DataFrame:
    """Dates and timestamps as PostgreSQL text, in the JVM (session time zone must be UTC).

    Python would see naive local datetimes and cannot hold PostgreSQL's ±infinity, which staging
    keeps as the int32/int64 extremes; those become 'infinity' / '-infinity'.
    """
    cols = []
    for f in df.schema.fields:
        c = F.col(f.name)
        if isinstance(f.dataType, DateType):
            days = F.unix_date(c)
            text = F.when(days == INT32_MAX, "infinity").when(days == INT32_MIN, "-infinity").otherwise(c.cast("string"))
        elif isinstance(f.dataType, (TimestampType, TimestampNTZType)):
            micros = F.unix_micros(c.cast("timestamp"))
            pattern = "yyyy-MM-dd HH:mm:ss.SSSSSS" + ("xxx" if isinstance(f.dataType, TimestampType) else "")
            text = (F.when(micros == INT64_MAX, "infinity").when(micros == INT64_MIN, "-infinity")
                    .otherwise(F.date_format(c, pattern)))
        else:
            cols.append(c)
            continue
        cols.append(text.alias(f.name))
    return df.select(*cols)


def copy_lines(df: DataFrame) -> DataFrame:
    """One column ``line``: the row as a COPY text line (no trailing newline), NULL as ``\\N``."""
    df = temporal_as_text(df)
    fields = [F.coalesce(copy_escape(pg_text(F.col(f.name), f.dataType)), F.lit(NULL)) for f in df.schema.fields]
    return df.select(F.concat_ws("\t", *fields).alias("line"))
