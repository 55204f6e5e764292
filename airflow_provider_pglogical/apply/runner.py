"""The thin apply handler: validate every batch's configs, then per batch plan it and hand it to the target.

Planning (``planning.plan_batch``) is pure: which tables are pending against the target's
watermarks, their keys and columns, truncate positions and FK order. The target
(``targets/base.Target``; PostgreSQL in ``targets/postgres/``) receives that plan with the
batch's changes as lazily built Spark frames (``changes.SparkBatchChanges``) and applies it
atomically by its own means. The Spark session itself is started by the first step that builds a frame
(``spark_on_demand.py``): a run the direct path covers whole (``direct.py``) starts none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

from pyspark.sql import SparkSession

from airflow_provider_pglogical.apply import planning, snapshots
from airflow_provider_pglogical.apply.batches import (
    Batch,
    list_batches,
    read_relation_versions,
    read_relations,
    read_truncates,
    verify,
)
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.filter_eval import covers
from airflow_provider_pglogical.apply.filters import referenced_columns, validate_row_filter
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.sparkenv import SESSION_CONF
from airflow_provider_pglogical.apply.targets.base import BatchReport, Target, TargetTable
from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget
from airflow_provider_pglogical.exceptions import ApplyError
from airflow_provider_pglogical.progress import Progress
from airflow_provider_pglogical.staging.reader import RelationInfo

log = logging.getLogger(__name__)


def _validate(spark: SparkOnDemand, config: ApplyConfig, batches: list[Batch]) -> dict[int, dict[str, RelationInfo]]:
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
                validate_row_filter(_filter_parser(spark, cfg.row_filter), cfg.row_filter, table=source, columns=rel.column_names,
                                    identity=rel.identity_columns, replica_identity=rel.replica_identity,
                                    actions=cfg.actions, types={c.name: c.type_name for c in rel.columns})
    return relations


def _filter_parser(spark: SparkOnDemand, expression: str) -> SparkSession | None:
    """The session whose parser must read a row filter too, or None when the filter is of the subset evaluated in
    this process (``filter_eval.covers``: constructs Spark reads as PostgreSQL does), so checking it starts no JVM."""
    return None if covers(expression) else spark.session()


def apply_slot(spark: SparkSession | SparkOnDemand, config: ApplyConfig, dsn: str | None = None, *,
               target: Target | None = None,
               on_batch: Callable[[BatchReport], None] | None = None) -> list[BatchReport]:
    """Apply every staged batch of the slot beyond the target's watermarks, oldest first.

    Idempotent under replay: a batch whose end_lsn is at or below a target table's watermark is
    skipped for that table, and each batch commits its changes together with the watermark.
    The target is ``target``, or PostgreSQL at ``dsn``. ``on_batch`` sees each batch's report
    right after its commit (metrics, report files). ``spark``: a running session, or one started
    on demand (``SparkOnDemand``: only when a step builds a Spark frame).
    """
    spark = SparkOnDemand.of(spark)
    spark.conf(SESSION_CONF)  # on a session handed over too (a user's, spark-submit's)
    batches = list_batches(config.staging_root, config.slot, spark.local_master)
    if config.max_batches is not None:
        batches = batches[: config.max_batches]
    if target is None:
        if dsn is None:
            raise ApplyError("apply_slot needs a target or a PostgreSQL DSN")
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


def _apply_one(spark: SparkOnDemand, config: ApplyConfig, target: Target, batch: Batch,
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
    # Before a target sees any of it (a table created, a row read): every staged file is what was written.
    verify(spark, batch)
    existing = _Described(target)
    staged = read_relation_versions(batch)
    for source, (name, cfg) in sorted(pending.items()):
        if source in batch.table_files and existing[name] is None:
            rel = rels[source]
            # With every column of the batch's schema versions: each exists before its rows.
            shapes = [r for _, r in staged.get(source, ())] or [rel]
            target.create_table(name, planning.column_types(rel, planning.batch_columns(shapes, cfg), name, shapes),
                                planning.created_key(rel, cfg, planning.written_columns(rel, cfg)))
            existing.found.pop(name)
    # Columns each row filter references: an UPDATE/DELETE is refused when they leave the replica identity.
    filter_columns = {source: referenced_columns(_filter_parser(spark, cfg.row_filter), cfg.row_filter)
                      for source, (_, cfg) in pending.items() if cfg.row_filter and source in batch.table_files}
    # The shapes before the batch (the previous batch's relation state) are judged first: a type change
    # between two batches is judged like one inside a batch.
    previous = planning.previous_shapes(batch.reader.relation_state(batch.start_lsn))
    # By target table: a TRUNCATE ... CASCADE reaches tables through the target's foreign keys.
    synced = {planning.target_name(s, c): lsn for s, lsn in sync.items() if (c := config.table_config(s)) is not None}
    plan = planning.plan_batch(config.slot, batch.start_lsn, batch.end_lsn, set(batch.table_files), pending, rels,
                               truncates, marks, target.foreign_keys(), existing, staged, filter_columns, previous,
                               synced)
    for table in plan.tables:
        if table.column_changes:
            log.info("batch %X-%X: %s follows source schema changes: %s", batch.start_lsn, batch.end_lsn,
                     table.target, ", ".join(f"{c.kind} {c.column}" for c in table.column_changes))
    result = target.apply_batch(plan, SparkBatchChanges(spark, batch, sync))
    report.applied, report.rows, report.ordered = result.applied, result.rows, result.ordered
    report.seconds = result.seconds
    return report
