"""Staged files read by the executors themselves: the driver plans, the executors open, hash and read the files.

Staging on an object store (``s3://``, ``gs://``, ``abfs://``…) with a master that is not local
(``batches.readable_here``; with a local master this process reads it itself) is read where Spark runs, not on the
driver: on a cluster, or over
Spark Connect, the driver is one machine (or a thin client) and must not be the funnel every staged byte goes
through. The driver reads only what planning needs: manifests and the small metadata files beside them
(relations, truncates, transactions). Every row-change file is opened by an executor, with the filesystem
its own URI resolves to there (``staging.layout.resolve_filesystem``: credentials and endpoint from the
executor's environment, e.g. ``spark.executorEnv.AWS_ACCESS_KEY_ID`` or ``spark.executorEnv.AZURE_STORAGE_ACCOUNT_KEY``,
or the cluster's instance role):

* ``survey`` — one small Spark job per batch, one task per row-change file: the file hashed and its footer
  read (``staging.verify.observe_file``), its Arrow schema, row groups and whether any value carries an
  exactness note. The driver judges the hashes against the manifest (``StagingReader.verify`` with
  ``observed``) before a target sees a row, and keeps the rest for the reads.
* ``read_files`` — a frame of (file, row group) tasks expanded by ``mapInArrow``: each task reads its row
  group with pyarrow and converts it as ``staged_arrow.to_spark_arrow`` does (what Spark's Parquet reader
  gives), in the schema planned from the footer. So the frame is typed exactly as a local staging read.

Only the DataFrame API is used (``createDataFrame``, ``mapInArrow``, ``collect``), so all of this runs over
Spark Connect as well as on a classic session.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from airflow_provider_pglogical.apply.staged_arrow import holds, spark_type, to_spark_arrow
from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging.credentials import is_storage_variable, process_environment
from airflow_provider_pglogical.staging.reader import NOTES_COLUMNS
from airflow_provider_pglogical.staging.verify import Observed

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

# One survey row per file: what ``Observed`` holds, plus what the reads need.
_SURVEY_SCHEMA = pa.schema([
    ("file", pa.string()), ("bytes", pa.int64()), ("sha256", pa.string()), ("rows", pa.int64()),
    ("has_commit_lsns", pa.bool_()), ("min_commit_lsn", pa.int64()), ("max_commit_lsn", pa.int64()),
    ("error", pa.string()), ("row_groups", pa.int64()), ("schema", pa.binary()), ("notes", pa.bool_()),
])
_SURVEY_DDL = ("file string, bytes long, sha256 string, rows long, has_commit_lsns boolean, min_commit_lsn long, "
               "max_commit_lsn long, error string, row_groups long, schema binary, notes boolean")


@dataclass(frozen=True)
class SurveyedFile:
    """One staged file as an executor found it: for the verification (``observed``) and for the reads."""

    observed: Observed
    schema: pa.Schema | None  # its Arrow schema as staged (None when it could not be read)
    row_groups: int
    notes: bool  # whether any image value carries an exactness note


def storage_env(directory: str) -> dict[str, str]:
    """The driver's object-store settings for ``directory`` (``AWS_*``, the GCS and Azure variables, and those of
    credentials registered for its root from a connection: ``staging/credentials.py``), shipped with the tasks as a
    fallback: an executor uses its own environment's first (``_filesystem``). In a local session the Python workers
    may have been started before the driver's environment got them; on a cluster the executors' own settings are
    the ones that count."""
    return {k: v for k, v in process_environment(directory).items() if is_storage_variable(k)}


# The executor's own environment as its Python worker started: its settings win over the driver's. A reused
# worker keeps what earlier tasks set, so a setting it did not start with takes each task's value (the driver's
# staging may have moved, e.g. to another endpoint) instead of the first task's.
_WORKER_ENV = frozenset(k for k in os.environ if is_storage_variable(k))


def _filesystem(directory: str, fallback: dict[str, str]) -> tuple[pafs.FileSystem, str]:
    """Executor side: the filesystem of ``directory`` from this process's environment, completed by ``fallback``."""
    from airflow_provider_pglogical.staging.layout import resolve_filesystem

    for key, value in fallback.items():
        if key not in _WORKER_ENV:
            os.environ[key] = value
    return resolve_filesystem(directory)


def _survey_file(directory: str, relative: str, fallback: dict[str, str]) -> dict[str, object]:
    """Executor side: one file hashed, its footer, schema and notes read."""
    import pyarrow.parquet as pq

    from airflow_provider_pglogical.staging.verify import observe_file

    fs, root = _filesystem(directory, fallback)
    path = f"{root}/{relative}"
    found = observe_file(fs, path)
    row = {"file": relative, "bytes": found.bytes, "sha256": found.sha256, "rows": found.rows,
           "has_commit_lsns": found.commit_lsns is not None,
           "min_commit_lsn": found.commit_lsns[0] if found.commit_lsns else None,
           "max_commit_lsn": found.commit_lsns[1] if found.commit_lsns else None,
           "error": found.error, "row_groups": 0, "schema": None, "notes": True}
    if found.error is None:
        parquet = pq.ParquetFile(path, filesystem=fs)
        schema = parquet.schema_arrow
        present = [c for c in NOTES_COLUMNS if c in schema.names]
        notes = bool(present) and any(len(chunk.keys) for column in parquet.read(columns=present).columns
                                      for chunk in column.chunks)
        row.update(row_groups=parquet.metadata.num_row_groups, schema=schema.serialize().to_pybytes(), notes=notes)
    return row


def _surveyor(directory: str, fallback: dict[str, str]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = [_survey_file(directory, str(f), fallback) for f in batch.column("file").to_pylist()]
            if rows:
                yield pa.RecordBatch.from_pylist(rows, schema=_SURVEY_SCHEMA)
    return run


def survey(spark: SparkSession, directory: str, files: Sequence[str]) -> dict[str, SurveyedFile]:
    """``files`` (relative to the batch ``directory``, a URI) hashed and described by the executors, one task
    per file; nothing of them is read on the driver."""
    if not files:
        return {}
    tasks = spark.createDataFrame([(f,) for f in files], "file string")
    if len(files) > 1:
        tasks = tasks.repartition(len(files))
    out: dict[str, SurveyedFile] = {}
    for row in tasks.mapInArrow(_surveyor(directory, storage_env(directory)), _SURVEY_DDL).collect():
        lsns = (row["min_commit_lsn"], row["max_commit_lsn"]) if row["has_commit_lsns"] else None
        observed = Observed(row["bytes"], row["sha256"], row["rows"], lsns, row["error"])
        schema = pa.ipc.read_schema(pa.py_buffer(row["schema"])) if row["schema"] is not None else None
        out[row["file"]] = SurveyedFile(observed, schema, int(row["row_groups"]), bool(row["notes"]))
    return out


def spark_schema(staged: pa.Schema) -> StructType | None:
    """The Spark schema of a staged file's rows, the one Spark's Parquet reader infers for the file (every field
    nullable, as a file source gives it; a timestamp without time zone ``timestamp_ntz``, as
    ``spark.sql.parquet.inferTimestampNTZ.enabled`` pinned in ``SESSION_CONF`` has it; unsigned integers widened as
    ``staged_arrow.spark_type`` says) and the one ``to_spark_arrow`` converts rows to. None when a type is outside
    those staging writes (no Spark type for it, or a unit Spark's Parquet reader reads as another type)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if any(holds(f.type, _read_otherwise) for f in staged):
        return None
    try:
        return from_arrow_schema(spark_arrow_schema(staged), prefer_timestamp_ntz=True)
    except (TypeError, NotImplementedError):  # pyspark's conversion refuses the type
        return None


def spark_arrow_schema(staged: pa.Schema) -> pa.Schema:
    """``staged`` with each type as ``spark_type`` gives it and every field, nested ones too, nullable."""
    return pa.schema([pa.field(f.name, _nullable(spark_type(f.type))) for f in staged])


def _nullable(dtype: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(dtype):
        return pa.struct([pa.field(f.name, _nullable(f.type)) for f in dtype])
    if pa.types.is_map(dtype):
        return pa.map_(dtype.key_type, pa.field(dtype.item_field.name, _nullable(dtype.item_type)))
    if pa.types.is_list(dtype):
        return pa.list_(pa.field(dtype.value_field.name, _nullable(dtype.value_type)))
    return dtype


def _read_otherwise(dtype: pa.DataType) -> bool:
    """Whether ``dtype`` is a time of a unit other than microseconds, a duration (Spark reads a Parquet duration as a
    plain integer) or a decimal of a negative scale: pyspark maps them to Spark types its Parquet reader does
    not give them."""
    if pa.types.is_timestamp(dtype) or pa.types.is_time(dtype):
        return str(dtype.unit) != "us"
    if pa.types.is_decimal(dtype):
        return not 0 <= int(dtype.scale) <= int(dtype.precision)
    return bool(pa.types.is_duration(dtype))


def readable(staged: pa.Schema) -> bool:
    """Whether the executors can hand a file of ``staged`` schema to Spark: no TIME anywhere in it. Spark reads the
    Arrow that ``mapInArrow`` returns without a time type, and its TIME cannot be built from PostgreSQL's
    ``24:00:00`` (which its Parquet reader, and ``createDataFrame``, keep as the raw value)."""
    return not any(holds(f.type, pa.types.is_time) for f in staged)


def _reader(directory: str, target: pa.Schema, fallback: dict[str, str]
            ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Executor side: each (file, row group) task read with pyarrow and converted to ``target``."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        fs, root = _filesystem(directory, fallback)
        for batch in batches:
            for relative, group in zip(batch.column("file").to_pylist(), batch.column("row_group").to_pylist(),
                                       strict=True):
                table = to_spark_arrow(pq.ParquetFile(f"{root}/{relative}", filesystem=fs).read_row_group(group))
                yield from table.cast(target).to_batches()
    return run


def read_files(spark: SparkSession, directory: str, files: Sequence[tuple[str, pa.Schema, int]]) -> DataFrame:
    """Staged files ``(relative path, staged schema, row groups)`` of one schema under ``directory`` (a URI) as
    one Spark frame, each row group read by an executor task."""
    schema = spark_schema(files[0][1])
    if schema is None:
        raise StagingError(f"{directory}/{files[0][0]} holds a type staging does not write (Spark has no type for it)")
    target = spark_arrow_schema(files[0][1])
    tasks = [(relative, group) for relative, _, groups in files for group in range(groups)]
    frame = spark.createDataFrame(tasks, "file string, row_group int")
    if len(tasks) > 1:
        frame = frame.repartition(len(tasks))
    return frame.mapInArrow(_reader(directory, target, storage_env(directory)), schema)
