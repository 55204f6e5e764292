"""Row filters over whole columns (``apply/filter_columns.py``) against the per-row reference (``filter_eval``) and
Spark.

* On random filters of the covered grammar over random images (null images too), the columnar evaluation gives
  the reference's answer row by row — TRUE, FALSE and NULL — and raises ``NotCovered`` exactly where the
  reference does (an integer result out of range, a zero divisor, a non-ASCII case mapping, a value beyond the
  Basic Multilingual Plane under LIKE); many examples, no JVM.
* LIKE and ILIKE on patterns and values of regular-expression metacharacters and whitespace: the same answers.
* Integer, float and text predicates do compile over columns (else the comparisons above would compare the
  reference with itself); empty images, in one piece or in no chunks, have no answers.
* On fewer examples, the columnar answers are Spark's ``F.expr`` of the same text.
* The constructs it is not exact on (decimals, dates, timestamps) are evaluated per row, never approximated.
"""

from __future__ import annotations

import math

import hypothesis
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply import filter_columns, filter_eval
from airflow_provider_pglogical.row_filter import canonical
from tests.support.filter_compare import WHOLE_STAGE_CODEGEN, Compare, Covered, compared_together
from tests.unit.apply.test_filter_eval import FLOATS, ROW, SCHEMA, _filters, _ints, _predicates

FIELDS = {f.name: f.type for f in SCHEMA}
SPARK_CONF = WHOLE_STAGE_CODEGEN  # over the apply conftest's settings: Spark as the apply runs it is the reference


def _image(rows: list[dict], nulls: list[bool]) -> pa.StructArray:
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    return pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], names=table.column_names,
                                      mask=pa.array(nulls, pa.bool_()))


def _answers(evaluate, image: pa.StructArray) -> list[bool | None] | str:
    try:
        return list(evaluate(image))
    except filter_eval.NotCovered:
        return "NotCovered"


# Single predicates and arithmetic over numbers, where the columnar kernels differ most from Python's operators
# (truncated %, checked overflow, NaN and -0.0, integers rounded to double).
SIGNED = st.sampled_from(["i16", "i32", "i64", "-7", "7", "-2", "2", "3"])
NUMERIC = st.one_of(
    _predicates(),
    st.tuples(SIGNED, st.sampled_from(["%", "+", "-", "*"]), SIGNED, st.sampled_from(["< 0", "> 0", "= 0", "= -1", "= 1"])
              ).map(lambda x: f"({x[0]} {x[1]} {x[2]}) {x[3]}"),
    st.tuples(_ints(2), st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), _ints(2)).map(" ".join),
    st.tuples(st.one_of(FLOATS, _ints(1)), st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), FLOATS).map(" ".join),
    st.tuples(FLOATS, st.sampled_from(["IS DISTINCT FROM", "IS NOT DISTINCT FROM"]), st.one_of(FLOATS, _ints(0))
              ).map(" ".join))


# Rows of small numbers (the random rows of ROW often hold a type's bound, so arithmetic leaves most of them to
# Spark): negative dividends, NaN, -0.0 and nulls meet every operator.
SMALL = st.fixed_dictionaries({
    **{c: st.one_of(st.none(), st.integers(-9, 9)) for c in ("i16", "i32", "i64")},
    "f32": st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.0, -2.0, math.nan, math.inf])),
    "f64": st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.0, -2.0, math.nan, -math.inf, 2.0**53 + 1])),
}, optional={c: st.none() for c in ("d", "b", "t", "u", "dt", "ts")})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(st.one_of(ROW, SMALL), st.booleans()), min_size=1, max_size=24),
       st.one_of(_filters(), NUMERIC))
def test_the_columnar_evaluation_is_the_per_row_evaluation(rows, text) -> None:
    image = _image([r for r, _ in rows], [null and i % 3 == 0 for i, (_, null) in enumerate(rows)])
    expression = canonical(text)
    try:
        matcher = filter_columns.compile_matcher(expression, FIELDS)
    except filter_eval.NotCovered as why:
        event(f"left to Spark: {why}")
        assume(False)
        return
    event("over columns" if matcher.columnar is not None else "per row")
    reference = _answers(matcher.reference.evaluate, image)
    columnar = _answers(lambda i: matcher.evaluate(i).to_pylist(), image)
    event("NotCovered" if reference == "NotCovered" else "answered")
    assert columnar == reference, expression
    cut = len(rows) // 2  # the staged row groups: the same image in chunks
    chunked = pa.chunked_array([image.slice(0, cut), image.slice(cut)], image.type)
    assert _answers(lambda i: matcher.evaluate(i).to_pylist(), chunked) == reference, expression
    if reference != "NotCovered":
        assert matcher.matches(image).tolist() == [v is True for v in reference]


def _columnar_examples(compared: Compare, seed: int) -> None:
    """25 random images and filters (from ``seed``), the expressions the columnar matcher evaluates with its
    answers handed to ``compared``; examples where it evaluates none are rejected."""

    @hypothesis.seed(seed)
    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(ROW, min_size=1, max_size=12), st.lists(_filters(), min_size=1, max_size=6))
    def evaluated(rows, filters) -> None:
        image = _image(rows, [False] * len(rows))
        covered: Covered = []
        for text in filters:
            expression = canonical(text)
            try:
                matcher = filter_columns.compile_matcher(expression, FIELDS)
                if matcher.columnar is not None:
                    covered.append((expression, matcher.evaluate(image).to_pylist()))
            except filter_eval.NotCovered:
                pass
        assume(covered)
        compared(pa.Table.from_pylist(rows, schema=SCHEMA), covered)

    evaluated()


def test_the_columnar_evaluation_gives_sparks_answer(spark) -> None:
    """Spark's answers for every example from one query (``filter_compare.compared_together``)."""
    compared_together(spark, _columnar_examples)


def _one(column: str, values: list) -> pa.StructArray:
    return pa.StructArray.from_arrays([pa.array(values, FIELDS[column])], names=[column])


@pytest.mark.parametrize(("expression", "column", "values", "expected"), [
    ("i32 % 2 = 0", "i32", [4, -4, 3, -3, None, -(2**31)], [True, True, False, False, None, True]),
    ("i32 % -3 = -1", "i32", [-7, 7, -(2**31)], [True, False, False]),  # truncated: the dividend's sign
    ("i64 % -1 = 0", "i64", [-(2**63), 5], [True, True]),
    ("f64 > 1", "f64", [math.nan, 2.0, -0.0, None], [True, True, False, None]),  # NaN above every number
    ("f64 = f64", "f64", [math.nan, -0.0], [True, True]),
    ("t LIKE 'a.%'", "t", ["a.b", "ab", "a.\nx", None], [True, False, True, None]),  # '.' literal, % over \n
    ("t LIKE '(a)_'", "t", ["(a)é", "(a)", "a_"], [True, False, False]),
    ("t < 'b'", "t", ["é", "a", "B"], [False, True, True]),  # code-point order, not a collation's
    ("i16 + 1 > 0", "i16", [None, 5], [None, True]),
])
def test_columnar_answers_on_the_edges(expression, column, values, expected) -> None:
    matcher = filter_columns.compile_matcher(expression, {column: FIELDS[column]})
    assert matcher.columnar is not None
    image = _one(column, values)
    assert matcher.evaluate(image).to_pylist() == expected == matcher.reference.evaluate(image)


@pytest.mark.parametrize(("expression", "column", "value"), [
    ("i32 + 1 > 0", "i32", 2**31 - 1), ("- i32 < 0", "i32", -(2**31)), ("abs(i16) > 0", "i16", -(2**15)),
    ("i32 % 0 = 0", "i32", 5), ("i16 * i16 > 0", "i16", 200), ("lower(t) = 'a'", "t", "İ"),
    ("t ILIKE 'a'", "t", "é"), ("t LIKE '_'", "t", "\U0001f600")])
def test_a_value_the_reference_refuses_is_refused_over_columns(expression, column, value) -> None:
    matcher = filter_columns.compile_matcher(expression, {column: FIELDS[column]})
    assert matcher.columnar is not None
    with pytest.raises(filter_eval.NotCovered):
        matcher.evaluate(_one(column, [None, value]))


@pytest.mark.parametrize("expression", ["d > 1.50", "dt = dt", "ts IS NULL", "i32 > 1.5", "COALESCE(d, 0.5) = 0.5"])
def test_decimals_dates_and_timestamps_are_evaluated_per_row(expression) -> None:
    matcher = filter_columns.compile_matcher(expression, FIELDS)
    assert matcher.columnar is None
    image = _image([dict.fromkeys(FIELDS)], [False])
    assert matcher.evaluate(image).to_pylist() == matcher.reference.evaluate(image)


def test_a_million_rows_are_filtered_over_columns() -> None:
    """The benchmark's filter over 10^6 rows: one columnar pass, the reference's answers."""
    values = np.arange(-500_000, 500_000, dtype=np.int32)
    image = pa.StructArray.from_arrays([pa.array(values)], names=["a"])
    matcher = filter_columns.compile_matcher("a % 2 = 0", {"a": pa.int32()})
    assert matcher.columnar is not None
    assert np.array_equal(matcher.matches(image), values % 2 == 0)


# LIKE's own alphabet: every regular-expression metacharacter, whitespace (a newline under % and _) and a non-ASCII
# letter, in patterns and in values, so a character the translation leaves unescaped shows.
LIKE_ALPHABET = "a%_.*+?()[]{}^$| \t\né"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.none(), st.text(alphabet=LIKE_ALPHABET, max_size=5)), min_size=1, max_size=12),
       st.text(alphabet=LIKE_ALPHABET, max_size=5), st.sampled_from(["LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE"]))
def test_like_over_columns_is_like_per_row_on_metacharacters_and_whitespace(values, pattern, operator) -> None:
    expression = canonical(f"t {operator} '{pattern}'")
    try:
        matcher = filter_columns.compile_matcher(expression, {"t": FIELDS["t"]})
    except filter_eval.NotCovered as why:  # ``${`` in a literal: Spark reads it otherwise
        event(f"left to Spark: {why}")
        assume(False)
        return
    assert matcher.columnar is not None, expression
    image = _one("t", values)
    assert _answers(lambda i: matcher.evaluate(i).to_pylist(), image) == _answers(matcher.reference.evaluate, image)


# One predicate of each family the columns evaluate: the property test above compares two evaluators only if
# these compile over columns (a per-row fallback would compare the reference with itself).
COLUMNAR = ["i16 > 1", "i32 % 2 = 0", "i64 + i32 <> 0", "- i32 < 5", "abs(i64) >= 3", "f64 < 1", "f32 <> f32", "f64 = f32",
            "f64 IS DISTINCT FROM 0", "t = 'a'", "t LIKE 'a%'", "t ILIKE '_b'", "lower(t) < 'm'", "length(t) > 2",
            "t || 'x' = 'ax'", "b AND i32 IN (1, 2, NULL)", "i32 BETWEEN 1 AND 5", "COALESCE(t, 'z') = 'z'",
            "u IS NULL OR NOT b"]


@pytest.mark.parametrize("expression", COLUMNAR)
def test_integer_float_and_text_predicates_compile_over_columns(expression) -> None:
    assert filter_columns.compile_matcher(canonical(expression), FIELDS).columnar is not None


@pytest.mark.parametrize("expression", ["i32 % 2 = 0", "t LIKE 'a%'", "f64 > 1", "d > 1.50"])
def test_an_empty_image_has_no_answers(expression) -> None:
    matcher = filter_columns.compile_matcher(expression, FIELDS)
    empty = _image([], [])
    no_chunks = pa.chunked_array([], empty.type)
    for image in (empty, no_chunks):
        assert matcher.evaluate(image).to_pylist() == []
        assert matcher.matches(image).tolist() == []
