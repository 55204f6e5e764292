"""Composites, ranges and multiranges → PostgreSQL input text, built by Spark expressions (no database).

Values are staged by the decoder's own codecs from PostgreSQL text, written with pyarrow and read
back with Spark, as in a real batch; tests/integration/test_apply_composites.py checks the same
texts against PostgreSQL itself.
"""

from __future__ import annotations

import random
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply.notes import ELEMENT_NOTES, NOTE, VALUE
from airflow_provider_pglogical.apply.targets.postgres.copytext import SESSION_CONF, copy_lines, pg_text
from airflow_provider_pglogical.apply.targets.postgres.target_types import (
    ARRAY,
    COMPOSITE,
    MULTIRANGE,
    RANGE,
    SCALAR,
    PgType,
)
from airflow_provider_pglogical.decoding.values import oids
from airflow_provider_pglogical.decoding.values.arrays import ArrayCodec
from airflow_provider_pglogical.decoding.values.composite import CompositeCodec
from airflow_provider_pglogical.decoding.values.ranges import RangeCodec
from airflow_provider_pglogical.decoding.values.registry import codec_for
from airflow_provider_pglogical.decoding.values.text import TextCodec
from tests.support.sparkconf import session_conf

INT4RANGE = codec_for(oids.INT4RANGE, -1, None)
NUMRANGE = codec_for(oids.NUMRANGE, -1, None)
DATERANGE = codec_for(oids.DATERANGE, -1, None)
TSTZRANGE = codec_for(oids.TSTZRANGE, -1, None)
INT4MULTIRANGE = codec_for(oids.INT4MULTIRANGE, -1, None)
INT4RANGE_ARRAY = ArrayCodec(INT4RANGE)
TEXTRANGE = RangeCodec("textrange", TextCodec())
TEXT = TextCodec()
MOOD = TextCodec("mood")  # enums are staged as their label
ADDR = CompositeCodec("addr", [("street", TEXT), ("city", TEXT), ("mood", MOOD),
                               ("amount", codec_for(oids.NUMERIC, (10 << 16 | 2) + 4, None))])
PERSON = CompositeCodec("person", [("name", TEXT), ("home", ADDR), ("tags", ArrayCodec(TEXT)), ("span", INT4RANGE),
                                   ("slots", INT4MULTIRANGE), ("stays", ArrayCodec(DATERANGE)),
                                   ("born", codec_for(oids.DATE, -1, None))])
PERSON_TYPE = PgType(COMPOSITE, fields=(("home", PgType(COMPOSITE)), ("tags", PgType(ARRAY, PgType(SCALAR))),
                                        ("span", PgType(RANGE)), ("slots", PgType(MULTIRANGE)),
                                        ("stays", PgType(ARRAY, PgType(RANGE)))))


def _unescape_copy(cell: str) -> str | None:
    """A COPY text cell back to the value text (the escapes copytext writes)."""
    if cell == "\\N":
        return None
    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r"}.get(m.group(1), m.group(1)), cell)


@pytest.fixture
def staged(spark, tmp_path):
    """``{column: (codec, [PostgreSQL text or None])}`` staged like the decoder does → the value texts per column."""
    def read(columns: dict, types: dict | None = None, raw: bool = False) -> dict[str, list[str | None]]:
        arrays = {name: pa.array([None if t is None else codec.arrow_from_text(t, {}, name) for t in texts],
                                 codec.arrow_type) for name, (codec, texts) in columns.items()}
        path = str(tmp_path / f"t{len(list(tmp_path.iterdir()))}.parquet")
        pq.write_table(pa.table(arrays), path)
        rows = [r.line.split("\t") for r in copy_lines(spark.read.parquet(path), types).collect()]
        return {name: [cell if raw else _unescape_copy(cell) for cell in column]
                for name, column in zip(columns, zip(*rows, strict=True), strict=True)}

    with session_conf(spark, SESSION_CONF):  # put back after the test: the session is the worker's
        yield read


def test_ranges_empty_unbounded_inclusive_and_infinite_bounds(staged):
    got = staged({
        "r4": (INT4RANGE, ["empty", "[1,5)", "(,5]", "[3,)", "(,)", None]),
        "rn": (NUMRANGE, ["[1.50,NaN)", "(-0.000001,1000]", "empty", "(,)", "[0,0]", None]),
        "rd": (DATERANGE, ["[0044-03-15 BC,infinity)", "(-infinity,infinity)", "[2024-02-29,10000-01-01)",
                           "empty", None, "(,2024-01-01)"]),
        "rtz": (TSTZRANGE, ['["2024-01-02 03:04:05.678901+00",infinity]', "(-infinity,)", None, "empty",
                            '("0044-03-15 12:00:00+00 BC","2024-01-01 00:00:00+05:45")', "(,)"]),
    })
    assert got["r4"] == ["empty", "[1,5)", "(,5]", "[3,)", "(,)", None]
    assert got["rn"] == ["[1.50,NaN)", "(-0.000001,1000]", "empty", "(,)", "[0,0]", None]
    assert got["rd"] == ['["0044-03-15 BC",infinity)', "(-infinity,infinity)", "[2024-02-29,10000-01-01)", "empty",
                         None, "(,2024-01-01)"]
    assert got["rtz"] == ['["2024-01-02 03:04:05.678901+00:00",infinity]', "(-infinity,)", None, "empty",
                          '("0044-03-15 12:00:00.000000+00:00 BC","2023-12-31 18:15:00.000000+00:00")', "(,)"]


def test_range_bounds_are_quoted_like_range_out(staged):
    texts = ['["",a)', r'("a,b","q\"uote"]', r'["back\\slash"," sp")', r'["(p","x]")', '[plain,"[b"]', "(,\"\")"]
    assert staged({"tr": (TEXTRANGE, texts)})["tr"] == [
        '["",a)', '("a,b","q""uote"]', r'["back\\slash"," sp")', '["(p","x]")', '[plain,"[b"]', '(,"")']


def test_multiranges_need_the_target_type_to_differ_from_arrays_of_ranges(staged):
    columns = {"mr": (INT4MULTIRANGE, ["{[1,3),[5,7)}", "{}", "{(,0),[9,)}", None]),
               "ar": (INT4RANGE_ARRAY, ['{"[1,3)",empty,NULL}', "{}", None, '{"(,)"}'])}
    got = staged(columns, {"mr": PgType(MULTIRANGE), "ar": PgType(ARRAY, PgType(RANGE))})
    assert got["mr"] == ["{[1,3),[5,7)}", "{}", "{(,0),[9,)}", None]
    assert got["ar"] == ['{"[1,3)","empty",NULL}', "{}", None, '{"(,)"}']
    # both are list<range struct>: without the target's word, a column is taken for an array
    assert staged(columns)["mr"][0] == '{"[1,3)","[5,7)"}'


def test_composites_quote_like_record_out_and_keep_null_and_empty_fields(staged):
    got = staged({"a": (ADDR, [
        r'("a,b ""q"" \\ (x)"," spaced ",happy,12.50)', '(,"",sad,)', '(,,,)', None, '("tab\there",NULL,"ok",1)'])})
    assert got["a"] == [r'("a,b ""q"" \\ (x)"," spaced ",happy,12.50)', '(,"",sad,)', "(,,,)", None,
                        '("tab\there",NULL,ok,1.00)']


def test_composite_text_is_copy_escaped_as_a_whole(staged):
    got = staged({"a": (ADDR, ['("tab\there\\\\","new\nline",,)'])}, raw=True)
    assert got["a"] == [r'("tab\there\\\\","new\nline",,)']


def test_nested_composites_arrays_ranges_and_multiranges_inside_a_composite(staged):
    person = ('(nm,"(""x,y"",,ok,1)","{a,""b c"",NULL}","[1,5)","{[1,3),[7,9)}",'
              '"{""[2024-01-01,2024-02-01)"",empty}","0044-03-15 BC")')
    got = staged({"p": (PERSON, [person, "(,,{},empty,{},{},)"])}, {"p": PERSON_TYPE})
    assert got["p"] == [
        '(nm,"(""x,y"",,ok,1.00)","{""a"",""b c"",NULL}","[1,5)","{[1,3),[7,9)}",'
        '"{""[2024-01-01,2024-02-01)"",""empty""}","0044-03-15 BC")',
        "(,,{},empty,{},{},)"]


def test_arrays_of_composites_quote_each_element(staged):
    got = staged({"aa": (ArrayCodec(ADDR), ['{"(s1,\\"c\\\\\\"1\\",ok,1)",NULL,"(\\"\\",,,)"}', "{}"])})
    assert got["aa"] == [r'{"(s1,\"c\"\"1\",ok,1.00)",NULL,"(\"\",,,)"}', "{}"]


def test_folded_arrays_of_composites_keep_their_shape_and_folded_multiranges_stay_bare(spark, tmp_path):
    path = str(tmp_path / "folded.parquet")
    addrs = pa.array([[ADDR.arrow_from_text("(a,b,sad,1)", {}, "x"), ADDR.arrow_from_text("(c,,ok,2)", {}, "x")]],
                     ArrayCodec(ADDR).arrow_type)
    ranges = pa.array([INT4MULTIRANGE.arrow_from_text("{[1,3),[5,7)}", {}, "x")], INT4MULTIRANGE.arrow_type)
    pq.write_table(pa.table({"aa": addrs, "mr": ranges}), path)
    df = spark.read.parquet(path)

    def fold(name: str, note: str | None):  # what apply/notes.py fold_notes makes of a list column
        return F.struct(F.col(name).alias(VALUE), F.lit(note).cast("string").alias(NOTE),
                        F.lit(None).cast("array<string>").alias(ELEMENT_NOTES)).alias(name)

    (line,) = copy_lines(df.select(fold("aa", "[0:1]"), fold("mr", None)), {"mr": PgType(MULTIRANGE)}).collect()
    assert line.line.split("\t") == ['[0:1]={"(a,b,sad,1.00)","(c,,ok,2.00)"}', "{[1,3),[5,7)}"]


def test_a_composite_that_looks_like_an_interval_follows_the_target_type(spark):
    df = spark.createDataFrame([((1, 2, 3),)], "c struct<months:int, days:int, microseconds:bigint>")
    assert copy_lines(df).collect()[0].line == "+1 mons +2 days +0:00:00.000003"
    assert copy_lines(df, {"c": PgType(COMPOSITE)}).collect()[0].line == "(1,2,3)"


def test_maps_are_refused_rather_than_written_as_json(spark):
    with pytest.raises(TypeError):
        copy_lines(spark.createDataFrame([({"a": "b"},)], "m map<string,string>"))


def test_random_texts_survive_composite_and_range_quoting(spark, tmp_path):
    """Whatever the characters, the decoder's record/range parsers read our text back to the same values."""
    rng = random.Random(7)
    alphabet = ' ,()[]{}"\\\t\nabcNULé'
    words = ["", "NULL", "empty", " ", '"', "\\"] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(300)]
    pair = CompositeCodec("pair", [("x", TEXT), ("y", TEXT)])
    rows = [(w, words[(i * 7 + 3) % len(words)]) for i, w in enumerate(words)]
    bounds = [tuple(sorted(r)) for r in rows]  # a range needs lower <= upper (code point order, as with "C")
    table = pa.table({
        "p": pa.array([{"x": x, "y": y} for x, y in rows], pair.arrow_type),
        "r": pa.array([{"lower": lo, "upper": up, "lower_inclusive": True, "upper_inclusive": False, "empty": False}
                       for lo, up in bounds], TEXTRANGE.arrow_type)})
    path = str(tmp_path / "random.parquet")
    pq.write_table(table, path)
    df = spark.read.parquet(path)
    got = df.select(*[pg_text(F.col(f.name), f.dataType).alias(f.name) for f in df.schema.fields]).collect()
    assert [tuple(pair.from_text(r.p).values()) for r in got] == rows
    assert [(rg.lower, rg.upper) for rg in (TEXTRANGE.from_text(r.r) for r in got)] == bounds
