"""PostgreSQL input text of staged dates, times and intervals, as Spark expressions (integer arithmetic only).

Spark's own formatting is not used: it prints negative proleptic years where PostgreSQL wants
``0044-03-15 BC`` (and 1 BC is astronomical year 0), cannot format ``24:00:00`` (its TIME stops
at 23:59:59.999999) and has no interval type for the staged struct. Every value is taken apart
into integers and printed as zero-padded decimal text (``_pad``: cast and lpad, compiled code — Java's
``format_string`` costs several µs per call and was most of the apply's Spark time), in a form
PostgreSQL's input functions read exactly, whatever the target session's DateStyle, IntervalStyle
or TimeZone.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, IntegerType, LongType, StructType

from airflow_provider_pglogical.apply.sparktypes import TimeType

INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
USECS_PER_SEC = 1_000_000
USECS_PER_HOUR = 3_600 * USECS_PER_SEC
USECS_PER_DAY = 24 * USECS_PER_HOUR

INTERVAL_FIELDS = (("months", IntegerType), ("days", IntegerType), ("microseconds", LongType))
TIMETZ_FIELDS = (("time", TimeType), ("utc_offset", IntegerType))


def _is_struct_of(dtype: DataType, fields: tuple[tuple[str, type], ...]) -> bool:
    return (isinstance(dtype, StructType) and len(dtype.fields) == len(fields)
            and all(f.name == n and isinstance(f.dataType, t) for f, (n, t) in zip(dtype.fields, fields, strict=True)))


def is_interval(dtype: DataType) -> bool:
    """The staged interval struct (decoding/values/interval.py)."""
    return _is_struct_of(dtype, INTERVAL_FIELDS)


def is_timetz(dtype: DataType) -> bool:
    """The staged timetz struct: time of day plus utc_offset in seconds east of UTC."""
    return _is_struct_of(dtype, TIMETZ_FIELDS)


def _div(a: Column, b: Column | int) -> Column:
    """Integral division truncating toward zero (Java's), exact for any int64 — no detour through doubles."""
    return F.call_function("div", a, b if isinstance(b, Column) else F.lit(b))


def _pad(n: Column, width: int) -> Column:
    """Decimal text of an integer n ≥ 0, zero-padded to ``width`` digits (printf's ``%0<width>d``): wider numbers
    are printed whole (``lpad`` alone would cut them)."""
    text = n.cast("string")
    return F.when(n < 10 ** (width - 1), F.lpad(text, width, "0")).otherwise(text)


def _signed(n: Column) -> Column:
    """printf's ``%+d``: an explicit sign."""
    return F.concat(F.when(n < 0, F.lit("")).otherwise(F.lit("+")), n.cast("string"))


def _date_parts(date: Column) -> tuple[Column, Column]:
    """('YYYY-MM-DD' with the year counted AD/BC, is_bc) of a Spark date (proleptic Gregorian, as PostgreSQL)."""
    year = F.year(date)
    bc = year <= 0
    text = F.concat(_pad(F.when(bc, 1 - year).otherwise(year), 4), F.lit("-"), _pad(F.month(date), 2), F.lit("-"),
                    _pad(F.dayofmonth(date), 2))
    return text, bc


def _bc(bc: Column) -> Column:
    return F.when(bc, F.lit(" BC")).otherwise(F.lit(""))


def _clock(us_of_day: Column) -> Column:
    """HH:MM:SS.ffffff of 0 ≤ µs ≤ 24 h (24:00:00 is a valid PostgreSQL time)."""
    secs = _div(us_of_day, USECS_PER_SEC)
    return F.concat(_pad(_div(secs, 3600), 2), F.lit(":"), _pad(_div(secs, 60) % 60, 2), F.lit(":"),
                    _pad(secs % 60, 2), F.lit("."), _pad(us_of_day % USECS_PER_SEC, 6))


def _infinite(value: Column, high: int, low: int, finite: Column) -> Column:
    return F.when(value == high, F.lit("infinity")).when(value == low, F.lit("-infinity")).otherwise(finite)


def date_text(c: Column) -> Column:
    """'2024-02-29', '0044-03-15 BC', '10000-01-01'; staged INT32_MAX/MIN are ±infinity."""
    text, bc = _date_parts(c)
    return _infinite(F.unix_date(c), INT32_MAX, INT32_MIN, F.concat(text, _bc(bc)))


def timestamp_text(c: Column, with_tz: bool) -> Column:
    """'YYYY-MM-DD HH:MM:SS.ffffff[+00:00][ BC]'; staged INT64_MAX/MIN are ±infinity.

    timestamptz is staged in UTC and printed with an explicit +00:00, so the target's TimeZone does
    not matter. A timestamp without time zone goes through the session time zone, which must be UTC.
    """
    us = F.unix_micros(c if with_tz else c.cast("timestamp"))
    of_day = F.pmod(us, F.lit(USECS_PER_DAY))
    # floor division without `us - of_day`, which would overflow next to INT64_MIN
    days = _div(us, USECS_PER_DAY) - F.when(us % USECS_PER_DAY < 0, 1).otherwise(0)
    date = F.date_from_unix_date(days.cast("int"))
    text, bc = _date_parts(date)
    finite = F.concat(text, F.lit(" "), _clock(of_day), F.lit("+00:00" if with_tz else ""), _bc(bc))
    return _infinite(us, INT64_MAX, INT64_MIN, finite)


def time_text(c: Column) -> Column:
    """Spark TIME (needs spark.sql.timeType.enabled to read time64 Parquet) → 'HH:MM:SS.ffffff'.

    ``time_to_micros`` reads the raw value, so PostgreSQL's 24:00:00 survives (Spark would fail to
    format it).
    """
    return _clock(F.time_to_micros(c))


def timetz_text(c: Column) -> Column:
    """'HH:MM:SS.ffffff+hh:mm:ss': the staged offset is seconds EAST of UTC, i.e. ISO's sign.

    (PostgreSQL's binary form stores seconds west; the decoder flipped it, and timetz_in reads
    '+05:45' as east again.)
    """
    offset = c.getField("utc_offset")
    size = F.abs(offset)
    zone = F.concat(F.when(offset < 0, F.lit("-")).otherwise(F.lit("+")), _pad(_div(size, 3600), 2), F.lit(":"),
                    _pad(_div(size, 60) % 60, 2), F.lit(":"), _pad(size % 60, 2))
    return F.concat(time_text(c.getField("time")), zone)


def interval_text(c: Column) -> Column:
    """'+M mons +D days ±H:MM:SS.ffffff': PostgreSQL's three fields, each with its own sign, never normalised.

    Explicit signs keep the fields independent under every IntervalStyle (sql_standard would
    otherwise spread a leading minus). The clock form parses on PostgreSQL 14 too (which reads
    every field, hours included, as int32: fine below ~245,000 years); the one time value no clock
    text can give back, INT64_MIN µs (interval_out prints '-2562047788:00:54.775808', which
    interval_in rejects), is written as integer microseconds, which 15+ parse to the int64
    extremes. PostgreSQL 17's ±infinity is staged as its raw all-MAX / all-MIN fields, and this
    text of them is what 17+ reads back as ±infinity (≤ 16, where those fields are a finite
    interval, reads that same finite value), so no target version needs a special case.
    """
    months, days, us = c.getField("months"), c.getField("days"), c.getField("microseconds")
    hours = _div(us, USECS_PER_HOUR)  # truncates toward zero: no abs() of INT64_MIN anywhere
    rest = F.abs(us % USECS_PER_HOUR)
    clock = F.concat(F.when(us < 0, F.lit("-")).otherwise(F.lit("+")), F.abs(hours).cast("string"), F.lit(":"),
                     _pad(_div(rest, 60 * USECS_PER_SEC), 2), F.lit(":"), _pad(_div(rest, USECS_PER_SEC) % 60, 2),
                     F.lit("."), _pad(rest % USECS_PER_SEC, 6))
    time = F.when(us == INT64_MIN, F.lit(f"{INT64_MIN} microseconds")).otherwise(clock)
    return F.concat(_signed(months), F.lit(" mons "), _signed(days), F.lit(" days "), time)
