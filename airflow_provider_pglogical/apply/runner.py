"""The thin apply handler: validate every batch's configs, then per batch plan it and hand it to the target.

Planning (``planning.plan_batch``) is pure: which tables are pending against the target's
watermarks, their keys and columns, truncate positions and FK order. The target
(``targets/base.Target``; PostgreSQL in ``targets/postgres/``) receives that plan with the
batch's changes as lazily built Spark frames and applies it atomically by its own means.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import reduce
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply import direct, planning, snapshots
from airflow_provider_pglogical.apply.batches import (
    META,
    READ_CONF,
    Batch,
    has_value_notes,
    image_type,
    is_local,
    keys_never_repeat,
    list_batches,
    read_changes,
    read_relation_versions,
    read_relations,
    read_truncates,
)
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.filters import apply_row_filter, referenced_columns, validate_row_filter
from airflow_provider_pglogical.apply.notes import fold_notes, inherit_toast_notes
from airflow_provider_pglogical.apply.targets.base import (
    COMMIT,
    ORDER,
    PlannedTable,
    Target,
    TargetTable,
    from_column,
)
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
    single_event_net,
    to_appends,
    to_key_events,
    to_ordered_changes,
    void_before,
)
from airflow_provider_pglogical.exceptions import ApplyError, ReplicaIdentityError, RowFilterError, format_lsn
from airflow_provider_pglogical.metrics.progress import Progress
from airflow_provider_pglogical.staging.reader import RelationInfo

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
    all_columns = image_type(df, "new").fieldNames()
    df = df.transform(filter_actions(cfg.actions))
    if notes:
        df = df.transform(inherit_toast_notes)
    df = (df.transform(resolve_toast_from_old(all_columns, rel.identity_columns))
          .transform(apply_row_filter(cfg.row_filter, all_columns)))
    if notes:
        df = df.transform(fold_notes)  # after the filter, which needs the typed values
    return df.transform(project_columns(shape.columns))


def net_changes(df: DataFrame, rel: RelationInfo, cfg: TableApplyConfig, shape: planning.TableShape,
                truncated_at: tuple[int, int] | None, notes: bool = True, unique_keys: bool = False) -> DataFrame:
    """Staged changes of one table → one net change per key (the whole pure pipeline).

    ``unique_keys``: no key occurs in two staged changes (``keys_never_repeat``), so every event is
    already its key's net change and ``single_event_net`` replaces the shuffle of ``compact``.
    """
    net = single_event_net if unique_keys else compact
    if not shape.key:  # keyless (insert-only): every INSERT is its own row
        return published_changes(df, rel, cfg, shape, notes).transform(to_appends(shape.columns)) \
            .transform(void_before(truncated_at))
    return (published_changes(df, rel, cfg, shape, notes)
            .transform(to_key_events(shape.key, shape.columns))
            .transform(void_before(truncated_at))
            .transform(net(shape.key, shape.columns)))


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
        routed = config.routed(rels)
        for source in batch.table_files:
            cfg = routed.table_config(source)
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


def apply_slot(spark: SparkSession, config: ApplyConfig, dsn: str | None = None, *,
               target: Target | None = None,
               on_batch: Callable[[BatchReport], None] | None = None) -> list[BatchReport]:
    """Apply every staged batch of the slot beyond the target's watermarks, oldest first.

    Idempotent under replay: a batch whose end_lsn is at or below a target table's watermark is
    skipped for that table, and each batch commits its changes together with the watermark.
    The target is ``target``, or PostgreSQL at ``dsn``. ``on_batch`` sees each batch's report
    right after its commit (metrics, report files).
    """
    for key, value in READ_CONF.items():
        spark.conf.set(key, value)
    batches = list_batches(config.staging_root, config.slot)
    if config.max_batches is not None:
        batches = batches[: config.max_batches]
    if target is None:
        if dsn is None:
            raise ApplyError("apply_slot needs a target or a PostgreSQL DSN")
        from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget

        # The tables this run may write: their schemas are candidates for the bookkeeping schema.
        names = ([planning.target_name(s, c) for s, c in config.tables.items()] if config.tables
                 else sorted({s for b in batches for s in b.table_files}))
        target = PostgresTarget(spark, config, dsn, target_tables=names)
    relations = _validate(spark, config, batches)
    reports: list[BatchReport] = []
    with target.session(config.slot):
        # Snapshots first (apply/snapshots.py): a table's snapshot is loaded before any of its changes;
        # tables still waiting for theirs are held, the others flow with their sync LSNs.
        held = snapshots.waiting(config, target)
        reports.extend(snapshots.apply_snapshots(spark, config, target, held))
        sync = snapshots.sync_lsns(config, target)
        flowing = snapshots.without(config, held, known=_known_sources(batches))
        if flowing is None:  # every table waits for its snapshot: their batches stay for a later run
            log.info("every table waits for its snapshot (%s): no batch applied", ", ".join(sorted(held)))
            flowing, batches = config, []
        # A heartbeat line at least every 30 s while batches apply (a Spark job can run for minutes).
        total = sum(b.end_lsn - b.start_lsn for b in batches)
        with Progress(f"apply slot {config.slot}", log.info, total_bytes=total) as progress:
            for i, batch in enumerate(batches, 1):
                progress.update(phase=f"batch {i}/{len(batches)} {batch.start_lsn:X}-{batch.end_lsn:X}")
                report = _apply_one(spark, flowing, target, batch, relations[batch.end_lsn], sync)
                reports.append(report)
                progress.update(rows=progress.rows + sum(sum(c.values()) for c in report.rows.values()),
                                done_bytes=progress.done_bytes + batch.end_lsn - batch.start_lsn)
                log.info("batch %X-%X applied=%s rows=%s seconds=%s", batch.start_lsn, batch.end_lsn,
                         report.applied, report.rows, report.seconds)
                if on_batch is not None:
                    on_batch(report)
    return reports


def _known_sources(batches: list[Batch]) -> set[str]:
    """Source tables with row changes in any of the batches."""
    return {source for batch in batches for source in batch.table_files}


class _Described(Mapping[str, TargetTable | None]):
    """Target tables described on first lookup (planning asks only for the ones it needs)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.found: dict[str, TargetTable | None] = {}

    def __getitem__(self, table: str) -> TargetTable | None:
        if table not in self.found:
            self.found[table] = self.target.describe(table)
        return self.found[table]

    def __iter__(self) -> Iterator[str]:
        return iter(self.found)

    def __len__(self) -> int:
        return len(self.found)


def _apply_one(spark: SparkSession, config: ApplyConfig, target: Target, batch: Batch,
               rels: dict[str, RelationInfo], sync: Mapping[str, int] | None = None) -> BatchReport:
    """One batch; ``sync`` maps a source table to its sync LSN: its changes and truncates committed
    before it are in its snapshot (PostgreSQL's ``should_apply_changes_for_rel``) and are dropped."""
    report = BatchReport(batch.start_lsn, batch.end_lsn, applied=False)
    config = config.routed(rels)  # leaf partitions going to their root's target get their root's entry
    sync = snapshots.routed_sync_lsns(config, sync or {})
    truncates = snapshots.drop_synced_truncates(read_truncates(batch), sync)
    sources = planning.batch_sources(batch.table_files, truncates)
    marks = target.watermarks(config.slot, planning.configured_targets(sources, config))
    pending = planning.pending_tables(sources, config, marks, batch.end_lsn)
    if not pending:
        return report
    existing = _Described(target)
    for source, (name, cfg) in sorted(pending.items()):
        if source in batch.table_files and existing[name] is None:
            rel = rels[source]
            columns = planning.written_columns(rel, cfg)
            target.create_table(name, planning.column_types(rel, columns, name),
                                planning.created_key(rel, cfg, columns))
            existing.found.pop(name)
    # Columns each row filter references: an UPDATE/DELETE is refused when they leave the replica identity.
    filter_columns = {source: referenced_columns(spark, cfg.row_filter) for source, (_, cfg) in pending.items()
                      if cfg.row_filter and source in batch.table_files}
    # The shapes before the batch (the previous batch's relation state) come first: a type change
    # between two batches is judged like one inside a batch.
    versions = planning.with_previous_shapes(read_relation_versions(batch),
                                             batch.reader.relation_state(batch.start_lsn), batch.start_lsn)
    plan = planning.plan_batch(config.slot, batch.start_lsn, batch.end_lsn, set(batch.table_files), pending, rels,
                               truncates, marks, target.foreign_keys(), existing, versions, filter_columns)
    for table in plan.tables:
        if table.column_changes:
            log.info("batch %X-%X: %s follows source schema changes: %s", batch.start_lsn, batch.end_lsn,
                     table.target, ", ".join(f"{c.kind} {c.column}" for c in table.column_changes))
    result = target.apply_batch(plan, SparkBatchChanges(spark, batch, sync))
    report.applied, report.rows, report.ordered = result.applied, result.rows, result.ordered
    report.seconds = result.seconds
    return report


class SparkBatchChanges:
    """``BatchChanges`` of one staged batch: frames built from the shared pure transforms on demand.

    ``sync``: source table → sync LSN of the snapshot its target holds. A batch starting before it
    keeps only the table's changes with ``commit_lsn >= sync LSN`` (worker.c
    ``should_apply_changes_for_rel``: applied when the sync LSN ≤ the transaction's final LSN, the
    start of its commit record, which is the staged ``commit_lsn``); earlier ones are in the snapshot.
    """

    def __init__(self, spark: SparkSession, batch: Batch, sync: Mapping[str, int] | None = None) -> None:
        self.spark = spark
        self.batch = batch
        self.sync = dict(sync or {})

    def _staged(self, table: PlannedTable) -> tuple[DataFrame, bool, list[Column]]:
        changes = read_changes(self.spark, self.batch, table.source)
        sync_lsn = self.sync.get(table.source)
        if sync_lsn is not None and self.batch.start_lsn < sync_lsn:
            changes = changes.where(F.col(META + "commit_lsn") >= F.lit(sync_lsn))
        notes = has_value_notes(self.batch, table.source)
        from_key = [F.col(FROM).getField(k).alias(from_column(i)) for i, k in enumerate(table.key)]
        return changes, notes, from_key

    def net(self, table: PlannedTable) -> DataFrame:
        """Net changes; first, an UPDATE/DELETE the table cannot apply stops the batch (``check_updates_deletes``).
        The ordered replay follows only a set-based attempt, so ``ordered`` needs no check of its own.

        A table of several sources (``table.parts``: routed leaf partitions) unions their key events by
        column name, each part voided by its own truncates, and nets them together in LSN order."""
        if table.parts:
            events = []
            for part in table.parts:
                changes, notes, _ = self._staged(part)
                shape = planning.TableShape(part.source, part.target, part.key, part.columns, part.update_delete_problem)
                if shape.update_delete_problem:
                    check_updates_deletes(changes, part.relation, part.config, shape, self.batch)
                published = published_changes(changes, part.relation, part.config, shape, notes)
                events.append(published.transform(to_appends(part.columns) if not part.key
                                                  else to_key_events(part.key, part.columns))
                              .transform(void_before(part.truncated_at)))
            union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), events)
            if table.key:
                union = union.transform(compact(table.key, table.columns))
            from_key = [F.col(FROM).getField(k).alias(from_column(i)) for i, k in enumerate(table.key)]
            return union.select(KIND, KEEP, LSN, *from_key, TOUCHED, *table.columns)
        changes, notes, from_key = self._staged(table)
        shape = planning.TableShape(table.source, table.target, table.key, table.columns, table.update_delete_problem)
        if shape.update_delete_problem:
            check_updates_deletes(changes, table.relation, table.config, shape, self.batch)
        # Decided here, not in a target: every target's net frame skips compaction's shuffle then.
        unique = bool(table.key) and keys_never_repeat(self.batch, table.source, table.key,
                                                       full_identity=table.relation.replica_identity == "f")
        return (net_changes(changes, table.relation, table.config, shape, table.truncated_at, notes, unique)
                .select(KIND, KEEP, LSN, *from_key, TOUCHED, *table.columns))

    def direct_net(self, table: PlannedTable) -> direct.DirectNet | None:
        """The table-batch's staged files when its net changes need none of the shared transforms
        (``apply/direct.py``): a target may print them itself; None means ``net``."""
        sync_lsn = self.sync.get(table.source)
        files = self.batch.table_files.get(table.source, ())
        if (not files or not direct.plain_table(table) or not is_local(self.batch.uri)
                or (sync_lsn is not None and self.batch.start_lsn < sync_lsn)
                or has_value_notes(self.batch, table.source)):
            return None
        paths = tuple(f"{self.batch.ref.path}/{rel}" for rel in files)
        if not direct.same_schema(paths) or not direct.no_unchanged_toast(paths):
            return None
        if not keys_never_repeat(self.batch, table.source, table.key,
                                 full_identity=table.relation.replica_identity == "f"):
            return None
        return direct.DirectNet(table.source, table.target, paths, tuple(table.key), tuple(table.columns))

    def published(self, table: PlannedTable) -> DataFrame:
        if table.parts:  # routed leaves: unioned by name (images' fields too)
            return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True),
                          [self.published(part) for part in table.parts])
        changes, notes, _ = self._staged(table)
        shape = planning.TableShape(table.source, table.target, table.key, table.columns)
        return published_changes(changes, table.relation, table.config, shape, notes)

    def ordered(self, table: PlannedTable) -> DataFrame:
        if table.parts:  # routed leaves: every part's changes, unioned by column name (merged by position later)
            frames = [self.ordered(replace(part, columns=tuple(c for c in table.columns if c in part.columns)))
                      for part in table.parts]
            union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
            return union.select(KIND, KEEP, LSN, COMMIT, ORDER, *[from_column(i) for i in range(len(table.key))],
                                *table.columns)
        changes, notes, from_key = self._staged(table)
        shape = planning.TableShape(table.source, table.target, table.key, table.columns)
        return (ordered_changes(changes, table.relation, table.config, shape, table.truncated_at, notes)
                .select(KIND, KEEP, LSN, F.col(SEQ).getField("c").alias(COMMIT),
                        F.col(SEQ).getField("o").alias(ORDER), *from_key, *table.columns))


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
