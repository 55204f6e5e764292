"""Schema-change planning: which target column changes a new source schema implies, and what stops."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.schema_changes import (
    ADD,
    RELAX,
    WIDEN,
    ColumnChange,
    SourceVersion,
    plan_column_changes,
    widens,
)
from airflow_provider_pglogical.exceptions import SchemaChangeError


@pytest.mark.parametrize(("old", "new"), [
    ("smallint", "integer"), ("integer", "bigint"), ("smallint", "bigint"), ("integer", "numeric"),
    ("integer", "numeric(12,2)"), ("bigint", "numeric(19,0)"), ("real", "double precision"),
    ("character varying(10)", "character varying(20)"), ("character varying(10)", "text"),
    ("character varying(10)", "character varying"), ("text", "character varying"),
    ("numeric(10,2)", "numeric(12,2)"), ("numeric(10,2)", "numeric(12,4)"), ("numeric(10,2)", "numeric"),
    ("timestamp(3) without time zone", "timestamp without time zone"),
    ("timestamp(3) with time zone", "timestamp(6) with time zone"), ("integer[]", "bigint[]"),
    ("bit varying(3)", "bit varying"), ("text", "text"),
])
def test_lossless_widenings(old, new):
    assert widens(old, new)


@pytest.mark.parametrize(("old", "new"), [
    ("bigint", "integer"), ("integer", "smallint"), ("integer", "text"), ("text", "integer"),
    ("double precision", "real"), ("integer", "real"), ("bigint", "numeric(18,0)"), ("integer", "numeric(10,2)"),
    ("character varying(20)", "character varying(10)"), ("text", "character varying(10)"),
    ("numeric(12,2)", "numeric(10,2)"), ("numeric(10,4)", "numeric(12,2)"), ("numeric", "numeric(30,2)"),
    ("timestamp without time zone", "timestamp with time zone"), ("timestamp without time zone", "timestamp(3) "
                                                                  "without time zone"),
    ("integer[]", "integer"), ("date", "timestamp without time zone"),
])
def test_not_widenings(old, new):
    assert not widens(old, new)


INTS = ["smallint", "integer", "bigint", "numeric(5,0)", "numeric(12,2)", "numeric(20,0)", "numeric"]


@given(st.sampled_from(INTS), st.sampled_from(INTS), st.sampled_from(INTS))
def test_widening_is_transitive_among_integer_and_numeric_types(a, b, c):
    if widens(a, b) and widens(b, c):
        assert widens(a, c)


def v(lsn, **columns):
    return SourceVersion(lsn, columns)


def test_a_new_column_is_added_with_its_exact_type_and_a_dropped_one_made_nullable():
    target = {"id": "bigint", "gone": "text"}
    versions = [v(0x10, id="bigint", gone="text"), v(0x20, id="bigint", b="numeric(10,2)")]
    assert plan_column_changes("public.t", target, ["gone"], versions, ["id", "b"]) == [
        ColumnChange(ADD, "b", None, "numeric(10,2)"), ColumnChange(RELAX, "gone", "text", None)]
    # A nullable leftover needs nothing; a target-only NOT NULL column the source still has is not ours to relax.
    assert plan_column_changes("public.t", target, [], versions, ["id", "b"]) == [
        ColumnChange(ADD, "b", None, "numeric(10,2)")]


def test_a_widening_alters_the_target_and_a_narrowing_keeps_the_wider_column():
    assert plan_column_changes("public.t", {"id": "integer"}, [], [v(0x10, id="bigint")], ["id"]) == [
        ColumnChange(WIDEN, "id", "integer", "bigint")]
    assert plan_column_changes("public.t", {"id": "bigint"}, [], [v(0x10, id="bigint"), v(0x20, id="integer")],
                               ["id"]) == []


def test_an_unfollowable_type_change_names_table_column_types_and_lsn_and_resumes_once_the_target_is_fixed():
    versions = [v(0x10, id="bigint", c="integer"), v(0x2A0, id="bigint", c="text")]
    with pytest.raises(SchemaChangeError) as info:
        plan_column_changes("public.t", {"id": "bigint", "c": "integer"}, [], versions, ["id", "c"])
    err = info.value
    assert (err.table, err.column, err.old_type, err.new_type, err.lsn) == ("public.t", "c", "integer", "text", 0x2A0)
    assert "0/2A0" in str(err) and "ALTER TABLE public.t ALTER COLUMN c TYPE text" in str(err)
    # Across batches (only the new version staged) the target's type is the old one.
    with pytest.raises(SchemaChangeError, match="from integer to text"):
        plan_column_changes("public.t", {"id": "bigint", "c": "integer"}, [], versions[1:], ["id", "c"])
    # After the user converted the target column, both batches apply.
    assert plan_column_changes("public.t", {"id": "bigint", "c": "text"}, [], versions, ["id", "c"]) == []


def test_policy_fail_stops_at_any_change_the_target_would_need():
    with pytest.raises(SchemaChangeError, match="new column b .integer. .LSN 0/20. and schema_changes is fail"):
        plan_column_changes("public.t", {"id": "bigint"}, [], [v(0x10, id="bigint"), v(0x20, id="bigint", b="integer")],
                            ["id", "b"], policy="fail")
    assert plan_column_changes("public.t", {"id": "bigint"}, [], [v(0x10, id="bigint")], ["id"], policy="fail") == []


def test_a_missing_column_of_unknown_type_stops():
    with pytest.raises(SchemaChangeError, match="type is unknown"):
        plan_column_changes("public.t", {}, [], [v(0x10, id=None)], ["id"])
