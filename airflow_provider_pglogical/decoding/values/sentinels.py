"""Sentinel and small record types for values that have no plain Python equivalent."""

from __future__ import annotations

from typing import Any, NamedTuple


class _Sentinel:
    """A named singleton that compares by identity and survives copy/pickle as itself."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name


UNCHANGED_TOAST = _Sentinel("UNCHANGED_TOAST")
"""A column sent as 'u': the value did not change and was not sent. Never the same as NULL."""

INFINITY = _Sentinel("INFINITY")
"""PostgreSQL ``infinity`` of date, timestamp, timestamptz and (17+) interval."""

NEG_INFINITY = _Sentinel("NEG_INFINITY")
"""PostgreSQL ``-infinity`` of date, timestamp, timestamptz and (17+) interval."""


class Interval(NamedTuple):
    """An interval exactly as PostgreSQL stores it: the three fields never normalise into each other."""

    months: int
    days: int
    microseconds: int


class Range(NamedTuple):
    """A range value; an unbounded side has bound ``None`` and is never inclusive."""

    lower: Any
    upper: Any
    lower_inclusive: bool
    upper_inclusive: bool
    empty: bool = False


class PgArray(NamedTuple):
    """An array whose lower bounds are not all 1; ``value`` is the nested list as for other arrays."""

    lower_bounds: tuple[int, ...]
    value: list[Any]


class BeyondPython(NamedTuple):
    """A finite date/timestamp outside Python's years 1-9999 (BC dates, year 294276): PostgreSQL's
    own integer (days or µs since 2000-01-01, UTC for timestamptz), kept exactly."""

    type_name: str
    pg_value: int
