"""The spec's target, resolved once: the only place that reads ``spec.target.kind``.

``spec_target(spec)`` turns the spec's ``target`` section into a small handle (no Spark, no
connection yet) that answers what the pipeline asks of a target: the process environment the apply
needs, watermarks, snapshot sync marks, whether Spark may start during the drain, reset for a replay,
maintenance, dropping the slot's bookkeeping (``pglogical drop``, ``drop --target``), how the staging area
records it (``identity``), where it writes for its assets (``location``), and ``for_apply(spark, config)``, the
``apply.targets.base.Target`` the runner applies to. The CLI, the DAG factory, the run steps, ``status`` and the UI
view (``target_kinds``) ask the handle; none of them branches on the kind.

A new target kind is its folder under ``apply/targets/`` (the ``Target``), its spec model
(``pipeline/model.py``, ``validation.py``) and one handle class here, registered with ``@register``.
Several targets per slot (``targets:``) are several handles, one per target's view of the spec
(``spec_targets``); ``pipeline/fanout.py`` runs a step over them.

A PostgreSQL handle asks all its bookkeeping questions (schema resolution, watermarks, sync marks,
reset) on one connection, opened on the first question and closed by ``close()`` (or leaving the
handle's ``with`` block), so a run closes it before Spark starts; the apply's ``Target`` opens its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, cast
from urllib.parse import urlsplit, urlunsplit

import psycopg2
from psycopg2 import sql

from airflow_provider_pglogical.apply import planning
from airflow_provider_pglogical.apply.targets.delta.settings import connection_env
from airflow_provider_pglogical.apply.targets.postgres import catalog
from airflow_provider_pglogical.apply.targets.postgres.bookkeeping_schema import (
    locate,
    qualified,
    resolve_schema,
    target_identity,
)
from airflow_provider_pglogical.apply.targets.postgres.copy import leftover_staging
from airflow_provider_pglogical.apply.targets.postgres.plan import staging_prefix
from airflow_provider_pglogical.apply.targets.postgres.progress import (
    PROGRESS_TABLE,
    REJECTS_TABLE,
    SYNC_TABLE,
    delete_slot_rows,
    read_watermarks,
    reset,
    slot_rows,
    slot_targets,
    sync_marks,
)
from airflow_provider_pglogical.environ import scoped
from airflow_provider_pglogical.exceptions import PipelineBusyError, SpecError
from airflow_provider_pglogical.hooks.airflow_connection import connection_dsn
from airflow_provider_pglogical.pipeline.spec import PipelineSpec
from airflow_provider_pglogical.staging.target_record import TargetRecord, read_record, write_record

if TYPE_CHECKING:
    from psycopg2.extensions import connection
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.config import ApplyConfig
    from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
    from airflow_provider_pglogical.apply.targets.base import Target
    from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
    from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
    from airflow_provider_pglogical.apply.targets.postgres.overlap import OverlappedLoad

Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


class SpecTarget(ABC):
    """What the pipeline asks of the spec's target; one subclass per ``target.kind`` (see ``register``).

    Besides the methods, a kind sets ``applies_in_worker`` (the DAG's apply runs the spec's steps with the driver in
    the Airflow worker — or in the spec app's spark-submit when the spec names ``spark.conn_id`` — rather than as
    the PostgreSQL apply app), ``maintainable`` (``maintain`` compacts its tables) and ``needs_conn_id`` (a
    task in another process finds the target only through an Airflow connection), and may override
    ``early_spark_start``, ``takes_direct_rows`` and ``takes_direct_snapshot_rows``.
    """

    kind: ClassVar[str] = ""
    applies_in_worker: ClassVar[bool] = False
    needs_conn_id: ClassVar[bool] = True
    maintainable: ClassVar[bool] = False  # ``maintain`` compacts its tables (lake targets)

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec

    @property
    def early_spark_start(self) -> bool:
        """Whether Spark may start while the drain runs (not when the target's credentials reach this
        process, and so the JVM, only around the apply)."""
        return True

    @property
    def takes_direct_rows(self) -> bool:
        """Whether the spec's ``Target`` reads the direct path's rows itself (``targets/base.DirectNetSource``): a
        run the direct path covers then needs no Spark (``runs.spark_expected``)."""
        return False

    @property
    def takes_direct_snapshot_rows(self) -> bool:
        """Whether the spec's ``Target`` reads a snapshot table's staged rows itself (``targets/base.DirectRowsSource``):
        otherwise loading a snapshot surely needs Spark (``runs.spark_expected``)."""
        return False

    def overlapped_snapshot_load(self, config: Callable[[], ApplyConfig], *, local_master: bool,
                                 log: Callable[[str], None]) -> OverlappedLoad | None:
        """The loader of a process that takes a snapshot and applies it (``pglogical run``): it loads each published
        set of tables while the snapshot reads on (``targets/postgres/overlap.py``); None: the apply after the
        snapshot loads every table. ``config``: the apply's config, asked at the first publication."""
        return None

    @property
    def tables(self) -> list[str]:
        """The spec's target tables in spec order (of a resolved spec: selected tables included)."""
        return list(dict.fromkeys(t.target_name for t in self.spec.tables.values()))

    def environment(self) -> AbstractContextManager[None]:
        """The process environment the target reads its credentials from, set for the block only."""
        return nullcontext()

    def credentials_env(self) -> dict[str, str]:
        """The variables ``environment`` sets, for a process started to apply elsewhere (spark-submit's); {} when the
        target finds its credentials itself."""
        return {}

    def identity(self) -> str:
        """How the staging area names this target in its records (``staging/retention.py``): ``<kind>/<where>``,
        never credentials. Two specs writing to the same place are one target."""
        return f"{self.kind}/{self.spec.target.uri or self.spec.target.conn_id or ''}"

    def location(self) -> str:
        """Where the target writes, known without connecting and free of credentials: what tells apart the assets of
        two targets writing tables of one name (``assets/pglogical.py``)."""
        return f"{self.kind}/{_without_userinfo(self.spec.target.uri or self.spec.target.conn_id or '')}"

    def former_identities(self) -> tuple[str, ...]:
        """Names earlier releases recorded this target under (``identity`` changed since), whose records a prune
        replaces with the current one, so they hold no batches back."""
        return ()

    @abstractmethod
    def watermarks(self) -> dict[str, int]:
        """Target table → end LSN the apply has committed for it ({} before the first apply)."""

    def sync_marks(self) -> dict[str, int]:
        """Target table → sync LSN of the snapshot it holds ({} before any snapshot was applied)."""
        return {}

    def check_resync(self, tables: Sequence[str]) -> None:
        """Raise ``SpecError`` when the target would never load a snapshot of ``tables``."""
        return  # a target that loads snapshots takes any table

    def reset(self, *, log: Log = _quiet) -> dict[str, Any]:
        """Empty the target tables and forget the slot's watermarks (replay from the first batch)."""
        raise SpecError(f"{self.spec.origin}: reset of a {self.kind} target is not supported")

    def maintain(self, *, retention_hours: int, vacuum: bool) -> dict[str, Any]:
        """Compact and vacuum the target tables (``pglogical maintain``)."""
        raise SpecError(f"{self.spec.origin}: maintain compacts and vacuums Delta and Iceberg tables; the target is "
                        f"{self.kind}")

    def exclusive(self) -> AbstractContextManager[None]:
        """Hold the slot's apply lock on the target for the block, so no apply starts meanwhile
        (``PipelineBusyError`` while one runs); nothing to hold by default."""
        return nullcontext()

    def drop_bookkeeping(self, *, dry_run: bool = False, log: Log = _quiet) -> dict[str, Any]:
        """Forget the slot on the target (``pglogical drop``): its watermarks, sync marks and whatever else the
        target keeps per slot — never the target tables. Idempotent; ``dry_run`` only reports what would go."""
        raise SpecError(f"{self.spec.origin}: drop is not supported for a target of kind {self.kind!r}")

    def mark_retired(self, bookkeeping: dict[str, Any]) -> None:
        """Record in the staging area that ``drop --target`` retired this target (``bookkeeping``: what
        ``drop_bookkeeping`` returned), where applying to it again would apply batches twice; nothing to record
        by default (a target whose watermarks stay with its data resumes from them)."""
        return

    @abstractmethod
    def for_apply(self, spark: SparkSession | SparkOnDemand, config: ApplyConfig) -> Target:
        """The ``Target`` the runner applies ``config`` to, in ``spark``'s driver (a session on demand starts
        when the target first needs it)."""

    def close(self) -> None:
        """Release what the questions above opened (the handle stays usable)."""
        return  # nothing opened by default

    def __enter__(self) -> SpecTarget:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


HANDLES: dict[str, type[SpecTarget]] = {}


def _without_userinfo(uri: str) -> str:
    """``uri`` without the password of its ``user:password@`` (a place is named in records and logs, never a
    credential). What precedes ``@`` stays otherwise: in ``abfss://container@account…`` it is part of the place."""
    parts = urlsplit(uri)
    if not parts.netloc or "@" not in parts.netloc:
        return uri
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))


def register(kind: str) -> Callable[[type[SpecTarget]], type[SpecTarget]]:
    """Class decorator: the handle of ``target.kind: <kind>``."""
    def add(cls: type[SpecTarget]) -> type[SpecTarget]:
        cls.kind = kind
        HANDLES[kind] = cls
        return cls
    return add


def spec_target(spec: PipelineSpec) -> SpecTarget:
    """The handle of the spec's one target (nothing is opened yet); a spec with several (``targets:``) asks
    ``spec_targets`` instead, so no question is answered by one target for all of them."""
    if len(spec.targets) > 1:
        raise SpecError(f"{spec.origin}: the spec has {len(spec.targets)} targets ({', '.join(spec.targets)}); "
                        "this step takes one of them (pipeline/fanout.py)")
    try:
        handle = HANDLES[spec.target.kind]
    except KeyError:
        raise SpecError(f"{spec.origin}: target kind {spec.target.kind!r} has no pipeline support") from None
    return handle(spec)


def spec_targets(spec: PipelineSpec) -> dict[str, SpecTarget]:
    """Name → the handle of each of the spec's targets (``PipelineSpec.target_views``), in spec order."""
    return {name: spec_target(view) for name, view in spec.target_views().items()}


def target_kinds(spec: PipelineSpec) -> dict[str, str]:
    """Name → kind of each of the spec's targets, in spec order (``default`` for the one target of ``target:``), for
    the pages and listings that show them; a kind with no handle is a ``SpecError`` as for any other question."""
    return {name: handle.kind for name, handle in spec_targets(spec).items()}


@register("postgres")
class PostgresSpecTarget(SpecTarget):
    """A PostgreSQL target (``dsn`` or ``conn_id``); its bookkeeping tables live in the pipeline's own schema
    (``bookkeeping_schema.locate``), asked once per handle."""

    @property
    def takes_direct_rows(self) -> bool:
        return True  # the target prints and COPYs them (``targets/postgres/arrownet.py``)

    @property
    def takes_direct_snapshot_rows(self) -> bool:
        return True  # COPYed from the staged files (``targets/postgres/snapshot.py``)

    def __init__(self, spec: PipelineSpec) -> None:
        super().__init__(spec)
        self._dsn: str | None = None
        self._conn: connection | None = None
        self._progress_table: str | None = None

    @property
    def dsn(self) -> str:
        """The target as a libpq DSN (resolving an Airflow connection when the spec names one)."""
        if self._dsn is None:
            if self.spec.target.dsn is not None:
                self._dsn = self.spec.target.dsn
            elif self.spec.target.conn_id is not None:
                # The same builder, extras allowlist and IAM tokens as the hook and the apply operator.
                self._dsn = connection_dsn(self.spec.target.conn_id)
            else:
                raise SpecError(f"{self.spec.origin}: the postgres target needs a dsn or a conn_id")
        return self._dsn

    @property
    def conn(self) -> connection:
        """The handle's one bookkeeping connection (opened on first use)."""
        if self._conn is None:
            self._conn = psycopg2.connect(self.dsn)
        return self._conn

    @property
    def progress_table(self) -> str:
        """The progress table's qualified name in the pipeline's bookkeeping schema (``WatermarksMissingError``
        when batches were applied but their watermarks are gone: see ``bookkeeping_schema.locate``)."""
        if self._progress_table is None:
            conn = self.conn
            try:
                # The first target table's schema the role may create in is a candidate: spec order counts.
                schema = locate(conn, self.spec.target.bookkeeping_schema, self.tables, slot=self.spec.source.slot,
                                staging_uri=self.spec.staging.uri, progress_table=PROGRESS_TABLE)
            finally:
                conn.rollback()  # a question, not a transaction to keep open
            self._progress_table = qualified(schema, PROGRESS_TABLE)
        return self._progress_table

    def location(self) -> str:
        # The database (host, port, name) of a DSN; a conn_id names one database connection of its own.
        t = self.spec.target
        if t.dsn is None:
            return f"{self.kind}/{t.conn_id or ''}"
        params = psycopg2.extensions.parse_dsn(t.dsn)
        database = params.get("dbname") or params.get("user") or ""
        return f"{self.kind}/{params.get('host') or 'localhost'}:{params.get('port') or 5432}/{database}"

    def identity(self) -> str:
        conn = self.conn
        try:
            return target_identity(conn)  # the name the apply's target record has (target_record.py)
        finally:
            conn.rollback()

    def watermarks(self) -> dict[str, int]:
        progress_table, conn = self.progress_table, self.conn
        try:
            return read_watermarks(conn, self.spec.source.slot, progress_table)
        finally:
            conn.rollback()

    def sync_marks(self) -> dict[str, int]:
        # pglogical_sync lives next to the progress table, in the bookkeeping schema the apply resolves.
        schema, conn = self.progress_table.rpartition(".")[0], self.conn
        try:
            return sync_marks(conn, self.spec.source.slot, f"{schema}.{SYNC_TABLE}" if schema else SYNC_TABLE)
        finally:
            conn.rollback()

    def _watermarks_schema(self) -> tuple[str, str]:
        """(target identity, the schema holding the slot's bookkeeping) as the staging record and the slot's own
        rows say; unlike ``progress_table`` it does not refuse missing watermarks, which reset and drop expect."""
        conn = self.conn
        target = target_identity(conn)
        record = read_record(self.spec.staging.uri, self.spec.source.slot, target)
        schema = resolve_schema(conn, self.spec.target.bookkeeping_schema, self.tables, PROGRESS_TABLE,
                                slot=self.spec.source.slot, recorded=record.bookkeeping_schema if record else None)
        return target, schema

    def reset(self, *, log: Log = _quiet) -> dict[str, Any]:
        """In one transaction (sync marks too: the staged snapshots load again); crashing before the commit
        leaves the target untouched. The staging area's record then says nothing is applied."""
        slot, conn = self.spec.source.slot, self.conn
        target, schema = self._watermarks_schema()
        existing = reset(conn, slot, sorted(self.tables), qualified(schema, PROGRESS_TABLE),
                         qualified(schema, SYNC_TABLE))
        write_record(self.spec.staging.uri, slot, target, TargetRecord(schema, applied=False))
        self._progress_table = None
        log(f"emptied {len(existing)} target table(s) and reset the watermarks of slot {slot}")
        return {"truncated": existing}

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        slot, conn = self.spec.source.slot, self.conn
        if not catalog.try_lock_slot(conn, slot):
            raise PipelineBusyError(f"an apply of slot {slot!r} into this target is running (its apply lock is "
                                    "held); let the run finish, then drop")
        try:
            yield
        finally:
            catalog.unlock_slot(conn, slot)

    def exclusive(self) -> AbstractContextManager[None]:
        return self._exclusive()

    def drop_bookkeeping(self, *, dry_run: bool = False, log: Log = _quiet) -> dict[str, Any]:
        """The slot's rows in the progress, sync and rejects tables, and staging tables a crashed apply left,
        in one transaction; the bookkeeping tables themselves stay (other pipelines may keep theirs there)."""
        slot, conn = self.spec.source.slot, self.conn
        try:
            _, schema = self._watermarks_schema()
            progress, sync, rejects = (qualified(schema, n) for n in (PROGRESS_TABLE, SYNC_TABLE, REJECTS_TABLE))
            rows = slot_rows(conn, slot, (progress, sync, rejects))
            known = set(self.tables) | slot_targets(conn, slot, (progress, sync))
            staging = leftover_staging(conn, schema, [staging_prefix(slot, t) for t in known])
            if not dry_run:
                delete_slot_rows(conn, slot, (progress, sync, rejects))
                with conn.cursor() as cur:
                    for name in staging:
                        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                            sql.Identifier(schema, name)))
                conn.commit()
                log(f"deleted {sum(rows.values())} bookkeeping row(s) of slot {slot} in schema {schema} and dropped "
                    f"{len(staging)} leftover staging table(s)")
        finally:
            conn.rollback()
        self._progress_table = None
        return {"kind": self.kind, "bookkeeping_schema": schema, "rows": rows,
                "staging_tables": [f"{schema}.{n}" for n in staging]}

    def mark_retired(self, bookkeeping: dict[str, Any]) -> None:
        # Its watermarks are gone: while the spec still lists it, a run must refuse instead of applying every
        # staged batch again (bookkeeping_schema.locate); reset clears the mark.
        write_record(self.spec.staging.uri, self.spec.source.slot, self.identity(),
                     TargetRecord(str(bookkeeping["bookkeeping_schema"]), applied=True, retired=True))

    def overlapped_snapshot_load(self, config: Callable[[], ApplyConfig], *, local_master: bool,
                                 log: Callable[[str], None]) -> OverlappedLoad | None:
        from airflow_provider_pglogical.apply.targets.postgres.overlap import OverlappedLoad
        from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget
        from airflow_provider_pglogical.apply.without_spark import refusing_session

        def make() -> tuple[PostgresTarget, ApplyConfig]:
            cfg = config()
            return cast(PostgresTarget, self.for_apply(refusing_session(local_master), cfg)), cfg

        return OverlappedLoad(make, log=log)

    def for_apply(self, spark: SparkSession | SparkOnDemand, config: ApplyConfig) -> Target:
        from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget

        # The tables this run may write: their schemas are candidates for the bookkeeping schema.
        names = [planning.target_name(s, c) for s, c in config.tables.items()]
        return PostgresTarget(spark, config, self.dsn, target_tables=names)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class LakeSpecTarget(SpecTarget):
    """What the lake targets (Delta, Iceberg) share: the apply runs in the worker's Spark driver, and object-store
    credentials come from ``target.conn_id`` (an AWS, Google Cloud or Azure connection, by the store of
    ``storage_uri``, resolved as staging's are: ``hooks/storage_connection.py``) as the variables the environment
    route reads, set in this process around each question and the apply only (``delta/settings.py``)."""

    # The table library writes from the Spark driver: the worker is the driver, unless the spec reaches Spark by
    # spark-submit (``spark.conn_id``), whose client-mode driver then runs the spec app (docs/delta.md).
    applies_in_worker = True
    maintainable = True
    needs_conn_id = False  # without one, the worker's environment holds the credentials

    def __init__(self, spec: PipelineSpec) -> None:
        super().__init__(spec)
        self._env: dict[str, str] | None = None

    @property
    def early_spark_start(self) -> bool:
        # With conn_id the credentials are in this process (and so the JVM and its Python workers)
        # only around the apply: Spark starts then, not during the drain.
        return not self.spec.target.conn_id

    @property
    def takes_direct_rows(self) -> bool:
        # A mirror reads the direct path's net rows itself (``lake/direct.py``); a change feed needs Spark's frames.
        return self.spec.target.mode == "mirror"

    @property
    def env(self) -> dict[str, str]:
        if self._env is None:
            conn_id = self.spec.target.conn_id
            self._env = connection_env(self.storage_uri, conn_id) if conn_id else {}
        return self._env

    @property
    def storage_uri(self) -> str:
        """Where the tables' files lie (its scheme picks the connection's store)."""
        raise NotImplementedError

    @contextmanager
    def _environment(self) -> Iterator[None]:
        with scoped(self.env):
            yield

    def environment(self) -> AbstractContextManager[None]:
        return self._environment()

    def credentials_env(self) -> dict[str, str]:
        return dict(self.env)

    def check_resync(self, tables: Sequence[str]) -> None:
        if tables and self.spec.target.mode != "mirror":  # nothing would load it
            raise SpecError(f"resync of {', '.join(tables)}: a {self.kind} target loads snapshots in mode: mirror only")


@register("delta")
class DeltaSpecTarget(LakeSpecTarget):
    """Delta tables under ``target.uri``; watermarks and sync marks are app transactions in each table's log."""

    @property
    def storage_uri(self) -> str:
        return self.spec.target.uri or ""

    def delta_target(self) -> DeltaTarget:
        from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
        from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget

        t = self.spec.target
        return DeltaTarget(DeltaLocation(t.uri or "", dict(t.storage_options)), self.spec.source.slot, mode=t.mode,
                           partition_by=t.partition_by, max_merge_rows=t.max_merge_rows)

    def watermarks(self) -> dict[str, int]:
        with self.environment():
            return self.delta_target().watermarks(self.spec.source.slot, set(self.tables))

    def sync_marks(self) -> dict[str, int]:
        with self.environment():
            return self.delta_target().sync_marks(self.spec.source.slot, set(self.tables))

    def reset(self, *, log: Log = _quiet) -> dict[str, Any]:
        # A Delta table's watermark lives in its log with its data: replay into a new uri (or delete the
        # table directories) rather than rewriting history under readers.
        raise SpecError(f"{self.spec.origin}: reset of a delta target is not supported; point target.uri at a new "
                        "location to rebuild it (docs/delta.md)")

    def maintain(self, *, retention_hours: int, vacuum: bool) -> dict[str, Any]:
        from airflow_provider_pglogical.apply.targets.delta.maintenance import maintain

        with self.environment():
            location = self.delta_target().location
            return {"tables": maintain(location, sorted(self.tables), retention_hours=retention_hours, vacuum=vacuum)}

    def drop_bookkeeping(self, *, dry_run: bool = False, log: Log = _quiet) -> dict[str, Any]:
        # Watermarks and sync marks are app transactions in each table's log, committed with the data they
        # describe: they go only with the tables, which drop keeps.
        return {"kind": self.kind, "rows": {},
                "note": "the watermarks live in each Delta table's log with its data: nothing separate to drop"}

    def for_apply(self, spark: SparkSession | SparkOnDemand, config: ApplyConfig) -> Target:
        return self.delta_target()


@register("iceberg")
class IcebergSpecTarget(LakeSpecTarget):
    """Iceberg tables in ``target.catalog`` (``target.namespace``, else each table's schema); watermarks and sync
    marks are table properties committed with the data (docs/iceberg.md)."""

    def identity(self) -> str:
        # The catalog and the namespace are the place: one catalog connection may serve several targets, each in a
        # namespace of its own. A catalog database's password (``${ENV}`` in its uri) is left out.
        t = self.spec.target
        catalog = _without_userinfo(t.catalog.get("uri") or t.catalog.get("warehouse") or t.conn_id or "")
        return f"{self.kind}/{catalog}/{t.namespace or '*'}"

    def location(self) -> str:
        return self.identity()

    def former_identities(self) -> tuple[str, ...]:
        return (f"{self.kind}/{self.spec.target.uri or self.spec.target.conn_id or ''}",)  # before namespaces counted

    @property
    def storage_uri(self) -> str:
        return str(self.spec.target.catalog.get("warehouse") or "")

    def iceberg_target(self) -> IcebergTarget:
        from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
        from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget

        t = self.spec.target
        return IcebergTarget(IcebergLocation(dict(t.catalog), t.namespace), self.spec.source.slot, mode=t.mode,
                             partition_by=t.partition_by)

    def watermarks(self) -> dict[str, int]:
        with self.environment():
            return self.iceberg_target().watermarks(self.spec.source.slot, set(self.tables))

    def sync_marks(self) -> dict[str, int]:
        with self.environment():
            return self.iceberg_target().sync_marks(self.spec.source.slot, set(self.tables))

    def reset(self, *, log: Log = _quiet) -> dict[str, Any]:
        # The watermark is committed with the data it describes: rebuild into new tables rather than rewrite them.
        raise SpecError(f"{self.spec.origin}: reset of an iceberg target is not supported; point target.namespace at "
                        "a new namespace to rebuild it from the staged log (docs/iceberg.md)")

    def maintain(self, *, retention_hours: int, vacuum: bool) -> dict[str, Any]:
        from airflow_provider_pglogical.apply.targets.iceberg.maintenance import maintain

        with self.environment():
            return {"tables": maintain(self.iceberg_target(), sorted(self.tables), retention_hours=retention_hours,
                                       expire=vacuum)}

    def drop_bookkeeping(self, *, dry_run: bool = False, log: Log = _quiet) -> dict[str, Any]:
        return {"kind": self.kind, "rows": {},
                "note": "the watermarks are properties of each Iceberg table, committed with its data: nothing "
                        "separate to drop"}

    def for_apply(self, spark: SparkSession | SparkOnDemand, config: ApplyConfig) -> Target:
        return self.iceberg_target()
