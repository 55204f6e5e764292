"""The Spark schema of a staged Parquet file, known in this process from its footer.

Over Spark Connect every question about a frame's columns or types is a round trip to the server, and for a frame
read from files the server answers it by reading their footers. This process reads the same footers anyway
(``StagingReader.read_schema``, before a file is handed to Spark), so the apply gives Spark's Parquet reader the
schema it would infer (``executor_reads.spark_schema``, the schema the executors' reads give too) and a Spark
Connect client holds the frames' schemas (``known``): the server reads no footer to plan, and the frame's columns
and types cost no round trip. A staged type outside those ``spark_schema`` knows gives None, and the server infers
the file's schema as before. ``tests/unit/apply/test_staged_schema.py`` compares the two
on staged files of every type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_pglogical.apply.sparkenv import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


def known(df: DataFrame, schema: StructType) -> DataFrame:
    """``df``, its schema ``schema`` held by a Spark Connect client, which then answers ``columns``/``schema`` (and
    ``mapInArrow``'s input columns) without asking the server. The plan is left as it is (``DataFrame.to`` would
    rebuild every struct column); a classic session analyses in process and holds nothing. ``schema`` must be
    ``df``'s own up to nullability (what the steps read of it are names and types)."""
    if is_connect(df) and hasattr(df, "_cached_schema"):
        df._cached_schema = schema  # type: ignore[attr-defined]  # the client's cache an analysis would fill
    return df
