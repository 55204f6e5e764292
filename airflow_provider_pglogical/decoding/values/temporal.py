"""date, time, timetz, timestamp, timestamptz: PostgreSQL's integer forms, ±infinity kept exactly."""

from __future__ import annotations

import datetime as dt
import re
import struct
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_provider_pglogical.decoding.values.codec import Codec, Notes, expect_len
from airflow_provider_pglogical.decoding.values.sentinels import INFINITY, NEG_INFINITY, BeyondPython
from airflow_provider_pglogical.decoding.values.vector import Column, fixed_width, with_mask
from airflow_provider_pglogical.exceptions import DecodeError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DATEVAL_NOBEGIN, DATEVAL_NOEND = INT32_MIN, INT32_MAX  # utils/date.h
DT_NOBEGIN, DT_NOEND = INT64_MIN, INT64_MAX  # datatype/timestamp.h
POSTGRES_EPOCH = dt.date(2000, 1, 1)
PG_TO_UNIX_DAYS = 10957  # days from 1970-01-01 to 2000-01-01
USECS_PER_SEC = 1_000_000
USECS_PER_DAY = 86_400 * USECS_PER_SEC
PG_TO_UNIX_USECS = PG_TO_UNIX_DAYS * USECS_PER_DAY  # 946684800000000
# Largest PostgreSQL timestamp whose Unix-epoch µs still fits int64 below the +infinity value
ARROW_TS_MAX = INT64_MAX - PG_TO_UNIX_USECS - 1
ARROW_DATE_MAX = INT32_MAX - PG_TO_UNIX_DAYS - 1

_DATE = struct.Struct("!i")  # days since 2000-01-01
_TIME = struct.Struct("!q")  # µs since midnight
_TIMETZ = struct.Struct("!qi")  # µs since midnight, zone in seconds WEST of UTC
_TS = struct.Struct("!q")  # µs since 2000-01-01 00:00:00 (UTC for timestamptz)

_DATE_RE = r"(\d{4,})-(\d\d)-(\d\d)"
_TIME_RE = r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
_ZONE_RE = r"([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?"
_DATE_TEXT = re.compile(_DATE_RE + r"( BC)?")
_TIME_TEXT = re.compile(_TIME_RE)
_TIMETZ_TEXT = re.compile(_TIME_RE + _ZONE_RE)
_TS_TEXT = re.compile(_DATE_RE + " " + _TIME_RE + f"(?:{_ZONE_RE})?" + r"( BC)?")


def days_from_civil(y: int, m: int, d: int) -> int:
    """Proleptic Gregorian date (astronomical year: 1 BC is 0) → days since 2000-01-01."""
    if not (1 <= m <= 12 and 1 <= d <= 31):
        raise DecodeError("invalid date text value")
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468 - PG_TO_UNIX_DAYS


def _year(text: str, bc: str | None) -> int:
    return 1 - int(text) if bc else int(text)


def _usecs(h: str, mi: str, s: str, frac: str | None) -> int:
    return ((int(h) * 60 + int(mi)) * 60 + int(s)) * USECS_PER_SEC + int((frac or "").ljust(6, "0"))


def _zone_seconds(sign: str, h: str, mi: str | None, s: str | None) -> int:
    """Seconds EAST of UTC, as printed (+05:30 is 19800)."""
    secs = int(h) * 3600 + int(mi or 0) * 60 + int(s or 0)
    return -secs if sign == "-" else secs


def python_date(days: int) -> Any:
    if days == DATEVAL_NOEND:
        return INFINITY
    if days == DATEVAL_NOBEGIN:
        return NEG_INFINITY
    try:
        return POSTGRES_EPOCH + dt.timedelta(days=days)
    except OverflowError:
        return BeyondPython("date", days)


def python_timestamp(us: int, tz: dt.tzinfo | None) -> Any:
    if us == DT_NOEND:
        return INFINITY
    if us == DT_NOBEGIN:
        return NEG_INFINITY
    try:
        return dt.datetime(2000, 1, 1, tzinfo=tz) + dt.timedelta(microseconds=us)
    except OverflowError:
        return BeyondPython("timestamptz" if tz else "timestamp", us)


def arrow_date(days: int) -> int:
    if days in (DATEVAL_NOEND, DATEVAL_NOBEGIN):
        return days
    if days > ARROW_DATE_MAX:
        raise DecodeError("date beyond arrow's date32 range")
    return days + PG_TO_UNIX_DAYS


def arrow_timestamp(us: int) -> int:
    if us in (DT_NOEND, DT_NOBEGIN):
        return us
    if us > ARROW_TS_MAX:
        raise DecodeError("timestamp beyond arrow's int64 microsecond range")
    return us + PG_TO_UNIX_USECS


def _unix_epoch_column(col: Column, dtype: str, infinities: tuple[int, int], limit: int, shift: int,
                       too_far: str) -> tuple[np.ndarray, np.ndarray] | None:
    """A date/timestamp column moved from the 2000 to the 1970 epoch, ±infinity sentinels kept as they are.

    None where ``fixed_width`` declines (text values, odd sizes): the per-value path decides then.
    """
    got = fixed_width(col, np.dtype(dtype).itemsize, dtype)
    if got is None:
        return None
    values, mask = got
    finite = (values != infinities[0]) & (values != infinities[1]) & ~mask
    if (values[finite] > limit).any():
        raise DecodeError(too_far)
    return np.where(finite, values + shift, values), mask


class DateCodec(Codec):
    """date32; ±infinity stay PostgreSQL's INT32_MAX/INT32_MIN (never shifted, never clamped)."""

    name, arrow_type = "date", pa.date32()

    def days_binary(self, raw: bytes) -> int:
        expect_len(raw, 4, self.name)
        value: int = _DATE.unpack(raw)[0]
        return value

    def days_text(self, text: str) -> int:
        if text == "infinity":
            return DATEVAL_NOEND
        if text == "-infinity":
            return DATEVAL_NOBEGIN
        m = _DATE_TEXT.fullmatch(text)
        if not m:
            raise DecodeError("invalid date text value")
        return days_from_civil(_year(m.group(1), m.group(4)), int(m.group(2)), int(m.group(3)))

    def from_binary(self, raw: bytes) -> Any:
        return python_date(self.days_binary(raw))

    def from_text(self, text: str) -> Any:
        return python_date(self.days_text(text))

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> int:
        return arrow_date(self.days_binary(raw))

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> int:
        return arrow_date(self.days_text(text))

    def arrow_column(self, col: Column) -> pa.Array | None:
        got = _unix_epoch_column(col, ">i4", (DATEVAL_NOEND, DATEVAL_NOBEGIN), ARROW_DATE_MAX, PG_TO_UNIX_DAYS,
                                 "date beyond arrow's date32 range")
        return None if got is None else with_mask(*got, self.arrow_type)


class TimestampCodec(Codec):
    """timestamp[us] (timestamptz: tz=UTC), Unix epoch; ±infinity stay INT64_MAX/INT64_MIN exactly."""

    def __init__(self, with_tz: bool) -> None:
        self.with_tz = with_tz
        self.name = "timestamptz" if with_tz else "timestamp"
        self.arrow_type = pa.timestamp("us", tz="UTC" if with_tz else None)
        self.tz = dt.UTC if with_tz else None

    def us_binary(self, raw: bytes) -> int:
        expect_len(raw, 8, self.name)
        value: int = _TS.unpack(raw)[0]
        return value

    def us_text(self, text: str) -> int:
        if text == "infinity":
            return DT_NOEND
        if text == "-infinity":
            return DT_NOBEGIN
        m = _TS_TEXT.fullmatch(text)
        if not m or (m.group(8) is None) == self.with_tz:
            raise DecodeError(f"invalid {self.name} text value")
        days = days_from_civil(_year(m.group(1), m.group(12)), int(m.group(2)), int(m.group(3)))
        us = days * USECS_PER_DAY + _usecs(*m.group(4, 5, 6, 7))
        if self.with_tz:
            us -= _zone_seconds(*m.group(8, 9, 10, 11)) * USECS_PER_SEC
        return us

    def from_binary(self, raw: bytes) -> Any:
        return python_timestamp(self.us_binary(raw), self.tz)

    def from_text(self, text: str) -> Any:
        return python_timestamp(self.us_text(text), self.tz)

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> int:
        return arrow_timestamp(self.us_binary(raw))

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> int:
        return arrow_timestamp(self.us_text(text))

    def arrow_column(self, col: Column) -> pa.Array | None:
        got = _unix_epoch_column(col, ">i8", (DT_NOEND, DT_NOBEGIN), ARROW_TS_MAX, PG_TO_UNIX_USECS,
                                 "timestamp beyond arrow's int64 microsecond range")
        return None if got is None else with_mask(*got, self.arrow_type)


def python_time(us: int, tz: dt.tzinfo | None = None) -> dt.time | dt.timedelta:
    if not 0 <= us <= USECS_PER_DAY:
        raise DecodeError("time of day out of range")
    if us == USECS_PER_DAY:  # '24:00:00' is a valid PostgreSQL time; Python's time stops at 23:59:59.999999
        if tz is not None:
            raise DecodeError("timetz 24:00:00 has no python time")
        return dt.timedelta(days=1)
    s, micro = divmod(us, USECS_PER_SEC)
    return dt.time(s // 3600, s // 60 % 60, s % 60, micro, tzinfo=tz)


class TimeCodec(Codec):
    name, arrow_type = "time", pa.time64("us")

    def us_binary(self, raw: bytes) -> int:
        expect_len(raw, 8, self.name)
        value: int = _TIME.unpack(raw)[0]
        return value

    def us_text(self, text: str) -> int:
        m = _TIME_TEXT.fullmatch(text)
        if not m:
            raise DecodeError("invalid time text value")
        return _usecs(*m.groups())

    def from_binary(self, raw: bytes) -> Any:
        return python_time(self.us_binary(raw))

    def from_text(self, text: str) -> Any:
        return python_time(self.us_text(text))

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> int:
        return self.us_binary(raw)

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> int:
        return self.us_text(text)

    def arrow_column(self, col: Column) -> pa.Array | None:
        got = fixed_width(col, 8, ">i8")
        return None if got is None else with_mask(got[0], got[1], self.arrow_type)


class TimetzCodec(Codec):
    """struct<time: time64[us], utc_offset: int32> with the offset in seconds EAST of UTC (ISO sign)."""

    name = "timetz"
    arrow_type = pa.struct([("time", pa.time64("us")), ("utc_offset", pa.int32())])

    def parts_binary(self, raw: bytes) -> tuple[int, int]:
        expect_len(raw, 12, self.name)
        us, west = _TIMETZ.unpack(raw)
        return us, -west

    def parts_text(self, text: str) -> tuple[int, int]:
        m = _TIMETZ_TEXT.fullmatch(text)
        if not m:
            raise DecodeError("invalid timetz text value")
        return _usecs(*m.group(1, 2, 3, 4)), _zone_seconds(*m.group(5, 6, 7, 8))

    @staticmethod
    def _python(us: int, east: int) -> Any:
        if abs(east) >= 86_400:
            raise DecodeError("timetz offset out of range")
        return python_time(us, dt.timezone(dt.timedelta(seconds=east)))

    def from_binary(self, raw: bytes) -> Any:
        return self._python(*self.parts_binary(raw))

    def from_text(self, text: str) -> Any:
        return self._python(*self.parts_text(text))

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> dict[str, int]:
        us, east = self.parts_binary(raw)
        return {"time": us, "utc_offset": east}

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> dict[str, int]:
        us, east = self.parts_text(text)
        return {"time": us, "utc_offset": east}
