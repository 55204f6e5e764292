"""Schema-change planning: which target column changes a new source schema implies, and what stops."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.schema_changes import (
    ADD,
    RELAX,
    WIDEN,
    ColumnChange,
    SourceVersion,
    builtin_type_name,
    missing_value,
    narrows_exactly,
    plan_column_changes,
    rounds,
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


@pytest.mark.parametrize(("literal", "value"), [
    ("{7}", "7"), ("{1.50}", "1.50"), ('{"a \\"b\\\\ c"}', 'a "b\\ c'), ('{"{1,2}"}', "{1,2}"),
    ('{"2019-12-31 20:02:03+00"}', "2019-12-31 20:02:03+00"), ('{""}', ""), ("{NULL}", None), (None, None),
    ("7", None),
])
def test_missing_value_is_the_element_of_attmissingvals_one_element_array(literal, value):
    assert missing_value(literal) == value


def test_a_column_added_with_a_source_default_carries_it_to_the_target():
    versions = [v(0x10, id="bigint"), SourceVersion(0x20, {"id": "bigint", "d": "integer"}, {"d": "{7}"})]
    assert plan_column_changes("public.t", {"id": "bigint"}, [], versions, ["id", "d"]) == [
        ColumnChange(ADD, "d", None, "integer", "7")]
    # Already in the target (e.g. added there with the same DEFAULT first): nothing to do.
    assert plan_column_changes("public.t", {"id": "bigint", "d": "integer"}, [], versions, ["id", "d"]) == []


@pytest.mark.parametrize(("old", "new", "rounding"), [
    ("numeric(10,2)", "numeric(6,1)", True), ("numeric(10,2)", "numeric(8,2)", False), ("numeric", "numeric(8,2)", True),
    ("double precision", "real", True), ("bigint", "integer", False), ("text", "character varying(3)", False),
    ("timestamp without time zone", "timestamp(3) without time zone", True),
    ("time(3) with time zone", "time(1) with time zone", True), ("numeric(12,2)", "integer", False),
])
def test_a_narrowing_that_rounds_is_not_followed(old, new, rounding):
    assert widens(new, old)
    assert rounds(old, new) is rounding
    assert narrows_exactly(old, new) is not rounding
    versions = [v(0x10, id="bigint", c=old), v(0x20, id="bigint", c=new)]
    if rounding:
        with pytest.raises(SchemaChangeError, match=re.escape(f"from {old} to {new}")):
            plan_column_changes("public.t", {"id": "bigint", "c": old}, [], versions, ["id", "c"])
        # The user converted (rounded) the target column as the source did: the batch applies.
        assert plan_column_changes("public.t", {"id": "bigint", "c": new}, [], versions, ["id", "c"]) == []
    else:
        assert plan_column_changes("public.t", {"id": "bigint", "c": old}, [], versions, ["id", "c"]) == []


@pytest.mark.parametrize(("oid", "typmod", "name"), [
    (1700, -1, "numeric"), (1700, (10 << 16 | 2) + 4, "numeric(10,2)"), (1700, (5 << 16 | 0x7FE) + 4, "numeric(5,-2)"),
    (1043, 24, "character varying(20)"), (1043, -1, "character varying"), (23, -1, "integer"),
    (1114, 3, "timestamp(3) without time zone"), (1184, -1, "timestamp with time zone"),
    (1266, 2, "time(2) with time zone"), (701, -1, "double precision"), (3802, -1, None),
])
def test_builtin_type_names_match_format_type(oid, typmod, name):
    assert builtin_type_name(oid, typmod) == name


def test_a_column_written_in_the_batch_but_dropped_by_its_end_keeps_its_last_type_and_is_relaxed():
    """Written by the changes of the versions that have it: added (when the target lacks it) with the type of
    the last version that has it, and relaxed (rows inserted after the drop leave it NULL)."""
    versions = [SourceVersion(0x10, {"id": "bigint", "c": "integer"}),
                SourceVersion(0x20, {"id": "bigint", "c": "bigint"}),
                SourceVersion(0x30, {"id": "bigint", "x": "text"}, {"x": "{hi}"}),
                SourceVersion(0x40, {"id": "bigint"})]
    target = {"id": "bigint", "c": "integer"}
    changes = plan_column_changes("public.t", target, ["c"], versions, ["id", "c", "x"])
    assert changes == [ColumnChange(WIDEN, "c", "integer", "bigint"), ColumnChange(ADD, "x", None, "text", "hi"),
                       ColumnChange(RELAX, "c", "integer", None)]
    assert [ch.lsn for ch in changes[:2]] == [0x20, 0x30]
