"""Both routes from a staged file into Spark give the same types and values: Spark's Parquet reader (local
staging) and pyarrow on the driver + ``createDataFrame`` (object stores, and files Spark cannot read)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.pandas.types import from_arrow_schema

from airflow_provider_pglogical.apply.sparkenv import SESSION_CONF
from airflow_provider_pglogical.apply.staged_arrow import decimal_text, spark_readable, to_spark_arrow

IMAGE = pa.struct([("id", pa.int32()), ("lsn", pa.uint64()), ("small", pa.uint32()), ("ts", pa.timestamp("us")),
                   ("tstz", pa.timestamp("us", tz="UTC")), ("tm", pa.time64("us")),
                   ("lsns", pa.list_(pa.uint64())), ("at", pa.struct([("lsn", pa.uint64()), ("n", pa.int16())]))])


def _staged() -> pa.Table:
    image = pa.array([
        {"id": 1, "lsn": 2**64 - 1, "small": 2**32 - 1, "ts": dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
         "tstz": dt.datetime(1, 1, 2, tzinfo=dt.UTC), "tm": dt.time(23, 59, 59, 999999), "lsns": [0, None, 2**63],
         "at": {"lsn": 2**64 - 2, "n": -1}},
        {"id": 2, "lsn": None, "small": 0, "ts": None, "tstz": None, "tm": None, "lsns": [], "at": None},
        None], IMAGE)
    return pa.table({"lsn": pa.array([1, 2, 3], pa.int64()), "new": image,
                     "new_value_notes": pa.array([[], None, [("id", "x")]], pa.map_(pa.string(), pa.string()))})


@pytest.fixture
def session(spark):
    for key, value in SESSION_CONF.items():
        spark.conf.set(key, value)
    return spark


def test_the_driver_route_gives_what_sparks_parquet_reader_gives(session, tmp_path):
    path = str(tmp_path / "changes.parquet")
    pq.write_table(_staged(), path)
    assert spark_readable(pq.read_schema(path))
    by_reader = session.read.parquet(path)
    table = to_spark_arrow(pq.read_table(path))
    by_driver = session.createDataFrame(table, schema=from_arrow_schema(table.schema, prefer_timestamp_ntz=True))
    assert by_driver.schema == by_reader.schema
    assert by_driver.orderBy("lsn").collect() == by_reader.orderBy("lsn").collect()
    row = by_driver.orderBy("lsn").first()
    assert row is not None and row["new"]["lsn"] == Decimal(2**64 - 1) and row["new"]["lsns"][2] == Decimal(2**63)


def test_decimals_wider_than_spark_are_exact_text_with_their_nan(session, tmp_path):
    wide = pa.decimal256(76, 10)
    image = pa.array([{"n": Decimal("9" * 66 + "." + "9" * 10), "ns": [Decimal("-0.0000000001")]},
                      {"n": None, "ns": None}, {"n": Decimal(0), "ns": [None]}, {"n": None, "ns": []}],
                     pa.struct([("n", wide), ("ns", pa.list_(wide))]))
    notes = pa.array([[], [("n", "NaN")], None, []], pa.map_(pa.string(), pa.string()))
    path = str(tmp_path / "wide.parquet")
    pq.write_table(pa.table({"lsn": pa.array([1, 2, 3, 4], pa.int64()), "new": image, "new_value_notes": notes}), path)
    assert not spark_readable(pq.read_schema(path))
    table = to_spark_arrow(pq.read_table(path))
    rows = session.createDataFrame(table, schema=from_arrow_schema(table.schema, prefer_timestamp_ntz=True)) \
        .orderBy("lsn").collect()
    assert [r["new"]["n"] for r in rows] == ["9" * 66 + "." + "9" * 10, "NaN", "0.0000000000", None]
    assert [r["new"]["ns"] for r in rows] == [["-0.0000000001"], None, [None], []]


@pytest.mark.parametrize(("dtype", "values", "texts"), [
    (pa.decimal256(50, 10), ["0.0000001", "0", "-5", "-0.0000000001"],
     ["0.0000001000", "0.0000000000", "-5.0000000000", "-0.0000000001"]),
    (pa.decimal256(40, 0), ["0", "-" + "9" * 40], ["0", "-" + "9" * 40]),
    (pa.decimal128(20, 10), ["0.00000001", "-1234567890.0123456789"], ["0.0000000100", "-1234567890.0123456789"]),
])
def test_decimal_text_is_the_plain_text_with_every_fraction_digit(dtype, values, texts):
    arr = pa.array([Decimal(v) for v in values] + [None], dtype)
    assert decimal_text(arr).to_pylist() == [*texts, None]
    assert decimal_text(arr.slice(1)).to_pylist() == [*texts[1:], None]
