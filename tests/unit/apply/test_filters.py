"""Row filters: validation by parse tree and the four UPDATE transform cases."""

from __future__ import annotations

from functools import reduce

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply.filters import apply_row_filter, referenced_columns, validate_row_filter
from airflow_provider_pglogical.apply.transforms import resolve_toast_from_old
from airflow_provider_pglogical.exceptions import RowFilterError
from airflow_provider_pglogical.row_filter import canonical
from tests.support.stage import Chg, Col, Rel
from tests.unit.apply.conftest import ITEMS, ITEMS_FULL

COLS = ["id", "grp", "note"]


def run(frame, expression, identity=("id",)):
    df = frame.transform(resolve_toast_from_old(COLS, identity)).transform(apply_row_filter(expression, COLS))
    return sorted((r["_pgl_tx_order"], r["_pgl_op"]) for r in df.collect())


def test_update_transforms_follow_the_four_pgoutput_cases(changes_frame):
    frame = changes_frame(ITEMS_FULL, [
        Chg("U", 10, 0, old={"id": 1, "grp": 1}, new={"id": 1, "grp": 2}),  # old no, new no -> drop
        Chg("U", 10, 1, old={"id": 2, "grp": 1}, new={"id": 2, "grp": 5}),  # old no, new yes -> INSERT
        Chg("U", 10, 2, old={"id": 3, "grp": 5}, new={"id": 3, "grp": 1}),  # old yes, new no -> DELETE
        Chg("U", 10, 3, old={"id": 4, "grp": 5}, new={"id": 4, "grp": 6}),  # old yes, new yes -> UPDATE
    ])
    assert run(frame, "grp >= 5", identity=COLS) == [(1, "I"), (2, "D"), (3, "U")]


def test_update_without_old_image_is_evaluated_on_the_new_row_only(changes_frame):
    frame = changes_frame(ITEMS, [
        Chg("U", 10, 0, new={"id": 1, "grp": 1}),
        Chg("U", 10, 1, new={"id": 7, "grp": 1}),
    ])
    assert run(frame, "id > 5") == [(1, "U")]


def test_inserts_use_the_new_row_and_deletes_the_old_row(changes_frame):
    frame = changes_frame(ITEMS, [
        Chg("I", 10, 0, new={"id": 1, "grp": 1}),
        Chg("I", 10, 1, new={"id": 9, "grp": 1}),
        Chg("D", 10, 2, old={"id": 9}, old_key_only=True),
        Chg("D", 10, 3, old={"id": 2}, old_key_only=True),
    ])
    assert run(frame, "id > 5") == [(1, "I"), (2, "D")]


def test_a_filter_evaluating_to_null_counts_as_false(changes_frame):
    frame = changes_frame(ITEMS_FULL, [
        Chg("I", 10, 0, new={"id": 1, "grp": None}),
        Chg("U", 10, 1, old={"id": 2, "grp": None}, new={"id": 2, "grp": 7}),  # NULL old -> INSERT
        Chg("U", 10, 2, old={"id": 3, "grp": 7}, new={"id": 3, "grp": None}),  # NULL new -> DELETE
        Chg("I", 10, 3, new={"id": 4, "grp": None, "note": "x"}),
    ])
    assert run(frame, "grp > 5 OR note IS NOT NULL AND grp > 100", identity=COLS) == [(1, "I"), (2, "D")]


def test_key_only_old_image_matches_on_identity_columns_after_toast_refill(changes_frame):
    # The key is 'u' in the new image: pgoutput copies it from the old tuple before filtering.
    frame = changes_frame(ITEMS, [
        Chg("U", 10, 0, old={"id": 8}, old_key_only=True, new={"id": None, "grp": 1}, toast=("id",)),
    ])
    assert run(frame, "id = 8") == [(0, "U")]


def test_references_are_read_from_the_parse_tree(spark):
    assert referenced_columns(spark, "a BETWEEN 1 AND 3 OR b IN (1, 2) AND NOT c LIKE 'x%' OR d IS NULL") == \
        {"a", "b", "c", "d"}
    assert referenced_columns(spark, "'a' = 'b'") == frozenset()


@pytest.mark.parametrize("expression", ["id >", "a / 2 = 1", "(SELECT 1) = id", "t.id = 1",
                                        "rand() > 0.5", "note = 'it''s'", "note = 'a\\b'", "note = '${x}'"])
def test_unsupported_or_invalid_filters_raise_row_filter_error(spark, expression):
    with pytest.raises(RowFilterError):
        referenced_columns(spark, expression)


def test_unknown_columns_are_rejected_by_name(spark):
    with pytest.raises(RowFilterError, match="unknown column.*nope"):
        validate_row_filter(spark, "nope = 1", table="public.items", columns=COLS, identity=["id"],
                            replica_identity="d", actions=["insert"])


def test_names_differing_only_by_case_are_distinct_columns_as_in_postgresql(changes_frame):
    # PostgreSQL folds the unquoted GRP to grp; "Val" is not val (an unknown column, as CREATE PUBLICATION says).
    frame = changes_frame(ITEMS_FULL, [Chg("I", 10, 0, new={"id": 1, "grp": 5}), Chg("I", 10, 1, new={"id": 2, "grp": 1})])
    assert run(frame, "GRP >= 5") == [(0, "I")]
    with pytest.raises(RowFilterError, match="unknown column.*val"):
        validate_row_filter(None, "val = 1", table="public.t", columns=["id", "Val"], identity=["id"],
                            replica_identity="d", actions=["insert"])
    assert validate_row_filter(None, "val = 1", table="public.t", columns=["id", "Val", "val"], identity=["id"],
                               replica_identity="d", actions=["insert"], types={"Val": "text", "val": "integer"}) == {"val"}


CASED = Rel("public", "cased", (Col("id", pa.int64(), "bigint", True), Col("Val", pa.int64(), "bigint"),
                                Col("val", pa.int64(), "bigint")), replica_identity="f")


def test_a_quoted_name_reads_its_own_column_and_an_unquoted_one_the_folded_column(changes_frame):
    # Val and val hold opposite values: a filter reading the other column (or neither) selects other changes.
    frame = changes_frame(CASED, [
        Chg("I", 10, 0, new={"id": 1, "Val": 5, "val": 0}),
        Chg("I", 10, 1, new={"id": 2, "Val": 0, "val": 5}),
        Chg("U", 10, 2, old={"id": 3, "Val": 5, "val": 0}, new={"id": 3, "Val": 0, "val": 5}),  # "Val" leaves: D
    ])
    columns = ["id", "Val", "val"]

    def kept(expression: str) -> list[tuple[int, str]]:
        df = frame.transform(resolve_toast_from_old(columns, columns)).transform(apply_row_filter(expression, columns))
        return sorted((r["_pgl_tx_order"], r["_pgl_op"]) for r in df.collect())

    assert kept('"Val" >= 5') == [(0, "I"), (2, "D")]
    assert kept("Val >= 5") == kept("val >= 5") == [(1, "I"), (2, "I")]
    assert validate_row_filter(None, '"Val" >= 5', table="public.cased", columns=columns, identity=["id"],
                               replica_identity="f", actions=["insert"]) == {"Val"}


@pytest.mark.parametrize(("expression", "columns", "said"), [
    ("Region = 'eu'", ["id", "Region", "REGION"], 'region: region matches "REGION", "Region" apart from case: '
     "unquoted names fold to lower case, as in PostgreSQL; quote the column as spelled"),
    ('"Region" = \'eu\'', ["id", "region"], 'Region: "Region" matches region apart from case: quoted names keep '
     "their case, as in PostgreSQL; drop the quotes"),
    ('"Val" = 1 AND nope = 2', ["id", "val", "VAL"], 'Val, nope: "Val" matches "VAL", val apart from case: quoted '
     "names keep their case, as in PostgreSQL; drop the quotes for val or quote the column as spelled"),
    ('"Select" = 1', ["id", "select"], 'Select: "Select" matches "select" apart from case: quoted names keep their '
     "case, as in PostgreSQL; quote the column as spelled"),  # a keyword: dropping the quotes would not parse
    ("regoin = 'eu'", ["id", "Region"], "regoin"),  # a plain typo: no word about case
])
def test_an_unknown_name_matching_a_column_apart_from_case_is_refused_naming_the_way_out(expression, columns, said):
    with pytest.raises(RowFilterError) as info:
        validate_row_filter(None, expression, table="public.orders", columns=columns, identity=["id"],
                            replica_identity="d", actions=["insert"])
    assert str(info.value) == f"row filter of public.orders references unknown column(s) {said}"


def test_the_way_out_the_case_hint_names_is_accepted():
    kw = dict(table="public.orders", identity=["id"], replica_identity="d", actions=["insert"])
    assert validate_row_filter(None, "\"REGION\" = 'eu'", columns=["id", "Region", "REGION"], **kw) == {"REGION"}
    assert validate_row_filter(None, "Region = 'eu'", columns=["id", "region"], **kw) == {"region"}


def test_non_identity_columns_are_judged_when_an_update_arrives_not_up_front(spark):
    # PostgreSQL checks the rule at UPDATE/DELETE time (planning.update_delete_problem, runner).
    assert validate_row_filter(spark, "grp = 1", table="public.items", columns=COLS, identity=["id"],
                               replica_identity="d", actions=["insert", "update"]) == {"grp"}


def test_non_identity_columns_are_fine_for_full_identity_or_insert_only(spark):
    kw = dict(table="public.items", columns=COLS, identity=["id"])
    assert validate_row_filter(spark, "grp = 1", replica_identity="f", actions=["update"], **kw) == {"grp"}
    assert validate_row_filter(spark, "grp = 1", replica_identity="d", actions=["insert"], **kw) == {"grp"}


def test_error_messages_never_contain_literal_values(spark):
    with pytest.raises(RowFilterError) as info:
        validate_row_filter(spark, "secret_col = 'hunter2'", table="public.items", columns=COLS, identity=["id"],
                            replica_identity="d", actions=["insert"])
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("type_name", ["numeric", "money", "interval", "character(3)", "jsonb", "integer[]", "my_enum",
                                       None])
def test_columns_whose_staged_values_compare_differently_are_refused(spark, type_name):
    types = {"id": "bigint", "grp": type_name, "note": "text"}
    with pytest.raises(RowFilterError, match=r"grp \(") as info:
        validate_row_filter(spark, "grp > 5 AND id > 0", table="public.items", columns=COLS, identity=["id"],
                            replica_identity="f", actions=["insert"], types=types)
    assert "id (" not in str(info.value)


@pytest.mark.parametrize("type_name", ["integer", "numeric(12,2)", "timestamp with time zone", "timestamp(3) without time zone",
                                       "character varying(20)", "text", "boolean", "double precision", "date", "uuid"])
def test_columns_with_exact_staged_comparisons_are_accepted(spark, type_name):
    types = {"id": "bigint", "grp": type_name, "note": "text"}
    assert validate_row_filter(spark, "grp IS NOT NULL", table="public.items", columns=COLS, identity=["id"],
                               replica_identity="f", actions=["insert"], types=types) == {"grp"}


# Filters mixing operators whose ranks differ between PostgreSQL's grammar and Spark's (``||`` binds like ``+`` in
# Spark, not in PostgreSQL), over typed columns with NULLs: the rows the Spark apply keeps must be the rows
# PostgreSQL's WHERE selects.
MIXED = Rel("public", "mixed", (Col("id", pa.int64(), "bigint", True), Col("i32", pa.int32(), "integer"),
                                Col("i64", pa.int64(), "bigint"), Col("t", pa.string(), "text"),
                                Col("b", pa.bool_(), "boolean")))
MIXED_ROWS = [{"id": 0, "i32": 10, "i64": -3, "t": "1", "b": True}, {"id": 1, "i32": -2, "i64": 5, "t": "19", "b": False},
              {"id": 2, "i32": None, "i64": 0, "t": "a", "b": None}, {"id": 3, "i32": 1, "i64": None, "t": None, "b": True},
              {"id": 4, "i32": 0, "i64": 2**20, "t": "-1", "b": False}, {"id": 5, "i32": 3, "i64": 7, "t": "", "b": True}]
NUMBERS = st.recursive(
    st.sampled_from(["i32", "i64", "1", "2", "3"]),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*"]), inner).map(lambda x: f"({x[0]} {x[1]} {x[2]})"),
        inner.map(lambda x: f"(- {x})"), inner.map(lambda x: f"({x})::bigint")),
    max_leaves=3)
# Mostly an operation's result beside ||: where the grammars' ranks part.
ARITHMETIC = st.tuples(NUMBERS, st.sampled_from(["+", "-", "*"]), NUMBERS).map(lambda x: f"({x[0]} {x[1]} {x[2]})")
TEXTS = st.recursive(
    st.just("t"),
    lambda inner: st.one_of(st.tuples(inner, inner).map(lambda x: f"({x[0]} || {x[1]})"),
                            st.tuples(inner, st.one_of(ARITHMETIC, NUMBERS)).map(lambda x: f"({x[0]} || {x[1]})"),
                            st.tuples(st.one_of(ARITHMETIC, NUMBERS), inner).map(lambda x: f"({x[0]} || {x[1]})")),
    max_leaves=3)
PREDICATES = st.one_of(
    st.just("b"),
    st.tuples(NUMBERS, st.sampled_from(["=", "<>", "<", ">="]), NUMBERS).map(lambda x: f"({x[0]} {x[1]} {x[2]})"),
    st.tuples(TEXTS, st.sampled_from(["=", "<>"]), st.sampled_from(["'19'", "'1'", "'10'", "t", "'-1-1'"])).map(
        lambda x: f"({x[0]} {x[1]} {x[2]})"),
    st.tuples(st.one_of(NUMBERS, TEXTS, st.just("b")), st.sampled_from(["IS NULL", "IS NOT NULL"])).map(
        lambda x: f"({x[0]} {x[1]})"))
FILTERS = st.recursive(
    PREDICATES,
    lambda inner: st.one_of(inner.map(lambda x: f"(NOT {x})"),
                            st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda x: f"({x[0]} {x[1]} {x[2]})")),
    max_leaves=4)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(FILTERS, min_size=1, max_size=6))
@example(["t || (i32 - 1) = '19'", "NOT i32 + 1 IS NULL AND t || i64 - 1 IS NOT NULL", "-(i32 - 1) * 2 < i64"])
def test_spark_keeps_the_rows_postgresql_selects_whatever_the_operators_ranks(changes_frame, pg_conn, filters):
    texts = [canonical(f) for f in filters]  # what the spec hands the apply: the tree deparsed, needless parentheses gone
    columns = [c.name for c in MIXED.columns]
    frame = changes_frame(MIXED, [Chg("I", 10, r["id"], new=r) for r in MIXED_ROWS])
    kept: DataFrame = reduce(DataFrame.unionByName, [
        frame.transform(apply_row_filter(text, columns)).select(F.lit(k).alias("k"), F.col("_pgl_tx_order").alias("id"))
        for k, text in enumerate(texts)])
    spark_ids = sorted((r["k"], r["id"]) for r in kept.collect())
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TEMP TABLE IF NOT EXISTS mixed (id bigint, i32 integer, i64 bigint, t text, b boolean)")
        cur.execute("TRUNCATE mixed")
        cur.executemany("INSERT INTO mixed VALUES (%(id)s, %(i32)s, %(i64)s, %(t)s, %(b)s)", MIXED_ROWS)
        cur.execute(" UNION ALL ".join(f"SELECT {k}, id FROM mixed WHERE {text}" for k, text in enumerate(texts)))
        pg_ids = sorted(cur.fetchall())
    assert spark_ids == pg_ids, texts


def test_names_holding_a_spark_variable_reference_read_their_own_column(changes_frame):
    # Spark would substitute ${…} inside a backtick-quoted name too: "x${env:PATH}" read as x/usr/bin:….
    name = "x${env:PATH}"
    rel = Rel("public", "dollars", (Col("id", pa.int64(), "bigint", True), Col(name, pa.int64(), "bigint")))
    frame = changes_frame(rel, [Chg("I", 10, 0, new={"id": 0, name: 5}), Chg("I", 10, 1, new={"id": 1, name: 0})])
    kept = frame.transform(apply_row_filter(f'"{name}" > 1', ["id", name])).collect()
    assert [r["_pgl_tx_order"] for r in kept] == [0]
