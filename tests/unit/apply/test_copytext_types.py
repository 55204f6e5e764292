"""Staged temporal/interval values and exactness notes → PostgreSQL text, built by Spark expressions (no database)."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply.meta import META
from airflow_provider_pglogical.apply.notes import fold_notes, inherit_toast_notes
from airflow_provider_pglogical.apply.targets.postgres.copytext import SESSION_CONF, copy_lines
from airflow_provider_pglogical.decoding.values.interval import ARROW_TYPE as INTERVAL
from airflow_provider_pglogical.decoding.values.temporal import TimetzCodec
from tests.support.sparkconf import session_conf

TIMETZ = TimetzCodec.arrow_type
I32_MAX, I32_MIN, I64_MAX, I64_MIN = 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)
DAY_US = 86_400_000_000


@pytest.fixture
def staged(spark, tmp_path):
    """Write columns with pyarrow exactly as staging does, read them back with Spark, return the COPY cells."""
    def read(columns: dict[str, pa.Array]) -> list[list[str]]:
        path = str(tmp_path / f"t{len(list(tmp_path.iterdir()))}.parquet")
        pq.write_table(pa.table(columns), path)
        return [r.line.split("\t") for r in copy_lines(spark.read.parquet(path)).collect()]

    with session_conf(spark, SESSION_CONF):  # put back after the test: the session is the worker's
        yield read


def column(got: list[list[str]], i: int = 0) -> list[str]:
    return [row[i] for row in got]


def test_dates_are_printed_ad_bc_with_any_year_width_and_raw_infinities(staged):
    days = [-719162, -719163, -736330, -2440588, 2932897, 2145042905, I32_MAX, I32_MIN, None]  # from PostgreSQL
    assert column(staged({"d": pa.array(days, pa.date32())})) == [
        "0001-01-01", "0001-12-31 BC", "0048-12-31 BC", "4714-11-24 BC", "10000-01-01", "5874897-12-31",
        "infinity", "-infinity", "\\N"]


def test_timestamps_keep_microseconds_bc_and_big_years_and_utc_offset(staged):
    us = [-62_135_596_800_000_001, -210_863_520_000_000_000, 253_402_300_800_000_000, 0, I64_MAX, I64_MIN, None]
    got = staged({"ts": pa.array(us, pa.timestamp("us")), "tz": pa.array(us, pa.timestamp("us", tz="UTC"))})
    assert column(got) == ["0001-12-31 23:59:59.999999 BC", "4713-01-01 00:00:00.000000 BC",
                           "10000-01-01 00:00:00.000000", "1970-01-01 00:00:00.000000", "infinity", "-infinity", "\\N"]
    assert column(got, 1)[:4] == ["0001-12-31 23:59:59.999999+00:00 BC", "4713-01-01 00:00:00.000000+00:00 BC",
                                  "10000-01-01 00:00:00.000000+00:00", "1970-01-01 00:00:00.000000+00:00"]


def test_time_24_00_and_timetz_offsets_east_of_utc(staged):
    got = staged({
        "t": pa.array([0, DAY_US, 3_723_000_001, None], pa.time64("us")),
        "tz": pa.array([{"time": DAY_US, "utc_offset": 20700}, {"time": 1, "utc_offset": -12600},
                        {"time": 45_296_789_012, "utc_offset": -57599}, None], TIMETZ),
    })
    assert column(got) == ["00:00:00.000000", "24:00:00.000000", "01:02:03.000001", "\\N"]
    assert column(got, 1) == ["24:00:00.000000+05:45:00", "00:00:00.000001-03:30:00", "12:34:56.789012-15:59:59", "\\N"]


def test_intervals_keep_each_field_with_its_own_sign_and_raw_infinity_fields(staged):
    got = staged({"iv": pa.array([(14, -3, -(2**63)), (0, 0, 0), (-(2**31), 5, I64_MAX), (I32_MAX, I32_MAX, I64_MAX),
                                  (I32_MIN, I32_MIN, I64_MIN), None, (1, -1, -3_599_999_999)], INTERVAL),
                  "a": pa.array([[(1, 2, 3), None], [], None, None, None, None, None], pa.list_(INTERVAL))})
    # 17+ reads the raw infinity fields back as ±infinity (tests/integration/test_apply_types.py)
    assert column(got) == ["+14 mons -3 days -9223372036854775808 microseconds", "+0 mons +0 days +0:00:00.000000",
                           "-2147483648 mons +5 days +2562047788:00:54.775807",
                           "+2147483647 mons +2147483647 days +2562047788:00:54.775807",
                           "-2147483648 mons -2147483648 days -9223372036854775808 microseconds", "\\N",
                           "+1 mons -1 days -0:59:59.999999"]
    assert column(got, 1)[:3] == ['{"+1 mons +2 days +0:00:00.000003",NULL}', "{}", "\\N"]


def test_arrays_of_temporal_values_use_the_same_text(staged):
    got = staged({"d": pa.array([[-736330, I32_MAX]], pa.list_(pa.date32())),
                  "t": pa.array([[DAY_US]], pa.list_(pa.time64("us")))})
    assert got == [['{"0048-12-31 BC","infinity"}', '{"24:00:00.000000"}']]


NOTED = pa.struct([("id", pa.int32()), ("n", pa.decimal128(10, 2)), ("grid", pa.list_(pa.int32())),
                   ("an", pa.list_(pa.decimal128(6, 2)))])


def _changes(spark, tmp_path, rows: list[dict]):
    """A working frame shaped like read_changes' output (only the columns the note steps use)."""
    notes = pa.map_(pa.string(), pa.string())
    table = pa.table({
        "new": pa.array([r.get("new") for r in rows], NOTED), "old": pa.array([r.get("old") for r in rows], NOTED),
        "new_unchanged_toast": pa.array([r.get("toast", []) for r in rows], pa.list_(pa.string())),
        "new_value_notes": pa.array([list(r.get("new_notes", {}).items()) for r in rows], notes),
        "old_value_notes": pa.array([list(r.get("old_notes", {}).items()) for r in rows], notes),
    })
    path = str(tmp_path / "changes.parquet")
    pq.write_table(table, path)
    df = spark.read.parquet(path)
    return df.select(*[F.col(c).alias(META + c) for c in df.columns])


def _new_lines(df) -> list[list[str]]:
    flat = df.select(*[F.col(META + "new").getField(c).alias(c) for c in NOTED.names])
    return [r.line.split("\t") for r in copy_lines(flat).collect()]


def test_folded_notes_restore_nan_shapes_and_nan_elements(spark, tmp_path):
    df = _changes(spark, tmp_path, [
        {"new": {"id": 1, "n": None, "grid": [1, 2, 3, 4, 5, None], "an": [None, Decimal("-1.5")]},
         "new_notes": {"n": "NaN", "grid": "[0:1][-2:0]", "an": "[2:3]", "an[0]": "NaN"}},
        {"new": {"id": 2, "n": 1, "grid": list(range(8)), "an": [None]}, "new_notes": {"grid": "[1:2][1:2][0:1]"}},
        {"new": {"id": 3, "n": None, "grid": [7], "an": []}, "new_notes": {"grid": "[-3:-3]"}},
        {"new": {"id": 4, "n": None, "grid": None, "an": [None, None]}, "new_notes": {"an[1]": "NaN"}},
    ])
    assert _new_lines(df.transform(fold_notes)) == [
        ["1", "NaN", '[0:1][-2:0]={{"1","2","3"},{"4","5",NULL}}', '[2:3]={"NaN","-1.50"}'],
        ["2", "1.00", '[1:2][1:2][0:1]={{{"0","1"},{"2","3"}},{{"4","5"},{"6","7"}}}', "{NULL}"],
        ["3", "\\N", '[-3:-3]={"7"}', "{}"],
        ["4", "\\N", "\\N", '{NULL,"NaN"}'],
    ]


def test_an_unchanged_toast_value_taken_from_the_old_image_takes_its_notes_too(spark, tmp_path):
    old = {"id": 1, "n": None, "grid": [1, 2, 3, 4], "an": [None]}
    df = _changes(spark, tmp_path, [
        # 'u' grid: resolve_toast_from_old will copy old.grid, so its shape note must come along
        {"old": old, "old_notes": {"n": "NaN", "grid": "[0:1][0:1]", "an[0]": "NaN"},
         "new": {"id": 1, "n": 5, "grid": None, "an": [None]}, "new_notes": {"an[0]": "NaN"}, "toast": ["grid"]},
        # nothing unchanged: the old image's notes stay out of the new image
        {"old": old, "old_notes": {"grid": "[0:1][0:1]"}, "new": {"id": 1, "n": None, "grid": [9], "an": None}},
    ])
    got = df.transform(inherit_toast_notes)
    assert [dict(r[0]) for r in got.select(META + "new_value_notes").collect()] == [
        {"an[0]": "NaN", "grid": "[0:1][0:1]"}, {}]
    filled = got.withColumn(META + "new", F.struct(*[
        (F.col(META + "old.grid") if c == "grid" else F.col(META + "new").getField(c)).alias(c) for c in NOTED.names]))
    assert _new_lines(filled.transform(fold_notes))[0] == ["1", "5.00", '[0:1][0:1]={{"1","2"},{"3","4"}}', '{"NaN"}']


def test_frames_without_note_capable_columns_are_left_alone(spark):
    df = spark.createDataFrame([((1,), None)], f"{META}new struct<id:int>, {META}old struct<id:int>")
    assert df.transform(fold_notes).schema == df.schema
