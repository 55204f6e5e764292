"""Spark SQL types that not every pyspark of the tested range has (docs/spark.md#versions).

Spark's TIME type arrived in 4.1. On 4.0 no frame can hold a TIME column (its Parquet reader refuses
PostgreSQL's staged ``time``, see ``time_columns``), so ``TimeType`` there is a type no value is an instance of
and the code that formats TIME values never matches.
"""

from __future__ import annotations

import pyarrow as pa
import pyspark
import pyspark.sql.types as spark_types

from airflow_provider_pglogical.exceptions import ApplyError


class _NoTimeType(spark_types.DataType):
    """Stands for Spark's TIME type on a Spark without one: nothing is an instance of it."""


TimeType: type[spark_types.DataType] = getattr(spark_types, "TimeType", _NoTimeType)
HAS_TIME_TYPE = TimeType is not _NoTimeType


def time_columns(schema: pa.Schema) -> list[str]:
    """Dotted paths of the TIME values in a staged file's ``schema`` (``new.opens``, ``old.slots[]``), nested in
    row images, composites, arrays and maps too."""
    found: list[str] = []

    def walk(path: str, dtype: pa.DataType) -> None:
        if pa.types.is_time(dtype):
            found.append(path)
        elif pa.types.is_struct(dtype):
            for f in dtype:
                walk(f"{path}.{f.name}", f.type)
        elif pa.types.is_map(dtype):
            walk(f"{path}{{}}", dtype.key_type)
            walk(f"{path}{{}}", dtype.item_type)
        elif pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
            walk(f"{path}[]", dtype.value_type)

    for f in schema:
        walk(f.name, f.type)
    return found


def require_time_type(schema: pa.Schema, what: str, *, has_time_type: bool = HAS_TIME_TYPE) -> None:
    """Refuse a staged file with TIME values on a Spark without a TIME type, before Spark tries to read it (its
    Parquet reader and ``createDataFrame`` fail there with errors that name neither the file nor the column)."""
    if has_time_type:
        return
    paths = time_columns(schema)
    if paths:
        raise ApplyError(f"{what}: {', '.join(paths)} hold PostgreSQL time values, which Spark {pyspark.__version__} "
                         "cannot read (Spark's TIME type arrived in 4.1): apply with pyspark>=4.1")
