"""Rows → PostgreSQL COPY text lines, built by Spark expressions."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from pyspark.sql import Row

from airflow_provider_pglogical.apply.targets.postgres.copytext import copy_lines


def lines(spark, rows, schema):
    return [r.line for r in copy_lines(spark.createDataFrame(rows, schema)).collect()]


def test_scalars_use_postgres_input_syntax_and_null_markers(spark):
    got = lines(spark, [(5, False, float("nan"), float("-inf"), Decimal("1234.50"), None)],
                "i int, b boolean, f double, g double, n decimal(12,2), t string")
    assert got == ["5\tfalse\tNaN\t-Infinity\t1234.50\t\\N"]


def test_text_is_escaped_for_copy(spark):
    assert lines(spark, [("a\tb\nc\\d\re",)], "t string") == ["a\\tb\\nc\\\\d\\re"]


def test_bytea_is_hex(spark):
    assert lines(spark, [(bytearray(b"\x00\xff"),)], "b binary") == ["\\\\x00ff"]


def test_arrays_quote_every_element_and_keep_nulls(spark):
    got = lines(spark, [(['a "q"', "b,c", None], [[1, 2], [3, None]], [])],
                "t array<string>, n array<array<int>>, e array<string>")
    assert got == ['{"a \\\\"q\\\\"","b,c",NULL}\t{{"1","2"},{"3",NULL}}\t{}']


def test_dates_and_timestamps_are_utc_text_and_infinities_survive(spark):
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    ts = dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    df = spark.createDataFrame([Row(d=dt.date(2024, 2, 29), ts=ts)], "d date, ts timestamp")
    df = df.selectExpr("d", "ts", "timestamp_micros(9223372036854775807) AS inf", "date_from_unix_date(-2147483648) AS ninf")
    assert [r.line for r in copy_lines(df).collect()] == \
        ["2024-02-29\t2024-01-02 03:04:05.000006+00:00\tinfinity\t-infinity"]
