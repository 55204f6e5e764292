"""COPY text-format lines built in the JVM: one string per row, so Python executors only stream bytes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeGuard

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NumericType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from airflow_provider_pglogical.apply.notes import ELEMENT_NOTES, NOTE, VALUE, is_folded
from airflow_provider_pglogical.apply.sparkenv import SESSION_CONF as SESSION_CONF  # the COPY text's session
from airflow_provider_pglogical.apply.sparkenv import quoted
from airflow_provider_pglogical.apply.sparktypes import TimeType
from airflow_provider_pglogical.apply.staged_schema import known
from airflow_provider_pglogical.apply.targets.postgres import arrowtext
from airflow_provider_pglogical.apply.targets.postgres.target_types import (
    ARRAY,
    COMPOSITE,
    MONEY,
    MULTIRANGE,
    PG_LSN,
    PgType,
)
from airflow_provider_pglogical.apply.targets.postgres.temporal_text import (
    date_text,
    interval_text,
    is_interval,
    is_timetz,
    time_text,
    timestamp_text,
    timetz_text,
)

NULL = "\\N"
RANGE_FIELDS = ("lower", "upper", "lower_inclusive", "upper_inclusive", "empty")  # decoding/values/ranges.py
# Characters for which record_out / range_out quote a field / bound (so do we; an empty text is
# quoted too). \s is C's isspace. Quoting more than needed is harmless, less is not.
RECORD_SPECIAL = r'[",()\\\s]'
RANGE_SPECIAL = r'[",()\[\]\\\s]'


def _replace_all(c: Column, pairs: list[tuple[str, str]]) -> Column:
    for pattern, replacement in pairs:  # Java regex patterns / replacement strings
        c = F.regexp_replace(c, pattern, replacement)
    return c


def copy_escape(c: Column) -> Column:
    """COPY text escapes: backslash first, then the delimiter and line breaks (literal replaces, no regex)."""
    for search, replacement in (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r")):
        c = F.replace(c, F.lit(search), F.lit(replacement))
    return c


def may_need_escape(dtype: DataType) -> bool:
    """Whether the text of a value of ``dtype`` can hold a backslash, tab or line break.

    Numbers, booleans and the dates, times and intervals printed here are digits and punctuation
    only; bytea's hex starts with a backslash, and text, and anything with text inside (arrays,
    composites, ranges, noted values), may hold anything.
    """
    return not isinstance(dtype, (BooleanType, DateType, TimestampType, TimestampNTZType, TimeType,
                                  NumericType)) and not is_interval(dtype) and not is_timetz(dtype)


def _array_quote(c: Column) -> Column:
    return F.concat(F.lit('"'), _replace_all(c, [(r"\\", r"\\\\"), ('"', r'\\"')]), F.lit('"'))


def _quote_if(text: Column, special: str) -> Column:
    """record_out / range_out quoting: inside double quotes with ``"`` and ``\\`` doubled, when the
    text is empty (bare nothing reads as NULL / unbounded) or holds a ``special`` character."""
    quoted = F.concat(F.lit('"'), F.regexp_replace(text, r'(["\\])', "$1$1"), F.lit('"'))
    return F.when((text == "") | text.rlike(special), quoted).otherwise(text)


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


def is_range(dtype: DataType) -> TypeGuard[StructType]:
    """The staged range struct: both bounds of the subtype, then the three flags."""
    return (isinstance(dtype, StructType) and tuple(dtype.fieldNames()) == RANGE_FIELDS
            and dtype["lower"].dataType == dtype["upper"].dataType
            and all(isinstance(dtype[f].dataType, BooleanType) for f in RANGE_FIELDS[2:]))


def _multirange_of(dtype: DataType, pgtype: PgType | None, in_array: bool = False) -> StructType | None:
    """The range type of a ``list<range>`` that is a multirange rather than an array of ranges, else None:
    the target type says.

    Without it: inside an array yes (staged arrays are flat, so a list there is an array of
    multiranges), elsewhere no.
    """
    if not isinstance(dtype, ArrayType):
        return None
    element = dtype.elementType
    if is_range(element) and (pgtype.kind == MULTIRANGE if pgtype is not None else in_array):
        return element
    return None


def array_text(c: Column, dtype: ArrayType, shape: Column | None = None,
               element_notes: Column | None = None, pgtype: PgType | None = None) -> Column:
    """An array literal. Staged arrays are flat; ``shape`` (the array's note, e.g. '[0:1][-2:0]')
    restores dimensions and lower bounds, ``element_notes`` (aligned with the elements) replaces null
    elements whose value only a note holds (numeric NaN). Every element is quoted, composites and
    ranges too: ``{"(1,x)",NULL}``."""
    element = dtype.elementType
    element_type = pgtype.element if pgtype is not None and pgtype.kind == ARRAY else None
    multirange = _multirange_of(element, element_type, in_array=True)
    nested = isinstance(element, ArrayType) and multirange is None  # lists from other sources: multi-dimensional

    def one(x: Column, i: Column) -> Column:
        text = multirange_text(x, multirange) if multirange is not None else pg_text(x, element, element_type)
        text = F.when(x.isNull(), F.lit("NULL")).otherwise(text if nested else _array_quote(text))
        if element_notes is None:
            return text
        return F.coalesce(_array_quote(F.try_element_at(element_notes, i + 1)), text)

    items = F.transform(c, one)
    flat = F.concat(F.lit("{"), F.concat_ws(",", items), F.lit("}"))
    if shape is None:
        return flat
    return F.when(shape.isNull(), flat).otherwise(F.concat(shape, F.lit("="), _nest(items, shape)))


def composite_text(c: Column, dtype: StructType, pgtype: PgType | None = None) -> Column:
    """record_in text '(f1,f2,…)': a NULL field is nothing between commas, an empty string '""'.
    Fields (nested composites, arrays, ranges) get the same conversion as columns."""
    def field(name: str, ftype: DataType) -> Column:
        text = pg_text(c.getField(name), ftype, pgtype.field(name) if pgtype is not None else None)
        return F.coalesce(_quote_if(text, RECORD_SPECIAL), F.lit(""))

    return F.concat(F.lit("("), F.concat_ws(",", *[field(f.name, f.dataType) for f in dtype.fields]), F.lit(")"))


def range_text(c: Column, dtype: StructType) -> Column:
    """range_in text: 'empty', or '[lower,upper)' with brackets from the inclusive flags and an
    unbounded (null) side as nothing: '(,5]'. An infinite bound is a value: '[2024-01-01,infinity)'."""
    subtype = dtype["lower"].dataType
    lower, upper = c.getField("lower"), c.getField("upper")

    def bound(x: Column) -> Column:
        return F.coalesce(_quote_if(pg_text(x, subtype), RANGE_SPECIAL), F.lit(""))

    opening = F.when(c.getField("lower_inclusive") & lower.isNotNull(), F.lit("[")).otherwise(F.lit("("))
    closing = F.when(c.getField("upper_inclusive") & upper.isNotNull(), F.lit("]")).otherwise(F.lit(")"))
    finite = F.concat(opening, bound(lower), F.lit(","), bound(upper), closing)
    return F.when(c.getField("empty"), F.lit("empty")).otherwise(finite)


def multirange_text(c: Column, range_type: StructType) -> Column:
    """multirange_in text '{[1,3),[5,7)}' ('{}' when empty): bare ranges, which it needs (no array quoting).
    ``range_type`` is the element type of the staged ``list<range>`` (``_multirange_of``)."""
    ranges = F.transform(c, lambda r: range_text(r, range_type))
    return F.concat(F.lit("{"), F.array_join(ranges, ","), F.lit("}"))


def _noted_text(c: Column, dtype: StructType, pgtype: PgType | None) -> Column:
    """A value folded with its exactness notes (apply/notes.py): the note wins where there is one.

    Multiranges are folded like every list but never have notes of their own (no dimensions, no
    null elements); notes inside their bounds (``mr[0].lower``) are not folded at all.
    """
    value, value_type = c.getField(VALUE), dtype[VALUE].dataType
    if (range_type := _multirange_of(value_type, pgtype)) is not None:
        return F.when(value.isNotNull(), multirange_text(value, range_type))
    if isinstance(value_type, ArrayType):
        elements = c.getField(ELEMENT_NOTES) if ELEMENT_NOTES in dtype.fieldNames() else None
        return F.when(value.isNotNull(), array_text(value, value_type, c.getField(NOTE), elements, pgtype))
    return F.coalesce(c.getField(NOTE), pg_text(value, value_type, pgtype))


def pg_text(c: Column, dtype: DataType, pgtype: PgType | None = None) -> Column:
    """PostgreSQL input-function text of a value (before COPY escaping); null for null.

    Doubles use Java's shortest round-trip form, which float8in reads (NaN, Infinity, 1.0E-5);
    decimals are plain. Dates, times and intervals: ``temporal_text``. ``pgtype`` is the target
    type tree (``target_types``) for what the staged type leaves open.
    """
    if isinstance(dtype, StringType):
        return c
    # format_string / concat_ws / literal branches would turn a null into text ('null', '{}')
    return F.when(c.isNotNull(), _text(c, dtype, pgtype))


def _text(c: Column, dtype: DataType, pgtype: PgType | None) -> Column:
    if isinstance(dtype, BinaryType):
        return F.concat(F.lit("\\x"), F.lower(F.hex(c)))
    if isinstance(dtype, DateType):
        return date_text(c)
    if isinstance(dtype, (TimestampType, TimestampNTZType)):
        return timestamp_text(c, with_tz=isinstance(dtype, TimestampType))
    if isinstance(dtype, TimeType):
        return time_text(c)
    if (range_type := _multirange_of(dtype, pgtype)) is not None:
        return multirange_text(c, range_type)
    if isinstance(dtype, ArrayType):
        return array_text(c, dtype, pgtype=pgtype)
    if is_folded(dtype):
        return _noted_text(c, dtype, pgtype)
    if isinstance(dtype, StructType):
        if pgtype is not None and pgtype.kind == COMPOSITE:  # even one whose fields look like an interval
            return composite_text(c, dtype, pgtype)
        if is_interval(dtype):
            return interval_text(c)
        if is_timetz(dtype):
            return timetz_text(c)
        if is_range(dtype):
            return range_text(c, dtype)
        return composite_text(c, dtype, pgtype)  # the only other staged struct
    if isinstance(dtype, MapType):
        raise TypeError("no PostgreSQL text for a map column (staging never writes one; json/jsonb are text)")
    if pgtype is not None and pgtype.kind == MONEY:
        # minor units → '1234.56': cash_in reads the decimal point (2 fraction digits, as with
        # lc_monetary C/en_US; the decoder assumes the same). Decimal arithmetic keeps it exact.
        return (c.cast("decimal(20,0)") / F.lit(100)).cast("decimal(21,2)").cast("string")
    if pgtype is not None and pgtype.kind == PG_LSN:
        # decimal(20,0) (Spark's uint64) → pg_lsn_in's 'X/X': the high and low 32 bits in hex (the high part is
        # an exact quotient, so the decimal division cannot round it)
        low = F.pmod(c, F.lit(2**32))
        return F.concat(F.hex(((c - low) / F.lit(2**32)).cast("bigint")), F.lit("/"), F.hex(low.cast("bigint")))
    return c.cast("string")


def copy_lines(df: DataFrame, types: Mapping[str, PgType] | None = None, *, terminated: bool = False) -> DataFrame:
    """One column ``line``: the row as a COPY text line (no trailing newline), NULL as ``\\N``.

    ``types``: target type trees of the non-scalar columns (``target_types.describe_types``);
    without one, a ``list<range>`` column is written as an array of ranges, not a multirange.
    The session needs ``SESSION_CONF`` (UTC, and TIME columns readable at all). ``terminated`` ends each
    line with its newline, so a partition's lines are the COPY data as they are (``copy.copy_partitions``).
    """
    types = types or {}
    def field(f: StructField) -> Column:
        text = pg_text(F.col(quoted(f.name)), f.dataType, types.get(f.name))
        # money is numeric-typed but only ever digits too; a composite that looks like an interval is still
        # escaped (its target type says composite), which is merely redundant
        return F.coalesce(copy_escape(text) if may_need_escape(f.dataType) or f.name in types else text, F.lit(NULL))

    fields = [field(f) for f in df.schema.fields]
    line = F.concat_ws("\t", *fields)
    return df.select((F.concat(line, F.lit("\n")) if terminated else line).alias("line"))


def _arrow_kind(dtype: DataType) -> str | None:
    """The ``arrowtext`` kind that prints a value of ``dtype`` exactly, or None (the JVM prints it): the Spark-typed
    twin of ``arrowtext.arrow_kind``, within ``arrowtext.ARROW_MAX_DECIMAL_SCALE``."""
    if isinstance(dtype, StringType):
        return arrowtext.TEXT
    if isinstance(dtype, (BooleanType, ByteType, ShortType, IntegerType, LongType)):
        return arrowtext.PLAIN
    if isinstance(dtype, DecimalType) and dtype.scale <= arrowtext.ARROW_MAX_DECIMAL_SCALE:
        return arrowtext.PLAIN
    if isinstance(dtype, (FloatType, DoubleType)):
        return arrowtext.FLOAT
    if isinstance(dtype, TimestampType):
        return arrowtext.TIMESTAMPTZ
    if isinstance(dtype, (DateType, TimestampNTZType)):
        return arrowtext.TEMPORAL
    return None


def _beyond_arrow(c: Column, dtype: DataType) -> Column:
    """True for the dates/timestamps Arrow cannot print as PostgreSQL does (BC, past 9999, ±infinity): integer
    comparisons of the raw value, as ``temporal_text`` reads it."""
    if isinstance(dtype, DateType):
        raw, (low, high) = F.unix_date(c), arrowtext.ARROW_DAYS
    else:
        micros = F.unix_micros(c if isinstance(dtype, TimestampType) else c.cast("timestamp"))
        raw, (low, high) = micros, arrowtext.ARROW_MICROS
    return (raw < F.lit(low)) | (raw > F.lit(high))


def copy_columns(df: DataFrame, types: Mapping[str, PgType] | None = None) -> tuple[DataFrame, list[arrowtext.Field]]:
    """The frame the ``mapInArrow`` COPY writers read, and how ``arrowtext.line_bytes`` prints each field.

    The same lines as ``copy_lines(df, types, terminated=True)``: plain scalar columns (``_arrow_kind``) go
    to Python typed and are printed there; the rest as the JVM's finished field text. A date/timestamp
    column also carries the JVM text of its values beyond Arrow's range, a decimal folded with its note
    (``apply/notes.py``) its value and note as two columns.
    """
    types = types or {}
    columns: list[Column] = []
    # The selection's schema, built alongside (``staged_schema.known``): the writers' ``mapInArrow`` asks for its
    # columns, which would otherwise be one more analysis of the whole plan on a Spark Connect server.
    schema = StructType()
    fields: list[arrowtext.Field] = []
    for i, f in enumerate(df.schema.fields):
        c, dtype, name = F.col(quoted(f.name)), f.dataType, f"f{i}"
        note: tuple[Column, DataType] | None = None
        if is_folded(dtype) and len(dtype.fields) == 2 and isinstance(dtype[VALUE].dataType, DecimalType):
            c, note, dtype = c.getField(VALUE), (c.getField(NOTE), dtype[NOTE].dataType), dtype[VALUE].dataType
        kind = _arrow_kind(dtype) if f.name not in types else None
        if kind is None:
            text = pg_text(F.col(quoted(f.name)), f.dataType, types.get(f.name))
            escaped = copy_escape(text) if may_need_escape(f.dataType) or f.name in types else text
            columns.append(F.coalesce(escaped, F.lit(NULL)).alias(name))
            schema.add(name, StringType())
            fields.append(arrowtext.Field(arrowtext.LINE, name))
            continue
        columns.append(c.alias(name))
        schema.add(name, dtype)
        fallback = note_name = None
        if kind in (arrowtext.TEMPORAL, arrowtext.TIMESTAMPTZ):
            fallback = f"{name}_fallback"
            columns.append(F.when(_beyond_arrow(c, dtype), pg_text(c, dtype)).alias(fallback))
            schema.add(fallback, StringType())
        if note is not None:
            note_name = f"{name}_note"
            columns.append(note[0].alias(note_name))
            schema.add(note_name, note[1])
        fields.append(arrowtext.Field(kind, name, fallback, note_name))
    return known(df.select(*columns), schema), fields
