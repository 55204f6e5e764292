"""Spark types across the tested pyspark range: TIME exists from 4.1; on 4.0 staged time values are refused."""

from __future__ import annotations

import pyarrow as pa
import pyspark
import pytest

from airflow_provider_pglogical.apply.sparktypes import HAS_TIME_TYPE, TimeType, require_time_type, time_columns
from airflow_provider_pglogical.exceptions import ApplyError

IMAGE = pa.struct([("id", pa.int32()), ("opens", pa.time64("us")), ("slots", pa.list_(pa.time64("us"))),
                   ("shift", pa.struct([("starts", pa.time64("us")), ("utc_offset", pa.int32())]))])
STAGED = pa.schema([("commit_lsn", pa.int64()), ("old", IMAGE), ("new", IMAGE),
                    ("hours", pa.map_(pa.string(), pa.time64("us")))])


def test_time_values_are_found_wherever_a_staged_file_nests_them():
    assert time_columns(STAGED) == ["old.opens", "old.slots[]", "old.shift.starts", "new.opens", "new.slots[]",
                                    "new.shift.starts", "hours{}"]
    assert time_columns(pa.schema([("id", pa.int32()), ("ts", pa.timestamp("us"))])) == []


def test_a_spark_without_time_refuses_staged_time_values_naming_file_and_columns():
    with pytest.raises(ApplyError) as info:
        require_time_type(pa.schema([("new", pa.struct([("opens", pa.time64("us"))]))]), "batch 0/1-0/2: t/1.parquet",
                          has_time_type=False)
    assert str(info.value) == (f"batch 0/1-0/2: t/1.parquet: new.opens hold PostgreSQL time values, which Spark "
                               f"{pyspark.__version__} cannot read (Spark's TIME type arrived in 4.1): apply with "
                               "pyspark>=4.1")
    require_time_type(pa.schema([("id", pa.int32())]), "t", has_time_type=False)
    require_time_type(STAGED, "t", has_time_type=True)


def test_the_time_type_is_sparks_own_where_spark_has_one():
    major, minor = (int(p) for p in pyspark.__version__.split(".")[:2])
    assert HAS_TIME_TYPE == ((major, minor) >= (4, 1))
    if HAS_TIME_TYPE:
        from pyspark.sql.types import TimeType as Sparks

        assert TimeType is Sparks
    else:
        assert not isinstance(pyspark.sql.types.LongType(), TimeType)
