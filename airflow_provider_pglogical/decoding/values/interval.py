"""interval: months, days and microseconds kept apart, as PostgreSQL stores them; 17+ ±infinity.

Arrow form: ``struct<months int32, days int32, microseconds int64>`` — PostgreSQL's own three
fields. Arrow's month_day_nano_interval cannot be written to Parquet (pyarrow has no Parquet
mapping for it), is not readable by Spark, and its nanoseconds overflow beyond ±292 years of time.
The struct holds every PostgreSQL interval, the 17+ infinities included, as plain integers.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import pyarrow as pa

from airflow_provider_pglogical.decoding.values.codec import Codec, Notes, expect_len
from airflow_provider_pglogical.decoding.values.sentinels import INFINITY, NEG_INFINITY, Interval
from airflow_provider_pglogical.exceptions import DecodeError

_INTERVAL = struct.Struct("!qii")  # time µs, days, months
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INTERVAL_NOEND = Interval(INT32_MAX, INT32_MAX, INT64_MAX)  # PG 17+ 'infinity' (timestamp.h)
INTERVAL_NOBEGIN = Interval(INT32_MIN, INT32_MIN, INT64_MIN)
ARROW_TYPE = pa.struct([("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())])

# IntervalStyle 'postgres' (the default): "1 year 2 mons -3 days +04:05:06.789", "00:00:00"
_POSTGRES_STYLE = re.compile(
    r"(?:([+-]?\d+) years? ?)?(?:([+-]?\d+) mons? ?)?(?:([+-]?\d+) days? ?)?"
    r"(?:([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
)


def parse_interval(text: str) -> Interval:
    if text == "infinity":
        return INTERVAL_NOEND
    if text == "-infinity":
        return INTERVAL_NOBEGIN
    m = _POSTGRES_STYLE.fullmatch(text)
    if not text or not m or text.endswith(" "):
        raise DecodeError("invalid interval text value (IntervalStyle must be postgres)")
    years, mons, days, sign, h, mi, s, frac = m.groups()
    us = ((int(h or 0) * 60 + int(mi or 0)) * 60 + int(s or 0)) * 1_000_000 + int((frac or "").ljust(6, "0"))
    iv = Interval(int(years or 0) * 12 + int(mons or 0), int(days or 0), -us if sign == "-" else us)
    if not (INT32_MIN <= iv.months <= INT32_MAX and INT32_MIN <= iv.days <= INT32_MAX
            and INT64_MIN <= iv.microseconds <= INT64_MAX):
        raise DecodeError("interval text value out of range")
    return iv


def _python(iv: Interval) -> Any:
    if iv == INTERVAL_NOEND:
        return INFINITY
    if iv == INTERVAL_NOBEGIN:
        return NEG_INFINITY
    return iv


class IntervalCodec(Codec):
    """struct<months, days, microseconds>, never normalised. +infinity is (INT32_MAX, INT32_MAX,
    INT64_MAX), −infinity the MINs — the same raw fields PostgreSQL 17+ stores, so the Arrow value
    is always the Interval itself (a tuple pyarrow takes as a struct)."""

    name, arrow_type = "interval", ARROW_TYPE

    def fields_binary(self, raw: bytes) -> Interval:
        expect_len(raw, 16, self.name)
        us, days, months = _INTERVAL.unpack(raw)
        return Interval(months, days, us)

    def from_binary(self, raw: bytes) -> Any:
        return _python(self.fields_binary(raw))

    def from_text(self, text: str) -> Any:
        return _python(parse_interval(text))

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> Interval:
        return self.fields_binary(raw)

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> Interval:
        return parse_interval(text)
