"""date, time, timetz, timestamp(tz), interval: exact integers, ±infinity kept raw in Arrow."""

from __future__ import annotations

import datetime as dt
import struct

import pyarrow as pa
import pytest

from airflow_provider_pglogical.decoding.model import ColumnDef, RelationSchema, TupleData
from airflow_provider_pglogical.decoding.values import (
    INFINITY,
    NEG_INFINITY,
    BeyondPython,
    Interval,
    RowImageConverter,
    decode_value,
)
from airflow_provider_pglogical.decoding.values import oids as O
from airflow_provider_pglogical.exceptions import DecodeError

UTC = dt.UTC
I32 = struct.Struct("!i")
I64 = struct.Struct("!q")


def dec(oid: int, kind: str, raw: bytes | str):
    return decode_value(kind, raw.encode() if isinstance(raw, str) else raw, ColumnDef("c", oid, -1, False))


def arrow(oid: int, kind: str, raw: bytes | str) -> pa.Array:
    rel = RelationSchema(1, "s", "t", "d", (ColumnDef("c", oid, -1, False),))
    raw = raw.encode() if isinstance(raw, str) else raw
    return RowImageConverter(rel).to_arrow([TupleData(kind, (raw,))]).field(0)


@pytest.mark.parametrize(("days", "text", "want"), [
    (0, "2000-01-01", dt.date(2000, 1, 1)), (-10957, "1970-01-01", dt.date(1970, 1, 1)),
    (8825, "2024-02-29", dt.date(2024, 2, 29)), (2**31 - 1, "infinity", INFINITY), (-(2**31), "-infinity", NEG_INFINITY),
    (-730119, "0001-01-01", dt.date(1, 1, 1)), (-730120, "0001-12-31 BC", BeyondPython("date", -730120)),
    (2145031948, "5874897-12-31", BeyondPython("date", 2145031948)),
])
def test_dates_in_both_forms(days, text, want):
    assert dec(O.DATE, "b", I32.pack(days)) == want == dec(O.DATE, "t", text)


def test_date_arrow_values_shift_to_unix_days_but_keep_infinity_raw():
    assert arrow(O.DATE, "b", I32.pack(0)).cast(pa.int32()).to_pylist() == [10957]
    assert arrow(O.DATE, "t", "infinity").cast(pa.int32()).to_pylist() == [2**31 - 1]
    assert arrow(O.DATE, "b", I32.pack(-(2**31))).cast(pa.int32()).to_pylist() == [-(2**31)]


@pytest.mark.parametrize(("us", "text", "tz", "want"), [
    (0, "2000-01-01 00:00:00", False, dt.datetime(2000, 1, 1)),
    (757_479_845_678_901, "2024-01-02 03:04:05.678901", False, dt.datetime(2024, 1, 2, 3, 4, 5, 678901)),
    (757_472_645_678_901, "2024-01-02 03:04:05.678901+02", True, dt.datetime(2024, 1, 2, 1, 4, 5, 678901, tzinfo=UTC)),
    (757_472_645_000_000, "2024-01-02 06:34:05+05:30", True, dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=UTC)),
    (-1, "1999-12-31 23:59:59.999999", False, dt.datetime(1999, 12, 31, 23, 59, 59, 999999)),
    (2**63 - 1, "infinity", True, INFINITY), (-(2**63), "-infinity", False, NEG_INFINITY),
    (-211813488000000000, "4714-11-24 00:00:00+00 BC", True, BeyondPython("timestamptz", -211813488000000000)),
])
def test_timestamps_in_both_forms(us, text, tz, want):
    oid = O.TIMESTAMPTZ if tz else O.TIMESTAMP
    assert dec(oid, "b", I64.pack(us)) == want == dec(oid, "t", text)


def test_timestamp_arrow_values_are_unix_microseconds_with_raw_infinity():
    ints = [arrow(O.TIMESTAMPTZ, "b", I64.pack(v)).cast(pa.int64())[0].as_py() for v in (0, 2**63 - 1, -(2**63))]
    assert ints == [946_684_800_000_000, 2**63 - 1, -(2**63)]
    assert arrow(O.TIMESTAMPTZ, "b", I64.pack(0)).type == pa.timestamp("us", tz="UTC")


def test_timestamps_beyond_arrow_int64_are_rejected_not_clamped():
    with pytest.raises(DecodeError):
        arrow(O.TIMESTAMP, "b", I64.pack(9223371331200000000 - 1))  # 294276 AD, valid in PostgreSQL


@pytest.mark.parametrize(("text", "tz"), [("2024-01-02", False), ("2024-01-02 03:04:05", True),
                                          ("2024-01-02 03:04:05+00", False), ("2024-13-02 03:04:05", False)])
def test_malformed_timestamp_text_raises(text, tz):
    with pytest.raises(DecodeError):
        dec(O.TIMESTAMPTZ if tz else O.TIMESTAMP, "t", text)


@pytest.mark.parametrize(("us", "text", "want"), [
    (0, "00:00:00", dt.time(0)), (47_655_123_456, "13:14:15.123456", dt.time(13, 14, 15, 123456)),
    (86_400_000_000, "24:00:00", dt.timedelta(days=1)),
])
def test_times_in_both_forms(us, text, want):
    assert dec(O.TIME, "b", I64.pack(us)) == want == dec(O.TIME, "t", text)


@pytest.mark.parametrize(("us", "west", "text", "east"), [
    (3_723_000_000, -19800, "01:02:03+05:30", 19800), (0, 57540, "00:00:00-15:59", -57540), (1, 0, "00:00:00.000001+00", 0),
])
def test_timetz_keeps_the_offset_east_of_utc(us, west, text, east):
    raw = struct.pack("!qi", us, west)
    want = (dt.datetime.min + dt.timedelta(microseconds=us)).time().replace(
        tzinfo=dt.timezone(dt.timedelta(seconds=east)))
    assert dec(O.TIMETZ, "b", raw) == want == dec(O.TIMETZ, "t", text)
    assert arrow(O.TIMETZ, "b", raw).to_pylist() == arrow(O.TIMETZ, "t", text).to_pylist() == [
        {"time": want.replace(tzinfo=None), "utc_offset": east}]


@pytest.mark.parametrize(("fields", "text"), [
    ((14, 3, 14_706_789_000), "1 year 2 mons 3 days 04:05:06.789"), ((0, 0, 0), "00:00:00"),
    ((0, -1, 7_380_000_000), "-1 days +02:03:00"), ((0, 0, -1), "-00:00:00.000001"), ((1, 0, 0), "1 mon"),
    ((-2_136_000_000, 0, 0), "-178000000 years"), ((0, 1, 0), "1 day"),
    ((-13, -1, -3_600_000_000), "-1 years -1 mons -1 days -01:00:00"),
    ((0, 0, 3_600_000_000 * 2_562_047_788), "2562047788:00:00"),
])
def test_intervals_in_both_forms(fields, text):
    months, days, us = fields
    raw = struct.pack("!qii", us, days, months)
    assert dec(O.INTERVAL, "b", raw) == Interval(*fields) == dec(O.INTERVAL, "t", text)
    want = [{"months": months, "days": days, "microseconds": us}]
    assert arrow(O.INTERVAL, "b", raw).to_pylist() == want == arrow(O.INTERVAL, "t", text).to_pylist()


def test_interval_arrow_type_is_a_struct_parquet_and_spark_can_hold():
    assert arrow(O.INTERVAL, "t", "1 mon").type == pa.struct(
        [("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())])


def test_interval_infinity_pg17_is_a_sentinel_and_raw_in_arrow():
    raw = struct.pack("!qii", 2**63 - 1, 2**31 - 1, 2**31 - 1)
    assert dec(O.INTERVAL, "b", raw) is INFINITY and dec(O.INTERVAL, "t", "-infinity") is NEG_INFINITY
    assert arrow(O.INTERVAL, "b", raw).to_pylist() == [
        {"months": 2**31 - 1, "days": 2**31 - 1, "microseconds": 2**63 - 1}]
    assert arrow(O.INTERVAL, "t", "-infinity").to_pylist() == [
        {"months": -(2**31), "days": -(2**31), "microseconds": -(2**63)}]


@pytest.mark.parametrize(("fields", "text"), [
    ((0, 0, 2**63 - 1), "2562047788:00:54.775807"), ((0, 0, -(2**63)), "-2562047788:00:54.775808"),
    ((-(2**31), -(2**31), 2**63 - 1), "-178956970 years -8 mons -2147483648 days +2562047788:00:54.775807"),
])
def test_interval_extremes_fit_the_arrow_struct(fields, text):
    raw = struct.pack("!qii", fields[2], fields[1], fields[0])
    want = [dict(zip(("months", "days", "microseconds"), fields, strict=True))]
    assert arrow(O.INTERVAL, "b", raw).to_pylist() == want == arrow(O.INTERVAL, "t", text).to_pylist()


@pytest.mark.parametrize("text", ["2562047788:00:54.775808", "178956971 years", "2147483648 days"])
def test_interval_text_beyond_postgres_fields_is_rejected(text):
    with pytest.raises(DecodeError):
        dec(O.INTERVAL, "t", text)


@pytest.mark.parametrize(("oid", "raw"), [(O.DATE, b"\x00"), (O.TIME, bytes(7)), (O.TIMETZ, bytes(8)),
                                          (O.TIMESTAMP, bytes(4)), (O.INTERVAL, bytes(12)),
                                          (O.TIME, I64.pack(-1)), (O.TIMETZ, struct.pack("!qi", 0, 90000))])
def test_malformed_temporal_binary_raises(oid, raw):
    with pytest.raises(DecodeError):
        dec(oid, "b", raw)


@pytest.mark.parametrize("text", ["1 year 2", "P1Y2M", "1 yrs", "", "1 day ", "12:00"])
def test_non_postgres_interval_text_raises(text):
    with pytest.raises(DecodeError):
        dec(O.INTERVAL, "t", text)
