"""COPY text printed from Arrow in Python (``arrowtext``) against the JVM's (``copy_lines``), the reference.

Every column type ``copy_columns`` sends to Python as typed Arrow, nulls, the special floats, dates and timestamps
beyond Arrow's range (BC, five-digit years, ±infinity: the JVM's fallback text), text with every COPY escape
character and non-ASCII, a decimal folded with its NaN note; plus a column the JVM still prints (scale 7) in the
same line. Byte-identical text for everything but floats; for floats (shortest round-trip form in both, but
``1e+20`` against ``1.0E20``) the same *stored values*: both texts are COPYed into PostgreSQL and read back.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from decimal import Decimal

import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply.notes import NOTE, VALUE
from airflow_provider_pglogical.apply.targets.postgres import arrowtext
from airflow_provider_pglogical.apply.targets.postgres.copytext import SESSION_CONF, copy_columns, copy_lines
from airflow_provider_pglogical.exceptions import ApplyError
from scripts.harness.pgserver import make_database
from tests.support.sparkconf import session_conf

I16, I32, I64 = 2**15, 2**31, 2**63
DAY_US = 86_400_000_000
# PostgreSQL's ranges in Unix days / µs (4714-11-24 BC …); a staged timestamp stops at int64 (docs/types.md)
PG_DAYS = (-2_440_588, 2_145_042_905)
PG_US = (-210_866_803_200_000_000, I64 - 2)
ARROW_DAYS = (-719_162, 2_932_896)  # 0001-01-01 … 9999-12-31

# column → (Arrow type, PostgreSQL type); "nn" is the note of the folded decimal "n"
COLUMNS = {
    "i2": (pa.int16(), "int2"), "i4": (pa.int32(), "int4"), "i8": (pa.int64(), "int8"), "b": (pa.bool_(), "bool"),
    "t": (pa.string(), "text"), "d0": (pa.decimal128(5, 0), "numeric(5,0)"),
    "d2": (pa.decimal128(12, 2), "numeric(12,2)"), "d6": (pa.decimal128(38, 6), "numeric(38,6)"),
    "d7": (pa.decimal128(20, 7), "numeric(20,7)"), "f8": (pa.float64(), "float8"), "f4": (pa.float32(), "float4"),
    "dt": (pa.date32(), "date"), "ts": (pa.timestamp("us"), "timestamp"),
    "tz": (pa.timestamp("us", tz="UTC"), "timestamptz"), "n": (pa.decimal128(10, 2), "numeric(10,2)"),
    "nn": (pa.string(), None),
}
FLOATS = ("f8", "f4")
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
               | st.sampled_from("\\\t\n\r\"',{}() éß中😀\x01\x7f"), max_size=12)


def _decimal(precision: int, scale: int) -> st.SearchStrategy[Decimal]:
    bound = 10**precision - 1
    # from a string: exact at any precision (scaleb would round to the context's 28 digits)
    return st.integers(-bound, bound).map(lambda n: Decimal(f"{n}E-{scale}"))


def _days() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(*ARROW_DAYS), st.integers(*PG_DAYS),
                     st.sampled_from([I32 - 1, -I32, ARROW_DAYS[0] - 1, ARROW_DAYS[1] + 1, *ARROW_DAYS, 0]))


def _micros() -> st.SearchStrategy[int]:
    inside = (ARROW_DAYS[0] * DAY_US, (ARROW_DAYS[1] + 1) * DAY_US - 1)
    return st.one_of(st.integers(*inside), st.integers(*PG_US),
                     st.sampled_from([I64 - 1, -I64, inside[0] - 1, inside[1] + 1, *inside, 0, -1]))


def _nullable(s: st.SearchStrategy) -> st.SearchStrategy:
    return st.none() | s


ROW = st.fixed_dictionaries({
    "i2": _nullable(st.integers(-I16, I16 - 1)), "i4": _nullable(st.integers(-I32, I32 - 1)),
    "i8": _nullable(st.integers(-I64, I64 - 1)), "b": _nullable(st.booleans()), "t": _nullable(TEXT),
    "d0": _nullable(_decimal(5, 0)), "d2": _nullable(_decimal(12, 2)), "d6": _nullable(_decimal(38, 6)),
    "d7": _nullable(_decimal(20, 7)), "f8": _nullable(st.floats()), "f4": _nullable(st.floats(width=32)),
    "dt": _nullable(_days()), "ts": _nullable(_micros()), "tz": _nullable(_micros()),
    "n": _nullable(_decimal(10, 2)), "nn": st.none() | st.just("NaN"),
})
EDGES = [
    {"f8": v, "f4": v} for v in (float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, 1e20, 1e-5, 0.1)
] + [
    {"t": "a\\b\tc\nd\re\\\\N", "dt": I32 - 1, "ts": I64 - 1, "tz": -I64, "n": None, "nn": "NaN"},
    {"t": "", "dt": -I32, "ts": -I64, "tz": I64 - 1, "d6": Decimal("-0.000001"), "d7": Decimal("1E-7")},
    {"t": "\\N", "dt": ARROW_DAYS[0] - 1, "ts": ARROW_DAYS[0] * DAY_US - 1, "tz": (ARROW_DAYS[1] + 1) * DAY_US,
     "d2": Decimal("0.00"), "i8": -I64},
]


@pytest.fixture(scope="module")
def spark(spark):
    """The apply tests' session with SESSION_CONF for this module, put back as found after it (later modules on the
    worker share the session)."""
    with session_conf(spark, SESSION_CONF):
        yield spark


@pytest.fixture(scope="module")
def target(pg_server) -> Iterator[psycopg2.extensions.connection]:
    conn = psycopg2.connect(pg_server.dsn(make_database(pg_server)))
    with conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'")
    yield conn
    conn.close()


def _frame(spark, tmp_path, rows: list[dict]):
    """The rows staged as Parquet by pyarrow, read by Spark; ``n`` folded with its note like ``fold_notes`` does."""
    rows = [{"id": i, **r} for i, r in enumerate(rows)]
    columns = {"id": pa.array([r["id"] for r in rows], pa.int32())}
    for name, (atype, _pg) in COLUMNS.items():
        values = [r.get(name) for r in rows]
        columns[name] = (pa.array(values, pa.int32()).cast(atype) if atype in (pa.date32(),)
                         else pa.array(values, pa.int64()).cast(atype) if pa.types.is_timestamp(atype)
                         else pa.array(values, atype))
    path = str(tmp_path / f"t{len(list(tmp_path.iterdir()))}.parquet")
    pq.write_table(pa.table(columns), path)
    df = spark.read.parquet(path).coalesce(1)
    return df.select("id", *[F.struct(F.col("n").alias(VALUE), F.col("nn").alias(NOTE)).alias(c) if c == "n"
                             else F.col(c) for c in COLUMNS if c != "nn"])


def _arrow_lines(df) -> bytes:
    text_frame, fields = copy_columns(df)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for data, _rows in arrowtext.line_batches(fields)(batches):
            yield pa.RecordBatch.from_pydict({"data": [data]}, schema=pa.schema([("data", pa.binary())]))

    return b"".join(bytes(r.data) for r in text_frame.mapInArrow(run, "data binary").collect())


def _stored(conn, lines: bytes, table: str) -> list[tuple]:
    names = ["id", *[c for c in COLUMNS if c != "nn"]]
    types = ["int4", *[COLUMNS[c][1] for c in names[1:]]]
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        cur.execute(f"CREATE TABLE {table} ({', '.join(f'{n} {t}' for n, t in zip(names, types, strict=True))})")
        cur.copy_expert(f"COPY {table} FROM STDIN", io.BytesIO(lines))
        cur.execute(f"SELECT {', '.join(f'{n}::text' for n in names)} FROM {table} ORDER BY id")
        got = cur.fetchall()
    conn.commit()
    return got


# Each row's line is printed on its own (the batch matters only through its columns' null masks and
# slicing, which EDGES and the single-row example pin down), so what the property covers grows with the rows
# compared, while each example costs two Spark jobs (~2.5 s): 8 examples of 8-40 rows (about 16 on average,
# ~130 random rows in all) compare as many rows as 20 examples of 1-25 (about 6 on average) did, in half the time.
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROW, min_size=8, max_size=40))
@example(rows=EDGES)
@example(rows=[EDGES[-1]])
def test_arrow_text_equals_the_jvm_text_and_stores_the_same_values(spark, target, tmp_path, rows):
    df = _frame(spark, tmp_path, rows)
    jvm = "".join(r.line + "\n" for r in copy_lines(df).collect()).encode()
    arrow = _arrow_lines(df)
    floats = [i for i, c in enumerate(df.columns) if c in FLOATS]

    def cells(data: bytes) -> list[list[bytes]]:
        return [[v for i, v in enumerate(line.split(b"\t")) if i not in floats] for line in data.splitlines()]

    assert cells(arrow) == cells(jvm)  # byte-identical, floats aside
    assert _stored(target, arrow, "from_arrow") == _stored(target, jvm, "from_jvm")


def test_plan_sends_plain_scalars_typed_and_the_rest_as_jvm_text(spark, tmp_path):
    df = _frame(spark, tmp_path, [{}])
    _text_frame, fields = copy_columns(df.withColumn("arr", F.array(F.lit(1))))
    kinds = {f.column: f.kind for f in fields}
    names = dict(zip([f.column for f in fields], df.columns + ["arr"], strict=True))
    assert {names[c]: k for c, k in kinds.items()} == {
        "id": "plain", "i2": "plain", "i4": "plain", "i8": "plain", "b": "plain", "t": "text", "d0": "plain",
        "d2": "plain", "d6": "plain", "d7": "line", "f8": "float", "f4": "float", "dt": "temporal",
        "ts": "temporal", "tz": "timestamptz", "n": "plain", "arr": "line"}
    assert [f.note is not None for f in fields].count(True) == 1  # the folded decimal
    assert {names[f.column] for f in fields if f.fallback} == {"dt", "ts", "tz"}


def test_floats_use_postgresql_spellings_of_the_specials():
    batch = pa.RecordBatch.from_pydict({"f": pa.array([float("nan"), float("inf"), -float("inf"), -0.0, None, 1e20])})
    assert arrowtext.line_bytes(batch, [arrowtext.Field(arrowtext.FLOAT, "f")]) == \
        b"NaN\nInfinity\n-Infinity\n-0\n\\N\n1e+20\n"


def test_text_is_escaped_and_lines_joined_by_tabs():
    batch = pa.RecordBatch.from_pydict({"t": pa.array(["a\\b\tc\nd\re", None, "é"]), "l": pa.array(["x", "\\N", "y"])})
    fields = [arrowtext.Field(arrowtext.TEXT, "t"), arrowtext.Field(arrowtext.LINE, "l")]
    assert arrowtext.line_bytes(batch, fields) == "a\\\\b\\tc\\nd\\re\tx\n\\N\t\\N\né\ty\n".encode()
    assert arrowtext.line_bytes(batch.slice(1, 2), fields) == "\\N\t\\N\né\ty\n".encode()


def test_a_null_line_is_an_error_not_a_dropped_row():
    batch = pa.RecordBatch.from_pydict({"l": pa.array(["x", None], pa.string())})
    with pytest.raises(ApplyError, match="COPY line is null"):
        arrowtext.line_bytes(batch, [arrowtext.Field(arrowtext.LINE, "l")])


ARRAYS = {  # column → (staged Arrow list type, PostgreSQL array type)
    "at": (pa.list_(pa.string()), "text[]"), "ai": (pa.list_(pa.int32()), "int4[]"),
    "ad": (pa.list_(pa.decimal128(12, 2)), "numeric(12,2)[]"), "ab": (pa.list_(pa.bool_()), "bool[]"),
}
ARRAY_ROW = st.fixed_dictionaries({
    "at": _nullable(st.lists(_nullable(TEXT | st.sampled_from(["NULL", "null", "", " ", "{}", '"'])), max_size=5)),
    "ai": _nullable(st.lists(_nullable(st.integers(-I32, I32 - 1)), max_size=5)),
    "ad": _nullable(st.lists(_nullable(_decimal(12, 2)), max_size=5)),
    "ab": _nullable(st.lists(_nullable(st.booleans()), max_size=5)),
})


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ARRAY_ROW, min_size=8, max_size=40))
@example(rows=[{"at": ['a"b\\c', None, "NULL", "", "x\ty\nz"], "ai": [], "ad": None, "ab": [None]}] * 8)
def test_arrays_printed_from_arrow_equal_the_jvm_text(spark, target, tmp_path, rows):
    """``arrowtext.ARRAY_TEXT`` / ``ARRAY_PLAIN`` (the snapshot direct path's arrays) against ``copy_lines``:
    byte-identical lines, and array_in stores what the rows hold."""
    table = pa.table({"id": pa.array(range(len(rows)), pa.int32()),
                      **{c: pa.array([r[c] for r in rows], t) for c, (t, _pg) in ARRAYS.items()}})
    path = str(tmp_path / f"a{len(list(tmp_path.iterdir()))}.parquet")
    pq.write_table(table, path)
    jvm = "".join(r.line + "\n" for r in copy_lines(spark.read.parquet(path).coalesce(1)).collect()).encode()
    fields = [arrowtext.Field(arrowtext.PLAIN, "id"),
              *[arrowtext.Field(arrowtext.arrow_kind(t, arrays=True) or "", c) for c, (t, _pg) in ARRAYS.items()]]
    assert [f.kind for f in fields[1:]] == [arrowtext.ARRAY_TEXT, *[arrowtext.ARRAY_PLAIN] * 3]
    batch = pq.read_table(path).combine_chunks().to_batches()[0]
    arrow = b"".join(arrowtext.line_bytes(batch.slice(i, 5), fields) for i in range(0, len(rows), 5))  # slices
    assert arrow == jvm
    with target.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS arrays")
        cur.execute("CREATE TABLE arrays (id int4, " + ", ".join(f"{c} {pg}" for c, (_t, pg) in ARRAYS.items()) + ")")
        cur.copy_expert("COPY arrays FROM STDIN", io.BytesIO(arrow))
        cur.execute("SELECT " + ", ".join(ARRAYS) + " FROM arrays ORDER BY id")
        stored = [dict(zip(ARRAYS, r, strict=True)) for r in cur.fetchall()]
    target.commit()
    assert stored == [{c: r[c] for c in ARRAYS} for r in rows]


def test_arrays_of_other_element_types_are_not_printed_from_arrow():
    for t in (pa.list_(pa.float64()), pa.list_(pa.date32()), pa.list_(pa.binary()), pa.list_(pa.list_(pa.int32())),
              pa.list_(pa.struct([("a", pa.int32())]))):
        assert arrowtext.arrow_kind(t, arrays=True) is None
    assert arrowtext.arrow_kind(pa.list_(pa.string())) is None  # only where a caller asks for arrays


def test_session_conf_is_set_inside_and_put_back_as_found_after(spark):
    """What the module's ``spark`` does with SESSION_CONF: a key the session had gets its value back, one it did not
    have is unset again."""
    had, absent = "spark.sql.shuffle.partitions", "spark.pglogical.tests.absent"
    before = spark.conf.get(had)
    assert spark.conf.get(absent, None) is None
    with session_conf(spark, {had: str(int(before) + 1), absent: "x"}):
        assert (spark.conf.get(had), spark.conf.get(absent)) == (str(int(before) + 1), "x")
    assert (spark.conf.get(had), spark.conf.get(absent, None)) == (before, None)
