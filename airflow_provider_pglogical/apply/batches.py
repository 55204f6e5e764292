"""The apply's view of staged batches: listed and opened through ``staging/`` (pyarrow only), row changes read by Spark.

Everything about the staging format itself (names, manifests, relations, truncates, gap and
overlap checks) lives in ``staging/reader.py``; this module adds only the Spark reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING

from airflow_provider_pglogical.apply import executor_reads
from airflow_provider_pglogical.apply.meta import META
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand, session_of
from airflow_provider_pglogical.apply.sparkenv import quoted
from airflow_provider_pglogical.apply.staged_arrow import castable_from_text, spark_readable, to_spark_arrow
from airflow_provider_pglogical.apply.staged_schema import known
from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging.manifest import Manifest
from airflow_provider_pglogical.staging.reader import (
    NOTES_COLUMNS,
    BatchRef,
    RelationColumn,
    RelationInfo,
    StagingReader,
    TruncateEvent,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

CHANGE_META_COLUMNS = ("commit_lsn", "end_lsn", "lsn", "tx_order", "xid", "commit_time", "op",
                       "schema_version", "old", "old_key_only", "new", "new_unchanged_toast")
# Working-frame column (array<string>): columns of the batch the change's own schema version lacks (dropped
# before it, or added after it); its image's fields for them are null *without meaning NULL*.
ABSENT = META + "absent"

__all__ = ["ABSENT", "CHANGE_META_COLUMNS", "META", "NOTES_COLUMNS", "Batch", "RelationColumn", "RelationInfo",
           "TruncateEvent", "has_value_notes", "read_by_executors", "readable_here", "verify", "image_type", "is_local",
           "keys_never_repeat", "list_batches",
           "read_changes",
           "read_relation_versions", "read_relations",
           "read_truncates"]


@dataclass(frozen=True)
class Batch:
    """One visible batch (its manifest exists), with the reader that opens it."""

    reader: StagingReader
    ref: BatchRef
    manifest: Manifest
    # Row-change files as the executors found them (``executor_reads.survey``), for staging the driver does not read.
    surveyed: dict[str, executor_reads.SurveyedFile] = field(default_factory=dict, compare=False, repr=False)
    # Whether the apply's Spark runs on this machine (``sparkenv.session_is_local``, decided once by the caller; the
    # master's URL is not kept: a Spark Connect URL may carry a token). ``readable_here`` decides with it.
    local_master: bool = False

    @property
    def start_lsn(self) -> int:
        return self.ref.start_lsn

    @property
    def end_lsn(self) -> int:
        return self.ref.end_lsn

    @property
    def uri(self) -> str:
        """The directory as given to Spark."""
        return self.reader.uri(self.ref)

    @property
    def here(self) -> bool:
        """Whether this process reads the batch's staged files itself (``readable_here``)."""
        return readable_here(self.uri, self.local_master)

    @property
    def table_files(self) -> dict[str, tuple[str, ...]]:
        """``schema.table`` → its parquet files relative to the batch directory."""
        return {name: tuple(t.get("files", ())) for name, t in self.manifest.tables.items()}

    @property
    def truncates(self) -> int:
        return self.manifest.truncates


def list_batches(staging_root: str, slot: str, local_master: bool = False) -> list[Batch]:
    """Visible batches of ``slot`` in LSN order; StagingError on a gap or an overlap between them. ``local_master``:
    whether the apply's Spark runs on this machine (``readable_here``)."""
    reader = StagingReader.from_uri(staging_root, slot)
    return [Batch(reader, ref, reader.manifest(ref), local_master=local_master) for ref in reader.batches()]


def read_relation_versions(batch: Batch) -> dict[str, list[tuple[int, RelationInfo]]]:
    """Every schema version per ``schema.table`` seen in the batch, as (first LSN, shape), oldest first."""
    return batch.reader.relation_versions(batch.ref)


def read_relations(batch: Batch) -> dict[str, RelationInfo]:
    """Latest schema version per ``schema.table`` seen in the batch."""
    return batch.reader.relations(batch.ref)


def read_truncates(batch: Batch) -> list[TruncateEvent]:
    return batch.reader.truncates(batch.ref, batch.manifest)


def readable_here(uri: str, local_master: bool) -> bool:
    """Whether this process may read the staged files under ``uri`` itself (with the staging area's pyarrow
    filesystem): local staging, or staging on an object store when Spark's ``master`` is local — the driver would be
    this machine anyway, so its reads funnel nothing through one host that the executors would have spread. On
    any other master (standalone, yarn, k8s, a Spark Connect server) object-store files are opened by the executors
    only (``executor_reads``), and the driver reads no row-change file. ``local_master``: whether the master is
    local (``sparkenv.session_is_local``); a master not known is not."""
    return is_local(uri) or local_master


def read_by_executors(batch: Batch) -> bool:
    """Whether the batch's row-change files are opened by the executors only (``executor_reads``): staging
    on an object store with a master that is not local (``readable_here``). Otherwise this process reads them
    (verification, planning, the direct path); Spark reads local staging with its own Parquet reader."""
    return not batch.here


def verify(spark: SparkSession | SparkOnDemand, batch: Batch) -> None:
    """Refuse a batch whose files are not what its manifest records (``StagingReader.verify``), before a target
    sees any of it. Staging read by the executors has its row-change files hashed there (``executor_reads.survey``,
    kept on the batch for the reads); the driver reads only the small metadata files. Staging this process reads
    (``readable_here``: local, or on an object store with a local master) is hashed here, so a session on demand
    is not started for it."""
    if read_by_executors(batch):
        files = sorted({f for fs in batch.table_files.values() for f in fs})
        batch.surveyed.update(executor_reads.survey(session_of(spark), batch.uri, [f for f in files if f not in batch.surveyed]))
        batch.reader.verify(batch.ref, batch.manifest, {f: batch.surveyed[f].observed for f in files})
    else:
        batch.reader.verify(batch.ref, batch.manifest)


def _surveyed(spark: SparkSession, batch: Batch, files: Sequence[str]) -> list[executor_reads.SurveyedFile]:
    """The executors' survey of ``files`` (verified against the manifest when it is taken here)."""
    if any(f not in batch.surveyed for f in files):
        verify(spark, batch)
    return [batch.surveyed[f] for f in files]


def has_value_notes(batch: Batch, table: str) -> bool:
    """Whether any staged image of ``table`` in ``batch`` carries an exactness note (then the Spark
    plan carries notes through, ``apply/notes.py``; almost every batch has none). Staging read by the
    executors answers from their survey (True when a file was not surveyed)."""
    files = batch.table_files.get(table, ())
    if read_by_executors(batch):
        return any(f not in batch.surveyed or batch.surveyed[f].notes for f in files)
    return batch.reader.has_value_notes(batch.ref, files)


def has_unchanged_toast(batch: Batch, table: str) -> bool:
    """Whether any staged change of ``table`` in ``batch`` lists an unchanged-TOAST column (else the Spark plan
    leaves out the TOAST refill from old images). Staging read by the executors answers True without reading
    (the driver reads no row-change file of it): the plan keeps the refill, which is exact either way."""
    if read_by_executors(batch):
        return True
    return batch.reader.has_unchanged_toast(batch.ref, batch.table_files.get(table, ()))


def keys_never_repeat(batch: Batch, table: str, key: Sequence[str], *, full_identity: bool = False) -> bool:
    """Whether no value of ``key`` occurs in two staged changes of ``table`` in ``batch`` (then compaction has
    nothing to net, and ``transforms.single_event_net`` gives its result without a shuffle); read driver-side
    by ``StagingReader.keys_never_repeat``. Staging read by the executors answers False (the driver reads no
    key of it): compaction nets the batch as always."""
    if read_by_executors(batch):
        return False
    return batch.reader.keys_never_repeat(batch.ref, batch.table_files.get(table, ()), key,
                                          full_identity=full_identity)


def is_local(uri: str) -> bool:
    """Whether Spark reads ``uri`` itself (a path or ``file://``); object stores need jars it lacks."""
    return "://" not in uri or uri.startswith("file://")


def read_changes(spark: SparkSession, batch: Batch, table: str) -> DataFrame:
    """The table's row changes of every schema version, meta columns prefixed with ``_pgl_``.

    Versions are unioned by name (missing struct fields become null), so the frame always has
    the union of the columns of all versions; ``ABSENT`` lists, per change, the columns its own
    version lacks — a native subscriber leaves them alone (UPDATE) or at their default (INSERT) —
    except a column the source added with a ``DEFAULT``: rows staged before its ``ADD COLUMN``
    read that default on the source, so their new image and their full old image (not a key-only
    one) get it, for the types Spark casts from its text (``_with_source_defaults``).
    The exactness notes come along (``apply/notes.py``).
    A staging root on an object store (``s3://``) is read with pyarrow by Spark's executors
    (``executor_reads``; a file with a TIME column by pyarrow on the driver), because Spark's own s3a reader
    needs hadoop-aws jars that are not installed (docs/delta.md); with a local master the footers they need
    are read here. Both routes give the same Spark types and values (``_read_file``).
    """
    files = batch.table_files.get(table, ())
    if not files:
        raise StagingError(f"batch {batch.start_lsn}-{batch.end_lsn} has no files for {table}")
    frames = [_read_file(spark, batch, rel) for rel in files]
    if len(frames) > 1:
        frames = _with_absent(_as_text_where_types_conflict(
            _with_source_defaults(frames, read_relation_versions(batch).get(table, []))))
    df = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StringType, StructField, StructType

    # The frame's schema is the staged files' (known here when they were read with it, else one analysis): so is
    # the selection's, which the client then holds too (every later step asks for the images' types).
    staged = df.schema
    names = set(staged.fieldNames())
    notes = [(df[c] if c in names else F.create_map().cast("map<string,string>")).alias(META + c)
             for c in NOTES_COLUMNS]
    absent = df[ABSENT] if ABSENT in names else F.array().cast("array<string>")
    types = {f.name: f.dataType for f in staged.fields}
    selected = StructType(
        [StructField(META + c, types[c]) for c in CHANGE_META_COLUMNS]
        + [StructField(META + c, types.get(c, MapType(StringType(), StringType()))) for c in NOTES_COLUMNS]
        + [StructField(ABSENT, types.get(ABSENT, ArrayType(StringType())))])
    return known(df.select(*[df[c].alias(META + c) for c in CHANGE_META_COLUMNS], *notes, absent.alias(ABSENT)),
                 selected)


def _read_file(spark: SparkSession, batch: Batch, relative: str) -> DataFrame:
    """One staged file as a Spark frame: Spark's Parquet reader where it can read the file (local staging, no
    decimal wider than Spark's 38 digits); staging on an object store by the executors (``executor_reads``);
    otherwise pyarrow on the driver (a local file Spark cannot read; a staged file with a TIME column on an object
    store, ``executor_reads.readable``). The last two convert the columns as Spark's reader does
    (``staged_arrow``: unsigned ints widened, wide decimals as exact text, timestamps without time zone kept
    ``timestamp_ntz``)."""
    from airflow_provider_pglogical.apply.sparktypes import require_time_type

    if not is_local(batch.uri):  # Spark has no reader of its own for the store: its executors read with pyarrow
        schema, row_groups = _footer(spark, batch, relative)
        require_time_type(schema, f"{batch.ref.label}: {relative}")
        if executor_reads.readable(schema):
            return executor_reads.read_files(spark, batch.uri, [(relative, schema, row_groups)])
        return _from_arrow(spark, batch.reader.read_file(batch.ref, relative))
    schema = batch.reader.read_schema(batch.ref, relative)
    require_time_type(schema, f"{batch.ref.label}: {relative}")
    if spark_readable(schema):
        return _parquet(spark, [f"{batch.uri}/{relative}"], schema)
    return _from_arrow(spark, batch.reader.read_file(batch.ref, relative))


def staged_image_types(spark: SparkOnDemand, batch: Batch, sources: Sequence[str]) -> dict[str, pa.DataType]:
    """Each column's Arrow type in the ``new`` images of the staged files of ``sources`` (every schema version; the
    first that has it), from their footers only: read here, or surveyed by the executors when they alone read the
    batch's files (a session is started then)."""
    out: dict[str, pa.DataType] = {}
    for source in sources:
        for relative in batch.table_files.get(source, ()):
            schema = _footer(spark, batch, relative)[0]
            for image_field in schema.field("new").type:
                out.setdefault(image_field.name, image_field.type)
    return out


def _parquet(spark: SparkSession, paths: Sequence[str], schema: pa.Schema) -> DataFrame:
    """Spark's Parquet reader over local ``paths`` of Arrow ``schema``, given the schema it infers for them
    (``staged_schema``: the server reads no footer to plan the frame, and its columns cost no round trip)."""
    found = executor_reads.spark_schema(schema)
    if found is None:
        return spark.read.parquet(*paths)
    return known(spark.read.schema(found).parquet(*paths), found)


def _footer(spark: SparkSession | SparkOnDemand, batch: Batch, relative: str) -> tuple[pa.Schema, int]:
    """A staged file's Arrow schema and row-group count: from the executors' survey when the driver reads no
    row-change file (``read_by_executors``; a session on demand starts then), else from its footer read here."""
    if read_by_executors(batch):
        (found,) = _surveyed(session_of(spark), batch, [relative])
        if found.schema is None:  # verified above: an unreadable file never gets here
            raise StagingError(f"{batch.ref.label}: {relative} has no schema")
        return found.schema, found.row_groups
    return batch.reader.footer(batch.ref, relative)


def read_local_parquet(spark: SparkSession, uri: str, files: Sequence[str]) -> DataFrame:
    """Staged Parquet ``files`` under ``uri`` (snapshot chunks, one schema) as one Spark frame, like ``_read_file``: a
    local file Spark's reader cannot read (a decimal wider than 38 digits) goes through the driver; files on an
    object store are read by the executors (``executor_reads``, their footers too) when they can be
    (``executor_reads.readable``), else handed to Spark's reader as they are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_pglogical.apply.sparktypes import require_time_type

    paths = [f"{uri}/{f}" for f in files]
    if not is_local(uri):
        found = executor_reads.survey(spark, uri, files)
        plans = []
        for f in files:
            schema = found[f].schema
            if schema is None:
                raise StagingError(f"snapshot file {uri}/{f} {found[f].observed.error}")
            require_time_type(schema, f"snapshot file {uri}/{f}")
            plans.append((f, schema, found[f].row_groups))
        if all(executor_reads.readable(schema) for _, schema, _ in plans):
            return executor_reads.read_files(spark, uri, plans)
        return spark.read.parquet(*paths)
    local = [p.removeprefix("file://") for p in paths]
    schemas = [pq.read_schema(p) for p in local]
    for path, schema in zip(local, schemas, strict=True):
        require_time_type(schema, f"snapshot file {path}")
    if all(spark_readable(schema) for schema in schemas):
        if all(schema == schemas[0] for schema in schemas):
            return _parquet(spark, paths, schemas[0])
        return spark.read.parquet(*paths)
    return _from_arrow(spark, pa.concat_tables([pq.read_table(p) for p in local]))


def _from_arrow(spark: SparkSession, staged: pa.Table) -> DataFrame:
    from pyspark.sql.pandas.types import from_arrow_schema

    table = to_spark_arrow(staged)
    # Spark's Parquet reader types a timestamp without time zone as timestamp_ntz; createDataFrame's default
    # would make it a session-zone timestamp (a Delta ``timestamp`` instead of ``timestamp_ntz``).
    return spark.createDataFrame(table, schema=from_arrow_schema(table.schema, prefer_timestamp_ntz=True))


def image_type(df: DataFrame, image: str) -> StructType:
    """The struct of a staged row image column (``old``/``new``: one field per column, in relation order)."""
    from pyspark.sql.types import StructType

    dtype = df.schema[META + image].dataType
    if not isinstance(dtype, StructType):
        raise StagingError(f"staged column {META + image} is {dtype.simpleString()}, not a row image struct")
    return dtype


def _image_fields(df: DataFrame) -> list[str]:
    """Field names of a staged frame's new image (its schema version's columns, plus filled defaults)."""
    from pyspark.sql.types import StructType

    dtype = df.schema["new"].dataType
    return dtype.fieldNames() if isinstance(dtype, StructType) else []


def _with_absent(frames: list[DataFrame]) -> list[DataFrame]:
    """Each schema version's frame with ``ABSENT``: the columns of the other versions it lacks."""
    from pyspark.sql import functions as F

    every = list(dict.fromkeys(name for df in frames for name in _image_fields(df)))
    out = []
    for df in frames:
        have = set(_image_fields(df))
        lacking = [F.lit(name) for name in every if name not in have]
        out.append(df.withColumn(ABSENT, F.array(*lacking).cast("array<string>")))
    return out


def _castable_from_text(dtype: DataType, text: str) -> bool:
    """Whether Spark's cast of PostgreSQL's text output ``text`` to the staged column's Spark type ``dtype`` is
    exact (``staged_arrow.castable_from_text`` of its Arrow type; a type Arrow holds otherwise is not)."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import AtomicType, TimestampType

    if not isinstance(dtype, AtomicType) or isinstance(dtype, TimestampType):  # no time zone here: never castable
        return False
    try:
        return castable_from_text(to_arrow_type(dtype), text)
    except TypeError:  # a type Arrow does not hold
        return False


def _with_source_defaults(frames: list[DataFrame], versions: Sequence[tuple[int, RelationInfo]]) -> list[DataFrame]:
    """Frames of older schema versions with the latest version's source defaults (``attmissingval``) in
    their new image and their full old image (not a key-only one), for the columns they lack: the value
    such a row reads on the source after the ``ADD COLUMN … DEFAULT``, so a row filter over the column
    judges both images of a change alike. Only types whose staged form casts exactly from text get it
    (integers, floats, numeric, text-like, boolean, ISO dates); the others stay null (docs/apply.md)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from airflow_provider_pglogical.apply.schema_changes import missing_value

    if not versions:
        return frames
    # The last version's default of each column that has one (a column dropped since has its last one).
    last = {c.name: c for _, rel in versions for c in rel.columns}
    defaults = {name: v for name, c in last.items() if (v := missing_value(c.missing)) is not None}
    if not defaults:
        return frames

    def fields(df: DataFrame) -> dict[str, DataType]:
        dtype = df.schema["new"].dataType
        return {f.name: f.dataType for f in dtype.fields} if isinstance(dtype, StructType) else {}

    types: dict[str, DataType] = {}
    for df in frames:
        for name, dtype in fields(df).items():
            types.setdefault(name, dtype)
    out = []
    for df in frames:
        schema = df.schema  # once: a frame ``withColumn`` returns holds no schema, and over Connect each asks the server
        have = fields(df)
        fill = {c: v for c, v in defaults.items() if c not in have and c in types and _castable_from_text(types[c], v)}
        if fill:
            full_old = ~F.coalesce(F.col("old_key_only"), F.lit(False))  # a key-only image's field stays null
            for column, filled in (("new", F.lit(True)), ("old", full_old)):
                if not isinstance(schema[column].dataType, StructType):
                    continue
                image = F.col(column)
                for name, text in fill.items():
                    image = image.withField(quoted(name), F.when(filled, F.lit(text).cast(types[name])))
                df = df.withColumn(column, F.when(F.col(column).isNotNull(), image))
        out.append(df)
    return out


def _as_text_where_types_conflict(frames: list[DataFrame]) -> list[DataFrame]:
    """Image fields whose staged type changed between versions in a way Spark's union cannot widen
    (``integer`` → ``text``: a type change the target was converted for by hand) become text in every
    frame, so the union cannot fail on a value; the target parses the text as its column's type.
    Numeric to numeric is left to the union (it widens)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    numeric = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType, T.FloatType, T.DoubleType)
    out = frames
    for image in ("old", "new"):
        seen: dict[str, set[str]] = {}
        kinds: dict[str, bool] = {}
        for df in out:
            dtype = df.schema[image].dataType
            for f in dtype.fields if isinstance(dtype, T.StructType) else []:
                seen.setdefault(f.name, set()).add(f.dataType.simpleString())
                kinds[f.name] = kinds.get(f.name, True) and isinstance(f.dataType, numeric)
        conflicting = [name for name, types in seen.items() if len(types) > 1 and not kinds[name]]
        if not conflicting:
            continue
        fixed = []
        for df in out:
            dtype = df.schema[image].dataType
            present = [n for n in conflicting if isinstance(dtype, T.StructType) and n in dtype.fieldNames()]
            value = F.col(image)
            for name in present:
                value = value.withField(quoted(name), F.col(image)[name].cast("string"))
            fixed.append(df.withColumn(image, F.when(F.col(image).isNotNull(), value)) if present else df)
        out = fixed
    return out
