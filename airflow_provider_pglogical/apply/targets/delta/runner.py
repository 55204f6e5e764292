"""Apply a slot's staged batches into Delta tables: the shared Spark transforms produce net (or ordered, or
published) changes per table as Arrow on the driver; ``DeltaTarget`` commits each table's batch once.

Why the driver: delta-rs writes from one process, and a MERGE needs the batch's net changes in one
place anyway; Spark does the reading, filtering, projection and compaction (the heavy part), and
hands over at most one row per key per batch (``toArrow``, no per-row Python).
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply import planning, runner
from airflow_provider_pglogical.apply.batches import (
    CHANGE_META_COLUMNS,
    META,
    NOTES_COLUMNS,
    Batch,
    RelationInfo,
    TruncateEvent,
    has_value_notes,
    list_batches,
    read_changes,
    read_truncates,
)
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.targets.delta import changelog
from airflow_provider_pglogical.apply.targets.delta.mirror import COMMIT, ORDER
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget, TableOutcome
from airflow_provider_pglogical.apply.targets.delta.types import DeltaValueError
from airflow_provider_pglogical.apply.targets.postgres.copytext import SESSION_CONF
from airflow_provider_pglogical.apply.transforms import FROM, KEEP, KIND, LSN, SEQ, TOUCHED
from airflow_provider_pglogical.exceptions import ApplyError

log = logging.getLogger(__name__)


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def _fs_path(batch: Batch) -> tuple[pafs.FileSystem, str]:
    """The batch directory as (pyarrow filesystem, path inside it)."""
    if is_local(batch.uri):
        return pafs.LocalFileSystem(), batch.uri.removeprefix("file://")
    fs, path = pafs.FileSystem.from_uri(batch.uri)
    return fs, path


def read_staged_changes(spark: SparkSession, batch: Batch, table: str) -> DataFrame:
    """``batches.read_changes`` for any staging root: object stores (``s3://``) are read with pyarrow on the
    driver and handed to Spark as Arrow, because Spark's own s3a reader needs hadoop-aws jars (docs/delta.md)."""
    if is_local(batch.uri):
        return read_changes(spark, batch, table)
    fs, root = _fs_path(batch)
    parts = [pq.read_table(posixpath.join(root, rel), filesystem=fs) for rel in batch.table_files.get(table, ())]
    if not parts:
        raise ApplyError(f"batch {batch.start_lsn}-{batch.end_lsn} has no files for {table}")
    df = spark.createDataFrame(pa.concat_tables(parts, promote_options="permissive"))
    notes = [(df[c] if c in df.columns else F.create_map().cast("map<string,string>")).alias(META + c)
             for c in NOTES_COLUMNS]
    return df.select(*[df[c].alias(META + c) for c in CHANGE_META_COLUMNS], *notes)


def apply_slot(spark: SparkSession, config: ApplyConfig, target: DeltaTarget) -> list[runner.BatchReport]:
    """Apply every staged batch of the slot beyond each Delta table's watermark, oldest first (idempotent)."""
    for key, value in SESSION_CONF.items():
        spark.conf.set(key, value)
    batches = list_batches(config.staging_root, config.slot)
    if config.max_batches is not None:
        batches = batches[: config.max_batches]
    for cfg in config.tables.values():
        if cfg.conflict == "strict":
            raise ApplyError("conflict 'strict' is not supported by the Delta target (it has no unique keys)")
    relations = runner._validate(spark, config, batches)
    reports = []
    for batch in batches:
        reports.append(_apply_batch(spark, config, target, batch, relations[batch.end_lsn]))
        log.info("batch %X-%X applied=%s rows=%s seconds=%s", batch.start_lsn, batch.end_lsn,
                 reports[-1].applied, reports[-1].rows, reports[-1].seconds)
    return reports


def _truncate_rows(batch: Batch, target: str, pending: dict[str, tuple[str, TableApplyConfig]]) -> list[dict[str, object]]:
    """Changelog rows of the batch's TRUNCATEs that empty ``target`` (listed, or cascaded by the source)."""
    fs, root = _fs_path(batch)
    path = posixpath.join(root, "truncates.parquet")
    if not batch.truncates or fs.get_file_info(path).type != pafs.FileType.File:
        return []
    out: list[dict[str, object]] = []
    for row in pq.read_table(path, filesystem=fs).to_pylist():
        ev = TruncateEvent(  # as batches.read_truncates parses it, plus the columns the feed shows
            int(row["commit_lsn"]), int(row["tx_order"]), tuple(row["relations"]), bool(row["cascade"]),
            bool(row["restart_identity"]))
        if target in planning.plan_truncates([ev], pending, []).position:
            out.append({changelog.OP: "truncate", changelog.COMMIT_LSN: row["commit_lsn"],
                        changelog.TX_ORDER: row["tx_order"], changelog.LSN: row["lsn"],
                        changelog.COMMIT_TIME: row["commit_time"], changelog.XID: row["xid"],
                        changelog.UNCHANGED: []})
    return out


def _with_truncates(rows: pa.Table, truncates: list[dict[str, object]]) -> pa.Table:
    if truncates:
        extra = {name: pa.array([t.get(name) for t in truncates], rows.schema.field(name).type)
                 if name in truncates[0] else pa.nulls(len(truncates), rows.schema.field(name).type)
                 for name in rows.column_names}
        rows = pa.concat_tables([rows, pa.table(extra, schema=rows.schema)])
    return rows.sort_by([(changelog.COMMIT_LSN, "ascending"), (changelog.TX_ORDER, "ascending")])


def _apply_batch(spark: SparkSession, config: ApplyConfig, target: DeltaTarget, batch: Batch,
                 rels: dict[str, RelationInfo]) -> runner.BatchReport:
    truncates = read_truncates(batch)
    sources = set(batch.table_files) | {r for ev in truncates for r in ev.relations}
    configured = {s: (planning.target_name(s, c), c) for s in sources if (c := config.table_config(s)) is not None}
    marks = target.watermarks(sorted({t for t, _ in configured.values()}))
    pending = {s: tc for s, tc in configured.items() if marks.get(tc[0], -1) < batch.end_lsn}
    report = runner.BatchReport(batch.start_lsn, batch.end_lsn, applied=False)
    if not pending:
        return report
    # The source's TRUNCATE … CASCADE lists every table it emptied (the WAL record carries them all), so
    # following the message is following the source's foreign keys; Delta tables have none of their own.
    truncs = planning.plan_truncates(truncates, pending, [])
    started = time.monotonic()
    outcomes: dict[str, TableOutcome] = {}
    for source, (name, cfg) in sorted(pending.items()):
        if source in batch.table_files:
            outcomes[name] = _apply_table(spark, target, batch, rels[source], cfg, name,
                                          truncs.position.get(name), pending)
        elif target.mode == "mirror" and name in truncs.position:
            outcomes[name] = target.truncate(name, batch.start_lsn, batch.end_lsn)
        elif target.mode == "changelog" and name in truncs.position:
            outcomes[name] = _append_truncates_only(target, batch, name, pending)
    # Tables emptied only by a cascade through an unconfigured name are not in ``pending``: nothing to do.
    report.seconds["apply"] = round(time.monotonic() - started, 3)
    report.applied = any(o.committed for o in outcomes.values())
    report.rows = {t: o.rows for t, o in outcomes.items() if o.committed}
    report.ordered = any(o.replayed for o in outcomes.values())
    return report


def _append_truncates_only(target: DeltaTarget, batch: Batch, name: str,
                           pending: dict[str, tuple[str, TableApplyConfig]]) -> TableOutcome:
    table = target.location.open(name)
    if table is None:
        return TableOutcome(committed=False)  # no feed yet: a truncate of nothing has no reader
    schema = table.to_pyarrow_dataset().schema
    rows = _with_truncates(schema.empty_table(), _truncate_rows(batch, name, pending))
    columns = [c for c in schema.names if c not in changelog.LEADING + changelog.TRAILING]
    return target.append_changes(name, batch.start_lsn, batch.end_lsn, rows, columns=columns, type_names={})


def _apply_table(spark: SparkSession, target: DeltaTarget, batch: Batch, rel: RelationInfo, cfg: TableApplyConfig,
                 name: str, truncated_at: tuple[int, int] | None,
                 pending: dict[str, tuple[str, TableApplyConfig]]) -> TableOutcome:
    source = rel.qualified_name
    if has_value_notes(batch, source):
        raise DeltaValueError(
            f"batch {batch.start_lsn:X}-{batch.end_lsn:X}: {source} has values with exactness notes (numeric NaN, or "
            "arrays that are multi-dimensional or do not start at 1), which no Delta type holds (docs/types.md)")
    columns = planning.written_columns(rel, cfg)
    key = planning.choose_key(rel, cfg, None, columns)
    shape = planning.TableShape(source, name, key, columns)
    type_names = {c.name: c.type_name for c in rel.columns}
    changes = read_staged_changes(spark, batch, source)
    if target.mode == "changelog":
        changelog.check_names(name, columns)
        rows = runner.published_changes(changes, rel, cfg, shape, notes=False).transform(
            changelog.to_changelog(columns)).toArrow()
        rows = _with_truncates(rows, _truncate_rows(batch, name, pending))
        return target.append_changes(name, batch.start_lsn, batch.end_lsn, rows, columns=columns,
                                     type_names=type_names)
    net = runner.net_changes(changes, rel, cfg, shape, truncated_at, notes=False).select(
        KIND, KEEP, LSN, FROM, TOUCHED, *columns).toArrow()

    def ordered() -> pa.Table:
        return runner.ordered_changes(changes, rel, cfg, shape, truncated_at, notes=False).select(
            KIND, F.col(SEQ).getField("c").alias(COMMIT), F.col(SEQ).getField("o").alias(ORDER), LSN, KEEP, FROM,
            *columns).toArrow()

    fetch: Callable[[], pa.Table] = ordered
    return target.apply_net(name, batch.start_lsn, batch.end_lsn, net, key=key, columns=columns,
                            type_names=type_names, truncated=truncated_at is not None,
                            unchanged_toast=cfg.unchanged_toast, ordered=fetch,
                            null_safe_key=rel.replica_identity == "f" and not cfg.key_columns)
