"""The validated pipeline spec as dataclasses, and the vocabulary the validator checks against (no I/O)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from airflow_provider_pglogical.apply.config import (
    ACTIONS,
    CASCADE_POLICIES,
    CONFLICT_POLICIES,
    LEAF_POLICIES,
    REPLICATION_ROLES,
    SCHEMA_CHANGE_POLICIES,
    TOAST_POLICIES,
)
from airflow_provider_pglogical.hooks.slots import SLOT_NAME_RE

if TYPE_CHECKING:
    from airflow_provider_pglogical.staging.drain import DrainRead

# `${NAME}` or `${NAME:-default}` inside any string value: DSNs and staging paths usually differ
# between laptop, CI and production while the rest of a spec does not.
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
SLOT_NAME = SLOT_NAME_RE  # PostgreSQL's rule for replication slot names (hooks/slots.py)
NAMEDATALEN = 63

TARGET_KINDS = ("postgres", "delta", "iceberg")
DELTA_MODES = ("mirror", "changelog")  # = apply.targets.delta.target.MODES (a unit test checks it)
ICEBERG_MODES = ("mirror", "changelog")  # = apply.targets.iceberg.target.MODES (a unit test checks it)
ICEBERG_CATALOGS = ("sql", "rest")  # = apply.targets.iceberg.catalog.CATALOG_TYPES (a unit test checks it)
# storage_options keys that would carry a secret: those come from the environment or conn_id only.
SECRET_OPTION = re.compile(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY|SAS|CREDENTIAL", re.IGNORECASE)
# The apply's own choices (apply/config.py, a light module), under the spec's names.
TRUNCATE_CASCADE = CASCADE_POLICIES
__all__ = ["ACTIONS", "CONFLICT_POLICIES", "DELTA_MODES", "ENV_REF", "ICEBERG_CATALOGS", "ICEBERG_MODES",
           "LEAF_POLICIES", "NAMEDATALEN", "REPLICATION_ROLES", "SCHEMA_CHANGE_POLICIES", "SECRET_OPTION",
           "RetentionSpec", "SLOT_NAME", "TARGET_KINDS", "TOAST_POLICIES", "TRUNCATE_CASCADE", "PipelineSpec", "SnapshotSpec",
           "SourceSpec", "SparkSpec", "StagingSpec", "TableSpec", "TargetSpec", "TruncateSpec", "DEFAULT_TARGET",
           "TARGET_NAME", "NamedTarget", "split_qualified", "union_tables"]

# The name of the one target of a spec written with ``target:``. Names are for the CLI (``--target``), status and
# the DAG's task ids; the staging area's records and the watermarks are keyed by where a target is
# (``SpecTarget.identity``), so naming a target changes nothing that was recorded.
DEFAULT_TARGET = "default"
TARGET_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")  # an Airflow task id part, a CLI word


@dataclass(frozen=True)
class SourceSpec:
    """The PostgreSQL server whose slot is drained."""

    publication: str
    slot: str
    dsn: str | None = None
    conn_id: str | None = None
    create: bool = False
    max_batch_bytes: int | None = None
    max_changes: int | None = None
    max_lag_bytes: int | None = None
    min_safe_wal_bytes: int | None = None
    read: DrainRead = "sql"  # how the drain reads the slot: the peek function or a replication stream
    # ``publication: [a, b]``: every publication, decoded together with a subscription's union
    # semantics (pgoutput's publication_names); ``publication`` is then the first.
    publications: tuple[str, ...] = ()

    @property
    def all_publications(self) -> tuple[str, ...]:
        return self.publications or (self.publication,)


@dataclass(frozen=True)
class RetentionSpec:
    """``staging.retention``: which batches stay once every target recorded for the staging area has applied
    them (older ones are pruned). ``keep_batches``: the newest N stay; ``keep_for_seconds``: batches staged
    within that long stay. A batch is pruned only when no bound keeps it; the newest batch always stays."""

    keep_batches: int | None = None
    keep_for_seconds: int | None = None


@dataclass(frozen=True)
class StagingSpec:
    """``uri``: the staging root; ``conn_id``: an Airflow connection whose credentials reach it (AWS, Google Cloud
    or Azure, by the root's scheme; else the environment's: ``staging/credentials.py``)."""

    uri: str
    retention: RetentionSpec | None = None  # None: every staged batch stays
    conn_id: str | None = None


@dataclass(frozen=True)
class TargetSpec:
    """``postgres``: ``dsn`` or ``conn_id``. ``delta``: ``uri`` (path or ``s3://…``), optional ``conn_id``
    (an Airflow AWS connection whose credentials reach the apply through its environment),
    non-secret ``storage_options``, ``mode``, ``partition_by`` (target table → columns) and ``max_merge_rows`` (a
    table-batch of more net changes is merged in one commit per key-hash bucket). ``iceberg``:
    ``catalog`` (pyiceberg catalog properties: ``type`` sql or rest, ``uri``, ``warehouse``, …; no secrets),
    optional ``namespace`` (else each table's schema), ``conn_id``, ``mode`` and ``partition_by`` as for delta."""

    kind: str
    dsn: str | None = None
    conn_id: str | None = None
    uri: str | None = None
    mode: str = "mirror"
    storage_options: dict[str, str] = field(default_factory=dict)
    partition_by: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bookkeeping_schema: str | None = None  # None: resolved per role (see targets/postgres/bookkeeping_schema.py)
    # ``postgres``: ``replica`` applies like a native subscriber (targets/postgres/replication_role.py).
    session_replication_role: str = "origin"
    catalog: dict[str, str] = field(default_factory=dict)
    namespace: str | None = None
    max_merge_rows: int | None = None  # delta mirror: None, one commit per table-batch whatever its size


@dataclass(frozen=True)
class TableSpec:
    """One published source table and how it lands in the target."""

    name: str  # schema.table on the source
    row_filter: str | None = None
    columns: tuple[str, ...] | None = None  # None: every column
    target: str | None = None  # None: same name as the source
    conflict: str = "upsert"
    unchanged_toast: str = "fail"
    key_columns: tuple[str, ...] | None = None
    actions: tuple[str, ...] = ACTIONS  # published actions (publish = '...'), judged on the original operation
    schema_changes: str = "follow"  # follow source ADD/DROP COLUMN and lossless widening, or fail
    # A partitioned table's leaves: ``own`` (each applied by its own entry) or ``route_to_root`` (every
    # leaf's changes go to this entry's target, for a publication without publish_via_partition_root).
    leaves: str = "own"

    @property
    def target_name(self) -> str:
        return self.target or self.name


@dataclass(frozen=True)
class TruncateSpec:
    cascade: str = "follow_source"


DEFAULT_SPARK_CONN_ID = "spark_default"


@dataclass(frozen=True)
class SparkSpec:
    """How Spark is reached: ``master`` (``local[*]``, ``spark://…``, ``yarn``: a session started in the process)
    or ``remote`` (``sc://host:port``: a client of a Spark Connect server); ``conn_id`` for the DAG's spark-submit,
    ``connect_conn_id`` for the DAG's apply over Spark Connect instead. A spec that names ``conn_id`` says its Spark
    is reached by spark-submit: the DAG submits every target's apply there (a lake target's too)."""

    conn_id: str | None = None  # None: not named (the PostgreSQL apply still submits to ``spark_default``)
    master: str | None = None  # CLI default when --master is not given
    conf: dict[str, str] = field(default_factory=dict)
    remote: str | None = None  # a Spark Connect URL: the CLI's default when --master is not given
    connect_conn_id: str | None = None  # an Airflow ``spark_connect`` connection: the DAG's apply uses Spark Connect
    # The DAG's PostgreSQL apply applies in its worker the batches that need no Spark, spark-submitting only for the
    # rest; False: every apply of the DAG is a spark-submit (no apply work in the Airflow worker).
    apply_in_worker: bool = True

    @property
    def submit_conn_id(self) -> str:
        """The Airflow Spark connection the DAG's spark-submit uses: ``conn_id``, else ``spark_default``."""
        return self.conn_id or DEFAULT_SPARK_CONN_ID

    @property
    def where(self) -> str | None:
        """The spec's Spark: its Connect URL or its master (None: the CLI's default)."""
        return self.remote or self.master


@dataclass(frozen=True)
class SnapshotSpec:
    """``snapshot:``: take an initial snapshot when the slot is created; readers and chunk size."""

    initial: bool = False
    parallelism: int = 1
    chunk_size: int = 256 << 20  # table heap bytes per chunk read by one reader


@dataclass(frozen=True)
class NamedTarget:
    """One entry of ``targets:``: where it is, and its own table selection (named tables and selectors)."""

    target: TargetSpec
    tables: dict[str, TableSpec]
    selectors: dict[str, TableSpec] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineSpec:
    """A validated pipeline spec; build it with :func:`load_spec` or :func:`parse_spec`."""

    source: SourceSpec
    staging: StagingSpec
    target: TargetSpec
    tables: dict[str, TableSpec]
    truncate: TruncateSpec = field(default_factory=TruncateSpec)
    spark: SparkSpec = field(default_factory=SparkSpec)
    snapshot: SnapshotSpec = field(default_factory=SnapshotSpec)
    origin: str = "<spec>"
    # Table selection like a publication's: "*" (every table of the publication) and "schema.*"
    # (`schemas:` or a "schema.*" entry), with their settings. ``tables`` holds the named tables;
    # ``pipeline/source.resolve`` adds the selected ones the publication publishes at run time.
    selectors: dict[str, TableSpec] = field(default_factory=dict)
    # ``targets:``: every named target with its own selection; empty for the ``target:`` form. With it, ``target``,
    # ``tables`` and ``selectors`` are the decode's view: the first target and every table any target needs (the
    # union, see ``union_tables``); what a target applies is its view (``target_views``).
    targets: dict[str, NamedTarget] = field(default_factory=dict)

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(self.targets) or (DEFAULT_TARGET,)

    def target_views(self, names: tuple[str, ...] | None = None) -> dict[str, PipelineSpec]:
        """Name → the spec of that one target (its target, tables and selectors; source, staging, Spark shared), in
        spec order; ``names``: only those (unknown ones are left out; ``fanout.select_views`` refuses them)."""
        if not self.targets:
            return {DEFAULT_TARGET: self} if names is None or DEFAULT_TARGET in names else {}
        chosen = self.targets if names is None else {n: t for n, t in self.targets.items() if n in names}
        return {name: replace(self, target=t.target, tables=dict(t.tables), selectors=dict(t.selectors), targets={})
                for name, t in chosen.items()}



def union_tables(entries: list[dict[str, TableSpec]]) -> dict[str, TableSpec]:
    """Every table any target names, for the decode (publication, snapshots, column checks): a table two targets
    name with different row filters or column lists is staged whole (no filter, every column), and each target's
    apply filters and projects it as its own entry says (snapshots are filtered again unless the source already
    evaluated that very filter, ``apply/direct.filtered_on_source``)."""
    out: dict[str, TableSpec] = {}
    for tables in entries:
        for name, table in tables.items():
            seen = out.get(name)
            if seen is None:
                out[name] = table
                continue
            out[name] = replace(seen, row_filter=seen.row_filter if seen.row_filter == table.row_filter else None,
                                columns=seen.columns if seen.columns == table.columns else None)
    return out


def split_qualified(name: str) -> tuple[str, str]:
    """``schema.table`` → (schema, table); names are unquoted and may not contain dots."""
    schema, _, table = name.partition(".")
    return schema, table
