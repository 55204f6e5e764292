"""The thin apply handler: validate every batch's configs, then per batch build net changes with Spark, stage them, apply in one transaction.

When the set-based apply cannot reproduce a native subscriber for a batch (``OrderedReplayNeeded``),
the batch's un-netted changes are staged too and replayed change by change (``targets/ordered.py``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply import planning, schema_changes
from airflow_provider_pglogical.apply.batches import (
    Batch,
    RelationInfo,
    has_value_notes,
    list_batches,
    read_changes,
    read_relation_versions,
    read_relations,
    read_truncates,
)
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.filters import apply_row_filter, referenced_columns, validate_row_filter
from airflow_provider_pglogical.apply.notes import fold_notes, inherit_toast_notes
from airflow_provider_pglogical.apply.targets import ordered, pg_schema, setbased
from airflow_provider_pglogical.apply.targets import postgres as pg
from airflow_provider_pglogical.apply.targets.copytext import SESSION_CONF, copy_lines
from airflow_provider_pglogical.apply.targets.target_types import PgType, describe_types
from airflow_provider_pglogical.apply.transforms import (
    FROM,
    KEEP,
    KIND,
    LSN,
    SEQ,
    TOUCHED,
    compact,
    filter_actions,
    first_update_or_delete,
    project_columns,
    resolve_toast_from_old,
    to_appends,
    to_key_events,
    to_ordered_changes,
    void_before,
)
from airflow_provider_pglogical.exceptions import ApplyError, ReplicaIdentityError, RowFilterError, format_lsn

log = logging.getLogger(__name__)


@dataclass
class BatchReport:
    start_lsn: int
    end_lsn: int
    applied: bool
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    # "stage" (Spark + COPY), "apply" (transaction); after a fallback also "stage_ordered", "apply_ordered"
    seconds: dict[str, float] = field(default_factory=dict)
    ordered: bool = False  # applied change by change in commit order (the set-based apply could not)


def read_dsn(config: ApplyConfig) -> str:
    """The target DSN from a 0600 file or an environment variable — never from arguments."""
    if config.dsn_file:
        path = Path(config.dsn_file)
        if path.stat().st_mode & 0o077:
            raise ApplyError(f"DSN file {path} must not be readable by group or others (chmod 600)")
        return path.read_text().strip()
    dsn = os.environ.get(config.dsn_env)
    if not dsn:
        raise ApplyError(f"environment variable {config.dsn_env} with the target DSN is not set")
    return dsn


def published_changes(df: DataFrame, rel: RelationInfo, cfg: TableApplyConfig, shape: planning.TableShape,
                      notes: bool = True) -> DataFrame:
    """Staged changes of one table as the publication sends them: actions, TOAST refill, row filter, column list.

    ``notes=False`` (the batch has no exactness notes for this table) leaves out carrying them.
    """
    all_columns = df.schema["_pgl_new"].dataType.fieldNames()
    df = df.transform(filter_actions(cfg.actions))
    if notes:
        df = df.transform(inherit_toast_notes)
    df = (df.transform(resolve_toast_from_old(all_columns, rel.identity_columns))
          .transform(apply_row_filter(cfg.row_filter, all_columns)))
    if notes:
        df = df.transform(fold_notes)  # after the filter, which needs the typed values
    return df.transform(project_columns(shape.columns))


def net_changes(df: DataFrame, rel: RelationInfo, cfg: TableApplyConfig, shape: planning.TableShape,
                truncated_at: tuple[int, int] | None, notes: bool = True) -> DataFrame:
    """Staged changes of one table → one net change per key (the whole pure pipeline); keyless: every INSERT."""
    if not shape.key:
        return published_changes(df, rel, cfg, shape, notes).transform(to_appends(shape.columns)) \
            .transform(void_before(truncated_at))
    return (published_changes(df, rel, cfg, shape, notes)
            .transform(to_key_events(shape.key, shape.columns))
            .transform(void_before(truncated_at))
            .transform(compact(shape.key, shape.columns)))


def ordered_changes(df: DataFrame, rel: RelationInfo, cfg: TableApplyConfig, shape: planning.TableShape,
                    truncated_at: tuple[int, int] | None, notes: bool = True) -> DataFrame:
    """Staged changes of one table → every change after the last truncate, un-netted, for the ordered replay."""
    if not shape.key:
        return net_changes(df, rel, cfg, shape, truncated_at, notes)
    return (published_changes(df, rel, cfg, shape, notes)
            .transform(to_ordered_changes(shape.key, shape.columns))
            .transform(void_before(truncated_at)))


def _validate(spark: SparkSession, config: ApplyConfig, batches: list[Batch]) -> dict[int, dict[str, RelationInfo]]:
    """Every configured table of every batch, checked before anything is written."""
    relations: dict[int, dict[str, RelationInfo]] = {}
    seen: set[tuple[str, RelationInfo]] = set()
    for batch in batches:
        relations[batch.end_lsn] = rels = read_relations(batch)
        for source in batch.table_files:
            cfg = config.table_config(source)
            if cfg is None:
                continue
            rel = rels.get(source)
            if rel is None:
                raise ApplyError(f"batch {batch.start_lsn}-{batch.end_lsn}: no relation schema for {source}")
            if (source, rel) in seen:
                continue
            seen.add((source, rel))
            planning.written_columns(rel, cfg)
            if cfg.row_filter:
                validate_row_filter(spark, cfg.row_filter, table=source, columns=rel.column_names,
                                    identity=rel.identity_columns, replica_identity=rel.replica_identity,
                                    actions=cfg.actions, types={c.name: c.type_name for c in rel.columns})
    return relations


def apply_slot(spark: SparkSession, config: ApplyConfig, dsn: str) -> list[BatchReport]:
    """Apply every staged batch of the slot beyond the targets' watermarks, oldest first.

    Idempotent under replay: a batch whose end_lsn is at or below a target table's watermark is
    skipped for that table, and each batch commits its changes together with the watermark.
    """
    for key, value in SESSION_CONF.items():  # what copy_lines' text relies on (UTC, readable TIME columns)
        spark.conf.set(key, value)
    batches = list_batches(config.staging_root, config.slot)
    if config.max_batches is not None:
        batches = batches[: config.max_batches]
    relations = _validate(spark, config, batches)
    conn = pg.connect(dsn)
    reports: list[BatchReport] = []
    try:
        # One apply per slot and target at a time: staging table names are per (slot, batch).
        if not pg.try_lock_slot(conn, config.slot):
            raise ApplyError(f"another apply of slot {config.slot} into this target is running")
        pg.ensure_bookkeeping(conn, config.progress_table, config.rejects_table)
        fks = pg.foreign_keys(conn)
        conn.commit()
        for batch in batches:
            reports.append(_apply_one(spark, config, dsn, conn, batch, relations[batch.end_lsn], fks))
            log.info("batch %X-%X applied=%s rows=%s seconds=%s", batch.start_lsn, batch.end_lsn,
                     reports[-1].applied, reports[-1].rows, reports[-1].seconds)
    finally:
        conn.close()
    return reports


def _stage_table(spark: SparkSession, config: ApplyConfig, dsn: str, conn, batch: Batch, rel: RelationInfo,
                 cfg: TableApplyConfig, shape: planning.TableShape, target: pg.TargetTable, staging: str,
                 truncated_at: tuple[int, int] | None, *, in_order: bool = False) -> None:
    """One table's changes COPYed by the executors into a fresh unlogged staging table.

    Net changes per key for the set-based apply; with ``in_order``, every change with its
    position (commit LSN, order in transaction) for the ordered replay.
    """
    changes = read_changes(spark, batch, shape.source)
    if shape.update_delete_problem and not in_order:
        check_updates_deletes(changes, rel, cfg, shape, batch)
    notes = has_value_notes(batch, shape.source)
    from_key = [F.col(FROM).getField(k).alias(pg.from_column(i)) for i, k in enumerate(shape.key)]
    if in_order:
        columns = ordered.ordered_columns(target, shape.key, shape.columns)
        frame = ordered_changes(changes, rel, cfg, shape, truncated_at, notes).select(
            KIND, KEEP, LSN, F.col(SEQ).getField("c").alias(ordered.COMMIT),
            F.col(SEQ).getField("o").alias(ordered.ORDER), *from_key, *shape.columns)
    else:
        columns = pg.staging_columns(target, shape.key, shape.columns)
        frame = net_changes(changes, rel, cfg, shape, truncated_at, notes).select(KIND, KEEP, LSN, *from_key, TOUCHED,
                                                                            *shape.columns)
    types = describe_types(conn, columns)  # before create_staging, which commits
    pg.create_staging(conn, staging, columns)
    written = _copy(config, dsn, conn, frame, staging, [c for c, _ in columns], types)
    log.debug("staged %s %s changes of %s", written, "ordered" if in_order else "net", shape.target)


def check_updates_deletes(changes: DataFrame, rel: RelationInfo, cfg: TableApplyConfig, shape: planning.TableShape,
                          batch: Batch) -> None:
    """Stop the batch, naming table and LSN, when an UPDATE/DELETE arrives that the table cannot apply.

    Judged on published actions (an unpublished UPDATE never arrives natively either); insert-only
    traffic passes. ``RowFilterError`` for the filter rule, ``ReplicaIdentityError`` otherwise.
    """
    count, lsn = first_update_or_delete(changes.transform(filter_actions(cfg.actions)))
    if not count:
        return
    text = (f"{count} UPDATE/DELETE change(s) of {shape.source} from LSN {format_lsn(lsn)} cannot be applied: the table "
            f"{shape.update_delete_problem}; batch {format_lsn(batch.start_lsn)}-{format_lsn(batch.end_lsn)} not "
            "applied (PostgreSQL refuses such changes on the publisher)")
    if planning.has_replica_identity(rel):
        raise RowFilterError(text)
    raise ReplicaIdentityError(text, table=shape.source, lsn=lsn)


def _copy(config: ApplyConfig, dsn: str, conn, frame: DataFrame, staging: str, copy_cols: list[str],
          types: dict[str, PgType]) -> int:
    """``frame`` (kind, keep, lsn, then ``copy_cols``, whose target type trees are ``types``) COPYed by the executors
    into ``staging``, then analyzed."""
    if config.write_partitions:
        frame = frame.repartition(config.write_partitions)
    written = (copy_lines(frame, types).mapInArrow(pg.copy_partitions(dsn, staging, copy_cols), "rows long")
               .agg(F.sum("rows")).collect()[0][0])
    with conn.cursor() as cur:
        cur.execute(pg.sql.SQL("ANALYZE {}").format(pg.ident(staging)))  # the planner needs row counts
    conn.commit()
    return written or 0


def _apply_one(spark: SparkSession, config: ApplyConfig, dsn: str, conn, batch: Batch,
               rels: dict[str, RelationInfo], fks: list[tuple[str, str]]) -> BatchReport:
    marks = pg.watermarks(conn, config.progress_table, config.slot)
    conn.commit()
    truncates = read_truncates(batch)
    sources = set(batch.table_files) | {r for ev in truncates for r in ev.relations}
    configured = {s: (planning.target_name(s, c), c) for s in sources if (c := config.table_config(s)) is not None}
    pending = {s: tc for s, tc in configured.items() if marks.get(tc[0], -1) < batch.end_lsn}
    report = BatchReport(batch.start_lsn, batch.end_lsn, applied=False)
    if not pending:
        return report
    truncs = planning.plan_truncates(truncates, pending, fks)
    truncs_pending = {t: p for t, p in truncs.position.items() if marks.get(t, -1) < batch.end_lsn}
    shapes: dict[str, planning.TableShape] = {}
    targets: dict[str, pg.TargetTable] = {}
    versions = read_relation_versions(batch)
    ddl: list = []
    for source, (target, cfg) in sorted(pending.items()):
        if source not in batch.table_files:
            continue
        rel = rels[source]
        existing = pg.describe(conn, target)
        columns = planning.written_columns(rel, cfg)
        key = planning.choose_key(rel, cfg, existing, columns)
        if existing is None:
            types = {c.name: c.type_name for c in rel.columns}
            if any(types[c] is None for c in columns):
                raise ApplyError(f"cannot create {target}: the staged relation lacks type names")
            pg.create_table(conn, target, [(c, types[c]) for c in columns], key)
            conn.commit()
            existing = pg.describe(conn, target)
            fks = pg.foreign_keys(conn)
        refs = referenced_columns(spark, cfg.row_filter) if cfg.row_filter else frozenset()
        shape = planning.TableShape(source, target, key, columns, planning.update_delete_problem(rel, cfg, refs))
        changes = schema_changes.plan_column_changes(
            target, existing.columns, pg_schema.not_null_without_default(conn, target),
            [schema_changes.SourceVersion(lsn, {c.name: c.type_name for c in v.columns})
             for lsn, v in versions.get(source, [(batch.start_lsn, rel)])], columns, policy=cfg.schema_changes)
        conn.commit()
        if changes:
            log.info("batch %X-%X: %s follows source schema changes: %s", batch.start_lsn, batch.end_lsn, target,
                     ", ".join(f"{c.kind} {c.column}" for c in changes))
            ddl += pg_schema.alter_statements(target, changes)
            existing = pg_schema.planned_table(existing, changes)
        planning.check_target_columns(shape, existing)
        shapes[source], targets[source] = shape, existing
    started = time.monotonic()
    order = planning.parents_first(sorted({s.target for s in shapes.values()}), fks)
    plans: list[pg.TablePlan] = []
    replayed = False
    try:
        for target in order:
            source, shape = next((s, sh) for s, sh in shapes.items() if sh.target == target)
            cfg = pending[source][1]
            plans.append(pg.TablePlan(source, target, shape.key, shape.columns,
                                      pg.staging_name(config.slot, batch.end_lsn, target), cfg.conflict,
                                      cfg.unchanged_toast))
            _stage_table(spark, config, dsn, conn, batch, rels[source], cfg, shape, targets[source],
                         plans[-1].staging, truncs_pending.get(target))
        truncated = planning.parents_first(sorted(t for t in truncs_pending if pg.describe(conn, t) is not None), fks)
        plan = pg.BatchPlan(
            slot=config.slot, start_lsn=batch.start_lsn, end_lsn=batch.end_lsn, tables=plans, truncate=truncated,
            restart_identity=[t for t in truncated if t in truncs.restart_identity],
            watermark_tables=sorted({t for t, _ in pending.values()} | set(truncated)), ddl=ddl)
        staged_at = time.monotonic()
        seconds = report.seconds
        seconds["stage"] = round(staged_at - started, 3)
        try:
            result = setbased.apply_batch(conn, plan, progress=config.progress_table, rejects=config.rejects_table)
        except setbased.OrderedReplayNeeded as why:
            # Rolled back already. A new transaction rather than a savepoint: staging the changes is a Spark
            # job, and an open transaction would hold the truncates' ACCESS EXCLUSIVE locks through it.
            log.info("batch %X-%X: %s; replaying it change by change in commit order", batch.start_lsn,
                     batch.end_lsn, why)
            seconds["apply"] = round(time.monotonic() - staged_at, 3)
            replayed, replay_at = True, time.monotonic()
            for p in plans:
                _stage_table(spark, config, dsn, conn, batch, rels[p.source], pending[p.source][1], shapes[p.source],
                             targets[p.source], ordered.ordered_name(p.staging), truncs_pending.get(p.target),
                             in_order=True)
            staged_at = time.monotonic()
            seconds["stage_ordered"] = round(staged_at - replay_at, 3)
            result = ordered.apply_ordered(conn, plan, progress=config.progress_table, rejects=config.rejects_table)
            seconds["apply_ordered"] = round(time.monotonic() - staged_at, 3)
        else:
            seconds["apply"] = round(time.monotonic() - staged_at, 3)
    finally:
        # Staging tables are disposable in every outcome; a crash before this line leaves them for
        # the next run of the batch, which drops and recreates them under the same names.
        names = [p.staging for p in plans if p.staging]
        try:
            pg.drop_staging(conn, names + ([ordered.ordered_name(n) for n in names] if replayed else []))
        except pg.psycopg2.Error as exc:  # never mask the apply's own outcome
            conn.rollback()
            log.warning("could not drop staging tables of batch %X-%X: %s", batch.start_lsn, batch.end_lsn,
                        exc.pgcode)
    report.applied, report.rows, report.ordered = result.applied, result.rows, result.ordered
    return report
