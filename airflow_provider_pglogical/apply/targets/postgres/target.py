"""The PostgreSQL target: a batch's frames COPYed into unlogged staging tables, then applied in one transaction.

A table-batch the direct path covers (``apply/direct.py``) is printed from its staged files (``arrownet.py``) by
Spark's executors when the run's session runs, else by threads of this process: a run whose every table-batch is
such a one never starts Spark (``apply/spark_on_demand.py``).

Crash windows: executors COPY into unlogged staging tables first (nothing visible yet; a crash
leaves only staging tables, which the next run drops and refills). The apply transaction then
does the truncates and the changes (``setbased.py``, or ``ordered.py`` change by change) *and*
moves the watermark in the progress table (``progress.py``); a crash before COMMIT leaves the
target untouched, a crash after COMMIT makes the next run skip the batch (end_lsn ≤ watermark)
and just drop the leftover staging tables.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg2
import pyarrow as pa
from psycopg2 import sql

from airflow_provider_pglogical.apply import planning
from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.sparkenv import SESSION_CONF, task_slots
from airflow_provider_pglogical.apply.targets.base import (
    BatchChanges,
    BatchResult,
    DirectNet,
    DirectNetSource,
    PlannedBatch,
    PlannedSnapshot,
    PlannedTable,
    TargetTable,
)
from airflow_provider_pglogical.apply.targets.postgres import (
    arrownet,
    catalog,
    ordered,
    progress,
    replication_role,
    schema,
    setbased,
    snapshot,
)
from airflow_provider_pglogical.apply.targets.postgres.bookkeeping_schema import (
    has_watermarks,
    locate,
    qualified,
    remember,
    target_identity,
)
from airflow_provider_pglogical.apply.targets.postgres.copy import (
    copy_partitions,
    create_staging,
    drop_leftover_staging,
    drop_staging,
    staging_columns,
)
from airflow_provider_pglogical.apply.targets.postgres.plan import (
    KEEP,
    OP,
    BatchPlan,
    TablePlan,
    staging_name,
    staging_prefix,
)
from airflow_provider_pglogical.apply.targets.postgres.target_types import describe_types
from airflow_provider_pglogical.exceptions import ApplyError, ConstraintViolationError
from airflow_provider_pglogical.staging.target_record import TargetRecord, read_record

if TYPE_CHECKING:
    # pyspark is imported where a frame is made: a run with nothing to apply, or applying without Spark, needs none.
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)


def _noop(_name: str) -> None:
    pass


def _rows_schema() -> StructType:
    """The COPY writers' output (rows written per partition) as a type, not DDL: over Spark Connect a DDL string
    costs a round trip to parse."""
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("rows", LongType())])


def _task_rows(copy: Callable[[Iterable[tuple[str, int]]], Iterable[int]]
               ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function over a frame of (file, row group) tasks running ``copy`` (one partition's tasks,
    row counts out) on them."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tasks = ((str(f), int(g)) for b in batches
                 for f, g in zip(b.column(0).to_pylist(), b.column(1).to_pylist(), strict=True))
        for rows in copy(tasks):
            yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))
    return run


class PostgresTarget:
    """``Target`` for a PostgreSQL database reached by ``dsn`` (driver and executors alike)."""

    def __init__(self, spark: SparkSession | SparkOnDemand, config: ApplyConfig, dsn: str,
                 target_tables: Sequence[str] = (), *, on_checkpoint: Callable[[str], None] | None = None) -> None:
        """``target_tables``: the tables the run may write, whose schemas are candidates for the
        bookkeeping schema when ``config.bookkeeping_schema`` is unset (``bookkeeping_schema.py``).
        ``on_checkpoint(name)``: called at the snapshot load's crash windows (``snapshot.CHECKPOINTS``),
        where the crash tests stop the process. ``spark``: a running session or one started on demand."""
        self.on_demand = SparkOnDemand.of(spark)
        self.checkpoint: Callable[[str], None] = on_checkpoint or _noop
        self.config = config
        self.dsn = dsn
        self.target_tables = tuple(target_tables)
        self._conn: Any = None
        # Snapshot groups loading at once, shared with this target's siblings: at most PARALLEL_GROUPS load
        # transactions (and their connections) however many threads load sets (``overlap.OverlappedLoad``).
        self.group_loads = snapshot.LoadSlots(snapshot.PARALLEL_GROUPS)

    @property
    def spark(self) -> SparkSession:
        """The run's Spark session (started now when it is on demand and was not yet)."""
        return self.on_demand.session()

    @property
    def conn(self) -> Any:
        if self._conn is None:
            raise ApplyError("the PostgreSQL target is used outside its session()")
        return self._conn

    @contextmanager
    def session(self, slot: str) -> Iterator[None]:
        self.on_demand.conf(SESSION_CONF)  # what the COPY text relies on (UTC, readable TIME columns), exact names
        self._conn = self._open_conn()
        try:
            # One apply per slot and target at a time: staging table names are per (slot, batch).
            if not catalog.try_lock_slot(self._conn, slot):
                raise ApplyError(f"another apply of slot {slot} into this target is running")
            # Progress, rejects and staging tables go to a schema the role can create in (a loader role
            # that owns only its schema has no CREATE on public); from here on their names are qualified.
            # The location is the pipeline's own (recorded in its staging area), never whatever progress table
            # the search path finds: that one may be another pipeline's, holding none of this slot's watermarks.
            resolved = locate(self._conn, self.config.bookkeeping_schema, self.target_tables, slot=slot,
                              staging_uri=self.config.staging_root, progress_table=self.config.progress_table)
            self._conn.commit()
            self.config = replace(self.config, bookkeeping_schema=resolved,
                                  progress_table=qualified(resolved, self.config.progress_table),
                                  rejects_table=qualified(resolved, self.config.rejects_table))
            log.info("bookkeeping tables %s, %s and staging tables in schema %s", self.config.progress_table,
                     self.config.rejects_table, resolved)
            progress.ensure_bookkeeping(self._conn, self.config.progress_table, self.config.rejects_table)
            # Staging tables a run left when it died after its COMMIT (the rerun skips that batch or
            # snapshot): this slot's, of the tables this run may write or that have a watermark.
            known = set(self.target_tables) | set(progress.watermarks(self._conn, self.config.progress_table, slot))
            try:
                dropped = drop_leftover_staging(self._conn, resolved, [staging_prefix(slot, t) for t in known])
            except psycopg2.Error as exc:  # e.g. left by another role: cleanup never fails the run
                self._conn.rollback()
                log.warning("could not drop staging tables a crashed run of slot %s left in %s: %s", slot, resolved,
                            exc.pgcode)
            else:
                if dropped:
                    log.info("dropped %d staging table(s) a crashed run of slot %s left in %s", len(dropped), slot,
                             resolved)
            try:
                yield
            except BaseException:
                # Batches committed before the failure (or before a step stopped the apply for Spark) count too;
                # recording them never hides the failure.
                with suppress(Exception):
                    self._conn.rollback()
                    self._remember_applied(slot, resolved)
                raise
            self._remember_applied(slot, resolved)
        finally:
            catalog.unlock_slot(self._conn, slot)
            self._conn.close()
            self._conn = None

    @contextmanager
    def sibling(self) -> Iterator[PostgresTarget]:
        """This target on a connection of its own, with this session's resolved bookkeeping, for a thread that
        works under this session's slot lock (``overlap.OverlappedLoad``'s loaders); closed after the block."""
        twin = PostgresTarget(self.on_demand, self.config, self.dsn, self.target_tables, on_checkpoint=self.checkpoint)
        twin.group_loads = self.group_loads
        twin._conn = self._open_conn()
        try:
            yield twin
        finally:
            twin._conn.close()
            twin._conn = None

    def _open_conn(self) -> Any:
        """A connection to the target, its replication role set like a native subscriber's apply worker
        (``replication_role.py``) and committed before anything else; closed on failure."""
        conn = catalog.connect(self.dsn)
        try:
            replication_role.set_replication_role(conn, self.config.session_replication_role)
        except BaseException:
            conn.close()
            raise
        return conn

    def _remember_applied(self, slot: str, resolved: str) -> None:
        """From the first committed watermark on, a missing one is an error rather than a replay from zero: the
        staging area records that this target applied."""
        applied = has_watermarks(self._conn, self.config.progress_table, slot)
        self._conn.rollback()
        if applied:
            target = target_identity(self._conn)
            self._conn.rollback()
            remember(self.config.staging_root, slot, target, TargetRecord(resolved, applied=True),
                     read_record(self.config.staging_root, slot, target))

    @property
    def bookkeeping_schema(self) -> str:
        """The schema of the progress, rejects and staging tables (resolved when the session opens)."""
        return self.config.bookkeeping_schema or "public"

    def watermarks(self, slot: str, tables: Collection[str] = ()) -> dict[str, int]:
        """Every table's watermark of ``slot`` (one read of the progress table; ``tables`` is not needed)."""
        marks = progress.watermarks(self.conn, self.config.progress_table, slot)
        self.conn.commit()
        return marks

    def foreign_keys(self) -> list[tuple[str, str]]:
        fks = catalog.foreign_keys(self.conn)
        self.conn.commit()
        return fks

    def describe(self, table: str) -> TargetTable | None:
        return catalog.describe(self.conn, table)

    def create_table(self, table: str, columns: Sequence[tuple[str, str]], key: Sequence[str]) -> None:
        catalog.create_table(self.conn, table, columns, key)
        self.conn.commit()

    # -- snapshots (``targets/base.SnapshotTarget``) -----------------------------------------

    def sync_marks(self, slot: str, tables: Collection[str] = ()) -> dict[str, int]:
        """Target table → sync LSN of the snapshot it holds (``pglogical_sync`` in the bookkeeping schema;
        {} before any). One read answers for every table, so ``tables`` is not needed."""
        marks = progress.sync_marks(self.conn, slot, qualified(self.bookkeeping_schema, progress.SYNC_TABLE))
        self.conn.commit()  # no transaction left open between the runner's steps
        return marks

    def apply_snapshot(self, plan: PlannedSnapshot, changes: BatchChanges) -> BatchResult:
        """Empty the tables, insert the snapshot rows, watermark := sync LSN := ``plan.lsn``, in one transaction."""
        return snapshot.apply_snapshot(self, plan, changes)

    # -- one batch -------------------------------------------------------------------------

    def apply_batch(self, plan: PlannedBatch, changes: BatchChanges) -> BatchResult:
        """Stage every table's net changes, apply them set-based in one transaction; when that cannot
        reproduce a native subscriber (``OrderedReplayNeeded``), stage the un-netted changes and replay
        them in commit order instead."""
        conn, seconds = self.conn, {}
        bookkeeping = self.bookkeeping_schema
        tables = [TablePlan(t.source, t.target, t.key, t.columns,
                            staging_name(plan.slot, plan.end_lsn, t.target, bookkeeping),
                            t.conflict, t.unchanged_toast) for t in plan.tables]
        batch = BatchPlan(slot=plan.slot, start_lsn=plan.start_lsn, end_lsn=plan.end_lsn, tables=tables,
                          truncate=list(plan.truncate), restart_identity=list(plan.restart_identity),
                          watermark_tables=list(plan.watermark_tables),
                          ddl=[s for t in plan.tables for s in schema.alter_statements(t.target, t.column_changes)],
                          leaf_deletes=[(t.target, t.source, t.constraint) for t in plan.leaf_truncates])
        # Staged as the tables will be once the batch's schema changes ran (they run in its transaction).
        described = {t.target: self._existing(t.target).after(t.column_changes) for t in plan.tables}
        started, replayed = time.monotonic(), False
        try:
            for planned, table in zip(plan.tables, tables, strict=True):
                net = changes.direct_net(planned) if isinstance(changes, DirectNetSource) else None
                table.staged_ops, table.keep_rows = self._stage(
                    planned, described[planned.target], table.staging_table, partial(changes.net, planned),
                    in_order=False, direct=net)
                table.key_indexed = bool(table.key) and set(described[planned.target].primary_key) == set(table.key)
                table.null_safe_key = planned.relation.replica_identity == "f" and not table.key_indexed
            staged_at = time.monotonic()
            seconds["stage"] = round(staged_at - started, 3)
            try:
                result = setbased.apply_batch(conn, batch, progress=self.config.progress_table,
                                              rejects=self.config.rejects_table)
            except setbased.OrderedReplayNeeded as why:
                # Rolled back already. A new transaction rather than a savepoint: staging the changes is a Spark
                # job, and an open transaction would hold the truncates' ACCESS EXCLUSIVE locks through it.
                log.info("batch %X-%X: %s; replaying it change by change in commit order", plan.start_lsn,
                         plan.end_lsn, why)
                seconds["apply"] = round(time.monotonic() - staged_at, 3)
                replayed, replay_at = True, time.monotonic()
                for planned, table in zip(plan.tables, tables, strict=True):
                    self._stage(planned, described[planned.target], ordered.ordered_name(table.staging_table),
                                partial(changes.ordered, planned), in_order=True)
                staged_at = time.monotonic()
                seconds["stage_ordered"] = round(staged_at - replay_at, 3)
                result = ordered.apply_ordered(conn, batch, progress=self.config.progress_table,
                                               rejects=self.config.rejects_table)
                seconds["apply_ordered"] = round(time.monotonic() - staged_at, 3)
            else:
                seconds["apply"] = round(time.monotonic() - staged_at, 3)
        except ConstraintViolationError as exc:  # rolled back: name the ways out of a missing referenced row
            sources = {planning.target_name(s, c): s for s, c in self.config.tables.items() if not s.endswith("*")}
            raise replication_role.foreign_key_error(conn, exc, sources) from None
        finally:
            # Staging tables are disposable in every outcome; a crash before this line leaves them for
            # the next run of the batch, which drops and recreates them under the same names.
            names = [t.staging for t in tables if t.staging]
            try:
                drop_staging(conn, names + ([ordered.ordered_name(n) for n in names] if replayed else []))
            except psycopg2.Error as exc:  # never mask the apply's own outcome
                conn.rollback()
                log.warning("could not drop staging tables of batch %X-%X: %s", plan.start_lsn, plan.end_lsn,
                            exc.pgcode)
        result.seconds = seconds
        return result

    def _existing(self, table: str) -> TargetTable:
        found = catalog.describe(self.conn, table)
        if found is None:
            raise ApplyError(f"target table {table} does not exist")
        return found

    def _stage(self, planned: PlannedTable, target: TargetTable, staging: str, make_frame: Callable[[], DataFrame], *,
               in_order: bool, direct: DirectNet | None = None) -> tuple[dict[str, int] | None, int | None]:
        """One table's changes COPYed by the executors into a fresh unlogged staging table; for net changes,
        returns the staged rows per op and the rows with a keep list (one scan, so the merge transaction
        can skip what the batch cannot need), else ``(None, None)``.

        Net changes per key for the set-based apply; with ``in_order``, every change with its
        position (commit LSN, order in transaction) for the ordered replay. ``direct``: the table-batch
        needs no shared transform (``direct.batch_files``); when its types allow, the executors print its
        staged files themselves (``arrownet.py``) and ``make_frame`` is never called.
        """
        if in_order:
            columns = ordered.ordered_columns(target, planned.key, planned.columns)
        else:
            columns = staging_columns(target, planned.key, planned.columns)
        types = describe_types(self.conn, columns)  # before create_staging, which commits
        create_staging(self.conn, staging, columns)
        copy_cols = [c for c, _ in columns]
        plan = arrownet.plan_direct(direct, types) if direct is not None else None
        written: int | None
        # Files on an object store are read by this process only (``batches.readable_here``), never handed to tasks.
        here = plan is not None and (not self.on_demand.started or not plan.local)
        if plan is not None and here:
            written = self._copy_here(plan, staging, copy_cols)
        elif plan is not None:
            from pyspark.sql import functions as F

            parallelism = self.config.write_partitions or task_slots(self.spark)
            slices = 1 if plan.compacted else max(1, min(len(plan.tasks), parallelism))
            # The row-group tasks as a frame (DataFrame API only: classic Spark and Spark Connect alike).
            tasks = self.spark.createDataFrame(list(plan.tasks), "file string, row_group int").repartition(slices)
            written = (tasks.mapInArrow(_task_rows(arrownet.copy_tasks(self.dsn, staging, copy_cols, plan)),
                                        _rows_schema()).agg(F.sum("rows")).collect()[0][0])
        else:
            from pyspark.sql import functions as F

            from airflow_provider_pglogical.apply.targets.postgres.copytext import copy_columns

            frame = make_frame()
            if self.config.write_partitions:
                frame = frame.repartition(self.config.write_partitions)
            text_frame, fields = copy_columns(frame, types)
            written = (text_frame.mapInArrow(copy_partitions(self.dsn, staging, copy_cols, fields), _rows_schema())
                       .agg(F.sum("rows")).collect()[0][0])
        ops: dict[str, int] | None = None
        keep_rows: int | None = None
        with self.conn.cursor() as cur:
            cur.execute(sql.SQL("ANALYZE {}").format(catalog.ident(staging)))  # the planner needs row counts
            if not in_order:
                cur.execute(sql.SQL("SELECT {op}, count(*), count(*) FILTER (WHERE cardinality({keep}) > 0) "
                                    "FROM {stg} GROUP BY {op}").format(
                    op=sql.Identifier(OP), keep=sql.Identifier(KEEP), stg=catalog.ident(staging)))
                counted = cur.fetchall()
                ops = {op: n for op, n, _ in counted}
                keep_rows = sum(k for _, _, k in counted)
                held = sum(ops.values())
            else:
                cur.execute(sql.SQL("SELECT count(*) FROM {}").format(catalog.ident(staging)))
                held = int(cur.fetchone()[0])
        self.conn.commit()
        if held != (written or 0):
            # A write task's COPY commits on its own connection: when Spark runs a task again after its COPY
            # committed (an executor lost before its result or its shuffle output reached the driver, or a
            # speculative copy), the staging table holds its rows twice while the tasks' sum counts them once.
            raise ApplyError(f"{planned.target}: the write tasks reported {written or 0} rows but staging table "
                             f"{staging} holds {held} (a write task ran again after its COPY committed); nothing "
                             "of the batch was applied: run the apply again")
        log.debug("staged %s %s changes of %s%s%s", written or 0, "ordered" if in_order else "net", planned.target,
                  " straight from the staged files" if plan is not None else "", " in this process" if here else "")
        return ops, keep_rows

    def _copy_here(self, plan: arrownet.DirectPlan, staging: str, columns: Sequence[str]) -> int:
        """The direct plan's row-group tasks run by threads of this process (no Spark session runs, or the files are
        on an object store, ``DirectPlan.local``): the same
        ``arrownet.copy_tasks`` the executors run, one COPY per slice of tasks, ``write_partitions`` or this
        machine's cores at a time. Each slice COPYs on its own connection into the unlogged staging table, as
        the executors' partitions do."""
        threads = 1 if plan.compacted else max(1, min(len(plan.tasks), self.config.write_partitions or os.cpu_count() or 1))
        slices = [plan.tasks[i::threads] for i in range(threads)]
        copy = arrownet.copy_tasks(self.dsn, staging, columns, plan)
        if threads == 1:
            return sum(copy(slices[0]))
        with ThreadPoolExecutor(threads, thread_name_prefix="direct-copy") as pool:
            return sum(sum(rows) for rows in pool.map(lambda tasks: list(copy(tasks)), slices))
