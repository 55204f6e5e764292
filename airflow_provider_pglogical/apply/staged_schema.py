"""The Spark schema of a staged Parquet file, known in this process from its footer.

Over Spark Connect every question about a frame's columns or types is a round trip to the server, and for a frame
read from files the server answers it by reading their footers. This process reads the same footers anyway
(``StagingReader.read_schema``, before a file is handed to Spark), so the apply gives Spark's Parquet reader the
schema it would infer (``spark_schema``) and a Spark Connect client holds the frames' schemas (``known``): the server reads no footer to plan,
and the frame's columns and types cost no round trip. A staged type outside the list ``spark_schema`` knows gives
None, and the server infers the file's schema as before. ``tests/unit/apply/test_staged_schema.py`` compares the two
on staged files of every type.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_provider_pglogical.apply.sparkenv import is_connect
from airflow_provider_pglogical.apply.staged_arrow import spark_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType


def spark_schema(schema: pa.Schema) -> StructType | None:
    """The schema Spark's Parquet reader infers for a staged file of Arrow ``schema`` (every field nullable, as a
    file source gives it; a timestamp without time zone ``timestamp_ntz``; unsigned integers widened as
    ``staged_arrow.spark_type`` says), or None when a type is outside those staging writes."""
    from pyspark.sql.types import StructField, StructType

    fields = []
    for field in schema:
        dtype = _spark(spark_type(field.type))
        if dtype is None:
            return None
        fields.append(StructField(field.name, dtype, nullable=True))
    return StructType(fields)


def _spark(at: pa.DataType) -> DataType | None:
    """``at`` (already as ``spark_type`` gives it) as the Spark type its Parquet column reads as, units included."""
    from pyspark.sql import types as T

    if pa.types.is_struct(at):
        children = [(f.name, _spark(f.type)) for f in at]
        if any(t is None for _, t in children):
            return None
        return T.StructType([T.StructField(n, t, nullable=True) for n, t in children if t is not None])
    if pa.types.is_list(at) or pa.types.is_large_list(at):
        element = _spark(at.value_type)
        return None if element is None else T.ArrayType(element, containsNull=True)
    if pa.types.is_map(at):
        key, item = _spark(at.key_type), _spark(at.item_type)
        return None if key is None or item is None else T.MapType(key, item, valueContainsNull=True)
    if pa.types.is_decimal128(at) or pa.types.is_decimal256(at):
        return T.DecimalType(at.precision, at.scale) if 0 <= at.scale <= at.precision <= 38 else None
    if pa.types.is_timestamp(at):
        if at.unit != "us" or at.tz not in (None, "UTC", "+00:00"):
            return None
        return T.TimestampNTZType() if at.tz is None else T.TimestampType()
    if pa.types.is_time64(at):
        return T.TimeType(6) if at.unit == "us" else None
    return _scalars().get(at)


@functools.cache
def _scalars() -> dict[pa.DataType, DataType]:
    from pyspark.sql import types as T

    return {pa.bool_(): T.BooleanType(), pa.int8(): T.ByteType(), pa.int16(): T.ShortType(),
            pa.int32(): T.IntegerType(), pa.int64(): T.LongType(), pa.float32(): T.FloatType(),
            pa.float64(): T.DoubleType(), pa.string(): T.StringType(), pa.large_string(): T.StringType(),
            pa.binary(): T.BinaryType(), pa.large_binary(): T.BinaryType(), pa.date32(): T.DateType()}


def known(df: DataFrame, schema: StructType) -> DataFrame:
    """``df``, its schema ``schema`` held by a Spark Connect client, which then answers ``columns``/``schema`` (and
    ``mapInArrow``'s input columns) without asking the server. The plan is left as it is (``DataFrame.to`` would
    rebuild every struct column); a classic session analyses in process and holds nothing. ``schema`` must be
    ``df``'s own up to nullability (what the steps read of it are names and types)."""
    if is_connect(df) and hasattr(df, "_cached_schema"):
        df._cached_schema = schema  # type: ignore[attr-defined]  # the client's cache an analysis would fill
    return df
