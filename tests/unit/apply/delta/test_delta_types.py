"""Staged Arrow types → Delta types: exact, and refused where Delta cannot hold a value."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_provider_pglogical.apply.targets.delta.types import (
    INT32_MAX,
    INT64_MIN,
    DeltaValueError,
    delta_schema,
    delta_type,
    to_delta,
)


def test_each_staged_type_maps_to_the_closest_delta_type():
    assert delta_type(pa.decimal128(12, 2)) == pa.decimal128(12, 2)
    assert delta_type(pa.decimal256(50, 3)) == pa.string()
    assert delta_type(pa.time64("us")) == pa.int64()
    assert delta_type(pa.uint64()) == pa.decimal128(20, 0)
    assert delta_type(pa.int64(), "money") == pa.decimal128(19, 2)
    assert delta_type(pa.timestamp("us", tz="UTC")) == pa.timestamp("us", tz="UTC")
    assert delta_type(pa.timestamp("us")) == pa.timestamp("us")
    interval = pa.struct([("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())])
    assert delta_type(interval) == interval
    timetz = pa.struct([("time", pa.time64("us")), ("utc_offset", pa.int32())])
    assert delta_type(timetz) == pa.struct([("time", pa.int64()), ("utc_offset", pa.int32())])
    assert delta_type(pa.list_(pa.time64("us"))) == pa.list_(pa.field("element", pa.int64()))


def test_values_survive_a_delta_round_trip_exactly(tmp_path):
    rng = pa.struct([("lower", pa.date32()), ("upper", pa.date32()), ("lower_inclusive", pa.bool_()),
                     ("upper_inclusive", pa.bool_()), ("empty", pa.bool_())])
    table = pa.table({
        "id": pa.array([1, 2], pa.int32()),
        "price": pa.array([Decimal("12345678901234.56"), None], pa.decimal128(16, 2)),
        "big": pa.array([Decimal("1" * 45 + ".125"), None], pa.decimal256(50, 3)),
        "tiny": pa.array([Decimal("0.0000001"), Decimal(0)], pa.decimal256(50, 10)),
        "exact_text": pa.array(["123.4500", "NaN"]),  # unconstrained numeric is staged as its text
        "cash": pa.array([-123456, 2**63 - 1], pa.int64()),
        "at": pa.array([dt.time(23, 59, 59, 999999), None], pa.time64("us")),
        "ts": pa.array([dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)], pa.timestamp("us")),
        "tstz": pa.array([dt.datetime(2024, 2, 29, 12, tzinfo=dt.UTC), None], pa.timestamp("us", tz="UTC")),
        "lsn": pa.array([2**64 - 1, 0], pa.uint64()),
        "tags": pa.array([["a", None], []], pa.list_(pa.string())),
        "span": pa.array([{"lower": dt.date(2020, 1, 1), "upper": None, "lower_inclusive": True,
                           "upper_inclusive": False, "empty": False}, None], rng),
    })
    names = {"cash": "money"}
    schema = delta_schema(table.schema, names)
    write_deltalake(str(tmp_path / "t"), to_delta(table, schema, "test", names))
    back = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().sort_by("id").to_pylist()
    assert back[0]["price"] == Decimal("12345678901234.56")
    assert back[0]["big"] == "1" * 45 + ".125"
    assert [r["tiny"] for r in back] == ["0.0000001000", "0.0000000000"]  # numeric_out's text, no exponent
    assert back[1]["exact_text"] == "NaN"
    assert [r["cash"] for r in back] == [Decimal("-1234.56"), Decimal("92233720368547758.07")]
    assert back[0]["at"] == 86_399_999_999
    assert back[1]["ts"] == dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert back[0]["tstz"] == dt.datetime(2024, 2, 29, 12, tzinfo=dt.UTC)
    assert back[0]["lsn"] == Decimal(2**64 - 1)
    assert back[0]["tags"] == ["a", None] and back[1]["tags"] == []
    assert back[0]["span"]["lower"] == dt.date(2020, 1, 1) and back[1]["span"] is None


def test_money_keeps_every_digit_in_a_column_with_nulls():
    """int64 minor units beyond 2**53 next to a NULL: a float64 detour would round or wrap them."""
    table = pa.table({"m": pa.array([2**63 - 1, None, -(2**63), 2**53 + 1, -1], pa.int64())})
    names = {"m": "money"}
    out = to_delta(table, delta_schema(table.schema, names), "test", names).column("m").to_pylist()
    assert out == [Decimal("92233720368547758.07"), None, Decimal("-92233720368547758.08"),
                   Decimal("90071992547409.93"), Decimal("-0.01")]
    sliced = to_delta(table.slice(1), delta_schema(table.schema, names), "test", names).column("m").to_pylist()
    assert sliced == out[1:]


@pytest.mark.parametrize("array", [pa.array([0, INT32_MAX], pa.date32()),
                                   pa.array([INT64_MIN], pa.timestamp("us", tz="UTC"))])
def test_infinity_is_refused_naming_the_column_not_the_value(array):
    table = pa.table({"valid_to": array})
    with pytest.raises(DeltaValueError, match=r"batch 1-2: column valid_to holds ±infinity"):
        to_delta(table, delta_schema(table.schema), "batch 1-2")


def test_nanoseconds_are_never_truncated():
    table = pa.table({"t": pa.array([1_001], pa.timestamp("ns"))})
    with pytest.raises(DeltaValueError, match="nanoseconds"):
        to_delta(table, delta_schema(table.schema), "b")


def test_infinity_names_the_first_change_that_holds_it_when_the_lsns_are_given():
    table = pa.table({"_pgl_lsn": pa.array([0x30, 0x20, 0x10], pa.int64()),
                      "valid_to": pa.array([0, INT32_MAX, None], pa.date32()),
                      "span": pa.array([None, None, {"lower": -(2**31)}], pa.struct([("lower", pa.date32())]))})
    with pytest.raises(DeltaValueError, match=r"b: public.t: column valid_to \(change at LSN 20\) holds ±infinity"):
        to_delta(table, delta_schema(table.schema), "b: public.t", lsn_column="_pgl_lsn")
    with pytest.raises(DeltaValueError, match=r"column span.lower \(change at LSN 10\)"):
        to_delta(table.drop_columns(["valid_to"]), delta_schema(table.drop_columns(["valid_to"]).schema), "b",
                 lsn_column="_pgl_lsn")
