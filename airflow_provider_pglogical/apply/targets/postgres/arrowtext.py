"""COPY text lines built from typed Arrow columns in the executors' Python workers (pyarrow compute, vectorised C++).

Profiling (docs/performance.md) put 85–90 % of the PostgreSQL target's stage CPU in the JVM, building the
COPY text of every value with Column expressions and then converting those strings to Arrow for the
``mapInArrow`` COPY writers. For the plain scalar types whose PostgreSQL input text pyarrow prints
exactly, the JVM now hands the *typed* values to Arrow and this module prints them:

* integers and booleans (``true``/``false``), ``decimal128`` of scale ≤ 6 (Arrow switches to exponent
  notation below 1E-6 — numeric_in reads that too, but the JVM text is plain, so larger scales stay there),
* float4/float8 in their shortest round-trip form (``1e+20``, ``0.00001``, ``nan``, ``inf``, ``-0``;
  float4in/float8in read them back to the same value — not the JVM's bytes, the same stored values),
* text (escaped here: backslash, tab, LF, CR),
* dates and timestamps with or without time zone between 0001-01-01 and 9999-12-31 (ISO, ``+00:00``
  appended for timestamptz: byte-identical to ``temporal_text``); any other date/timestamp (BC, five-digit
  years, ±infinity) comes with its JVM text in a *fallback* column that is null everywhere else.

Everything else (arrays, composites, ranges, intervals, times, bytea, money, noted arrays, any column with
a target type tree) arrives as finished JVM text (``copytext.copy_lines``' field text: escaped, ``\\N``).
``copytext.copy_columns`` builds the frame and the plan this module reads; tests/unit/apply/
test_arrowtext.py proves both paths give the same stored values in PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.exceptions import ApplyError

NULL = "\\N"

# Kinds of a plan column (what the JVM sent and how it is printed here)
LINE = "line"  # finished JVM text: escaped, NULL already \N
PLAIN = "plain"  # integers, booleans, decimals of scale ≤ 6: Arrow's cast to string is PostgreSQL's text
FLOAT = "float"  # float4 / float8: shortest round-trip text
TEXT = "text"  # strings: COPY-escaped here
TIMESTAMPTZ = "timestamptz"  # timestamp[us, tz=UTC]: printed without the zone, then '+00:00'
TEMPORAL = "temporal"  # date32, timestamp[us]: Arrow's ISO text
# flat lists (1-D arrays from 1, as staged without a shape note) of TEXT / PLAIN elements: the array literal as
# ``copytext.array_text`` prints it, every element double-quoted, ``"`` and ``\`` backslashed, NULL bare
ARRAY_TEXT = "array_text"
ARRAY_PLAIN = "array_plain"

# What Arrow prints exactly, for both paths that hand typed values to this module (``copytext.copy_columns`` on
# Spark's types, ``arrownet`` on the staged Arrow types): dates and timestamps in years 1–9999 (Unix days / µs),
# decimals up to scale 6.
ARROW_DAYS = (-719_162, 2_932_896)  # 0001-01-01, 9999-12-31
ARROW_MICROS = (ARROW_DAYS[0] * 86_400_000_000, (ARROW_DAYS[1] + 1) * 86_400_000_000 - 1)
ARROW_MAX_DECIMAL_SCALE = 6

_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"))  # backslash first

def arrow_kind(dtype: pa.DataType, *, arrays: bool = False) -> str | None:
    """The kind of a staged Arrow type (as ``copytext._arrow_kind`` decides on Spark's), or None: not printed here.
    ``arrays``: also flat lists of text or plain scalars (``ARRAY_TEXT`` / ``ARRAY_PLAIN``), printed as
    ``copytext.array_text`` prints an array without notes."""
    if arrays and (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)):
        element = arrow_kind(dtype.value_type)
        return {TEXT: ARRAY_TEXT, PLAIN: ARRAY_PLAIN}.get(element or "")
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return TEXT
    if pa.types.is_boolean(dtype) or pa.types.is_signed_integer(dtype):
        return PLAIN
    if pa.types.is_decimal128(dtype) and dtype.scale <= ARROW_MAX_DECIMAL_SCALE:
        return PLAIN
    if pa.types.is_float32(dtype) or pa.types.is_float64(dtype):
        return FLOAT
    if pa.types.is_timestamp(dtype) and dtype.unit == "us":
        return TIMESTAMPTZ if dtype.tz is not None else TEMPORAL
    if pa.types.is_date32(dtype):
        return TEMPORAL
    return None


@dataclass(frozen=True)
class Field:
    """One COPY field: which batch columns it is printed from.

    ``column``: the typed value (or, for ``LINE``, the JVM's finished text). ``fallback``: for ``TEMPORAL`` and
    ``TIMESTAMPTZ``, a column holding the JVM text of the values Arrow cannot print (null elsewhere). ``note``:
    for a decimal folded with its exactness note (``apply/notes.py``), the note, which wins where present.
    """

    kind: str
    column: str
    fallback: str | None = None
    note: str | None = None


def _as_string(arr: pa.Array) -> pa.Array:
    """Spark may send large_string; the join needs one string type."""
    return arr if arr.type == pa.string() else arr.cast(pa.string())


def copy_escape(text: pa.Array) -> pa.Array:
    """COPY text-format escapes of a string array (nulls stay null)."""
    for search, replacement in _ESCAPES:
        text = pc.replace_substring(text, search, replacement)
    return text


def array_literal(arr: pa.Array, kind: str) -> pa.Array:
    """``{"e1","e2",NULL}`` (``{}`` when empty, null for a null array) of a flat list array: the JVM's
    ``copytext.array_text`` for arrays without shape or element notes, byte for byte (array_in reads it back)."""
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(arr) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    elements = arr.flatten()  # the elements of the valid lists, honouring a slice's offset
    if kind == ARRAY_TEXT:
        text = _as_string(elements)
        for search, replacement in (("\\", "\\\\"), ('"', '\\"')):  # backslash first
            text = pc.replace_substring(text, search, replacement)
    elif kind == ARRAY_PLAIN:
        text = pc.cast(elements, pa.string())
    else:
        raise ValueError(f"unknown array kind {kind!r}")
    quoted = pc.fill_null(pc.binary_join_element_wise('"', text, '"', ""), "NULL")
    lists = pa.ListArray.from_arrays(pa.array(offsets), quoted, mask=pc.is_null(arr))
    return pc.binary_join_element_wise("{", pc.binary_join(lists, ","), "}", "")


def _float_text(arr: pa.Array) -> pa.Array:
    text = pc.cast(arr, pa.string())
    if pc.all(pc.is_finite(arr)).as_py() is False:  # PostgreSQL's own spelling of the specials (12+ reads both)
        for search, replacement in (("nan", "NaN"), ("inf", "Infinity")):
            text = pc.replace_substring(text, search, replacement)
    return text


def field_text(batch: pa.RecordBatch, field: Field) -> pa.Array:
    """The field's COPY text (escaped, null → ``\\N``) for every row of ``batch``."""
    arr = batch.column(field.column)
    if field.kind == LINE:
        return _as_string(arr)  # the JVM's coalesce made it non-null
    if field.kind == TEXT:
        text = copy_escape(_as_string(arr))
    elif field.kind == FLOAT:
        text = _float_text(arr)
    elif field.kind == TIMESTAMPTZ:
        text = pc.binary_join_element_wise(pc.cast(arr.cast(pa.timestamp("us")), pa.string()), "+00:00", "")
    elif field.kind in (PLAIN, TEMPORAL):
        text = pc.cast(arr, pa.string())
    elif field.kind in (ARRAY_TEXT, ARRAY_PLAIN):
        text = copy_escape(array_literal(arr, field.kind))
    else:
        raise ValueError(f"unknown COPY field kind {field.kind!r}")
    if field.fallback is not None:  # BC, years past 9999, ±infinity: the JVM's text (never needs escaping)
        fallback = _as_string(batch.column(field.fallback))
        if fallback.null_count < len(fallback):
            text = pc.if_else(pc.is_valid(fallback), fallback, text)
    if field.note is not None:
        note = _as_string(batch.column(field.note))
        if note.null_count < len(note):
            text = pc.if_else(pc.is_valid(note), copy_escape(note), text)
    return pc.fill_null(_as_string(text), NULL)


def line_bytes(batch: pa.RecordBatch, fields: Sequence[Field]) -> bytes:
    """The batch's rows as newline-terminated COPY text lines, back to back (the COPY data as it is sent)."""
    if batch.num_rows == 0:
        return b""
    texts = [field_text(batch, f) for f in fields]
    lines = pc.binary_join_element_wise(*texts, "\t") if len(texts) > 1 else texts[0]
    lines = pc.binary_join_element_wise(lines, "\n", "")
    if lines.null_count:  # every field was filled with \N: a null line would be a row silently dropped
        raise ApplyError("a COPY line is null (arrowtext fills every null field)")
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)  # string offsets: every field was cast to string
    first, last = int(offsets[lines.offset]), int(offsets[lines.offset + len(lines)])
    return memoryview(lines.buffers()[2])[first:last].tobytes()


def line_batches(fields: Sequence[Field]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[tuple[bytes, int]]]:
    """Typed Arrow batches (``copytext.copy_columns``' frame) → ``(bytes of whole lines, line count)`` chunks."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[bytes, int]]:
        for batch in batches:
            yield line_bytes(batch, fields), batch.num_rows

    return run
