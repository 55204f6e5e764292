"""Typed values: pgoutput 'b'/'t' column bytes into exact Python values and Arrow arrays (see docs/types.md)."""

from airflow_provider_pglogical.decoding.values.arrow import RowImageConverter
from airflow_provider_pglogical.decoding.values.catalog import TypeCatalog, UserType
from airflow_provider_pglogical.decoding.values.registry import arrow_type_for, codec_for, decode_value
from airflow_provider_pglogical.decoding.values.sentinels import (
    INFINITY,
    NEG_INFINITY,
    UNCHANGED_TOAST,
    BeyondPython,
    Interval,
    PgArray,
    Range,
)

__all__ = [
    "BeyondPython", "INFINITY", "NEG_INFINITY", "UNCHANGED_TOAST", "Interval", "PgArray", "Range", "RowImageConverter",
    "TypeCatalog", "UserType", "arrow_type_for", "codec_for", "decode_value",
]
