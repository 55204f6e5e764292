"""Decode and apply runs of a pipeline spec: the library code behind both the CLI and the DAG tasks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_pglogical.apply.targets.postgres.progress import PROGRESS_TABLE
from airflow_provider_pglogical.exceptions import SpecError, StagingError, format_lsn
from airflow_provider_pglogical.pipeline.spec import PipelineSpec, TableSpec
from airflow_provider_pglogical.pipeline.steps import (
    check_retention,
    ensure_replication,
    source_hook,
    target_dsn,
    target_progress_table,
    target_watermark_ints,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.config import ApplyConfig
    from airflow_provider_pglogical.staging.drain import DrainConfig

Log = Callable[[str], None]
DEFAULT_MASTER = "local[*]"


def _quiet(_message: str) -> None:
    pass


def apply_config(spec: PipelineSpec, *, max_batches: int | None = None) -> ApplyConfig:
    """The spec's tables as the apply package's config (only listed tables are applied)."""
    from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig

    def table(t: TableSpec) -> TableApplyConfig:
        return TableApplyConfig(row_filter=t.row_filter, columns=t.columns,
                                target=None if t.name.endswith("*") else t.target_name,
                                conflict=t.conflict, unchanged_toast=t.unchanged_toast,
                                truncate_cascade=spec.truncate.cascade, key_columns=t.key_columns,
                                actions=t.actions, schema_changes=t.schema_changes, leaves=t.leaves)

    # Selections ("*", "schema.*") go along as wildcard entries (ApplyConfig.table_config): a table the
    # publication started publishing after the spec was last resolved is applied all the same.
    return ApplyConfig(slot=spec.source.slot, staging_root=spec.staging.uri,
                       tables={name: table(t) for name, t in {**spec.selectors, **spec.tables}.items()},
                       max_batches=max_batches,
                       progress_table=PROGRESS_TABLE, bookkeeping_schema=spec.target.bookkeeping_schema)


@contextmanager
def local_spark(master: str | None = None, conf: dict[str, str] | None = None) -> Iterator[SparkSession]:
    """A Spark session for in-process apply (the CLI); the DAG uses spark-submit instead."""
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.sparkenv import LOCAL_DRIVER_CONF, is_local, use_package_python

    master = master or DEFAULT_MASTER
    builder = (SparkSession.builder.master(master).appName("pglogical-apply")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4"))
    if is_local(master):
        # Python workers must import pyarrow and this package: the interpreter it is installed in.
        use_package_python()
        for key, value in LOCAL_DRIVER_CONF.items():
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    try:
        yield session
    finally:
        session.stop()


def apply_pending(spec: PipelineSpec, *, master: str | None = None, max_batches: int | None = None,
                  log: Log = _quiet) -> dict[str, Any]:
    """Apply every staged batch beyond the target's watermarks, oldest first (idempotent)."""
    from airflow_provider_pglogical.apply.runner import apply_slot
    from airflow_provider_pglogical.pipeline.selection import resolved

    spec = resolved(spec)  # the selected tables' targets carry watermarks and snapshots too
    config = apply_config(spec, max_batches=max_batches)
    pending = pending_batches(spec, max_batches=max_batches)
    from airflow_provider_pglogical.pipeline.snapshots import unapplied_snapshots

    if not pending and not unapplied_snapshots(spec):
        # Starting Spark costs seconds: skip it when every staged batch is below every watermark.
        log(f"nothing to apply: no staged batch of slot {spec.source.slot} is past the target's watermarks")
        return {"batches_seen": 0, "batches_applied": 0, "batches_replayed_in_order": 0, "last_applied_end_lsn": None,
                "rows": {}}
    log(f"applying {len(pending)} staged batch(es) of slot {spec.source.slot} from {spec.staging.uri}")
    # One apply path: the shared runner plans every batch and hands it to the spec's target.
    with target_environment(spec), local_spark(master or spec.spark.master, spec.spark.conf) as spark:
        if spec.target.kind == "delta":
            from airflow_provider_pglogical.apply.targets.delta import settings

            reports = apply_slot(spark, config, target=settings.target_for_spec(spec))
        else:
            reports = apply_slot(spark, config, target_dsn(spec))
    rows: dict[str, dict[str, int]] = {}
    for report in reports:
        for table, counts in report.rows.items():
            total = rows.setdefault(table, {})
            for kind, n in counts.items():
                total[kind] = total.get(kind, 0) + n
    applied = [r for r in reports if r.applied]
    # A replayed batch's counters count changes, not net rows (docs/apply.md, ordered replay).
    replayed = sum(r.ordered for r in applied)
    log(f"applied {len(applied)} of {len(reports)} staged batches ({replayed} replayed change by change)")
    return {"batches_seen": len(reports), "batches_applied": len(applied), "batches_replayed_in_order": replayed,
            "last_applied_end_lsn": format_lsn(applied[-1].end_lsn) if applied else None, "rows": rows}


@contextmanager
def target_environment(spec: PipelineSpec) -> Iterator[None]:
    """The process environment the spec's target reads its credentials from (an object store's ``AWS_*``
    from ``target.conn_id``, set for the block only); nothing for PostgreSQL, whose DSN is passed."""
    if spec.target.kind != "delta":
        yield
        return
    from airflow_provider_pglogical.apply.targets.delta import settings

    with settings.environment(settings.spec_env(spec)):
        yield


def pending_batches(spec: PipelineSpec, *, max_batches: int | None = None) -> list[tuple[int, int]]:
    """(start, end) LSNs of staged batches some target table has not applied yet, in LSN order.

    Judged exactly as the apply judges them (``planning.pending_tables``), from the manifests and
    truncate files only, so a run with nothing to do starts no Spark.
    """
    from airflow_provider_pglogical.apply import planning
    from airflow_provider_pglogical.staging.reader import StagingReader

    reader = StagingReader.from_uri(spec.staging.uri, spec.source.slot)
    batches = reader.batches()
    if max_batches is not None:
        batches = batches[:max_batches]
    config = apply_config(spec)
    marks = target_watermark_ints(spec)
    pending = []
    for batch in batches:
        manifest = reader.manifest(batch)
        sources = planning.batch_sources(manifest.tables, reader.truncates(batch, manifest))
        if planning.pending_tables(sources, config, marks, batch.end_lsn):
            pending.append((batch.start_lsn, batch.end_lsn))
    return pending


def decode_pending(spec: PipelineSpec, *, max_batches: int | None = None, log: Log = _quiet,
                   resync: list[str] | None = None) -> dict[str, Any]:
    """Ensure publication and slot, check WAL retention, then drain the slot batch by batch.

    Idempotent per slot position: each cycle stages ``(confirmed_flush_lsn, end]`` and advances
    the slot only after the batch's manifest exists, so a crash in between re-stages the same
    range, which the drain replaces rather than duplicates.
    """
    from airflow_provider_pglogical.pipeline.snapshots import initial_snapshot_if_new, sync_tables

    with source_hook(spec) as hook:
        # snapshot.initial: a new slot is created with an exported snapshot (before ensure_replication)
        initial = initial_snapshot_if_new(spec, hook, log=log)
        ensured = ensure_replication(spec, hook)
        log(f"slot {spec.source.slot} at {ensured['confirmed_flush_lsn']} (publication {', '.join(spec.source.all_publications)})")
        retention = check_retention(spec, hook)
        log(f"slot lag {retention['lag_bytes']} bytes, wal_status {retention['wal_status']}")
    synced = sync_tables(spec, resync=resync, log=log)
    batches = drain(spec, max_batches=max_batches, log=log)
    return {"ensure": ensured, "retention": retention, "snapshot": {"initial": initial, "tables": synced},
            "batches": batches, "changes": sum(b.get("changes", 0) for b in batches)}


def drain_config(spec: PipelineSpec) -> DrainConfig:
    """The spec's source and staging as the drain library's per-cycle config."""
    from airflow_provider_pglogical.staging.drain import DEFAULT_MAX_CHANGES, DEFAULT_MAX_WAL_BYTES, DrainConfig

    publication = spec.source.publications or spec.source.publication  # several: pgoutput's union semantics
    return DrainConfig(slot=spec.source.slot, publication=publication, staging_uri=spec.staging.uri,
                       max_wal_bytes=spec.source.max_batch_bytes or DEFAULT_MAX_WAL_BYTES,
                       max_changes=spec.source.max_changes or DEFAULT_MAX_CHANGES)


def drain(spec: PipelineSpec, *, max_batches: int | None = None, log: Log = _quiet) -> list[dict[str, Any]]:
    """Run drain cycles until the slot has caught up with the WAL flushed when we started
    (or ``max_batches`` cycles); one summary per staged batch.

    Stopping at the starting flush position keeps a run bounded on a busy source: later WAL is
    the next run's work.
    """
    from airflow_provider_pglogical.staging.drain import DrainResult, drain_run

    config = drain_config(spec)

    def report(result: DrainResult) -> None:
        summary = result.to_summary()
        log(f"staged {summary['start_lsn']}..{summary['end_lsn']}: {summary['transactions']} transactions, "
            f"{summary['changes']} changes, {summary['truncates']} truncates"
            + (" (already staged, slot advanced)" if result.replayed else ""))

    with source_hook(spec) as hook:
        stop_at = hook.current_wal_flush_lsn()
        # One lock and, when a batch is cut by max_changes, the same peek read on for the next batch.
        results = drain_run(hook, config, max_batches=max_batches, stop_at=stop_at, on_result=report)
    return [r.to_summary() for r in results]


def batches_upto(spec: PipelineSpec, *, upto_lsn: int | None = None, upto_time: datetime | None = None) -> int:
    """How many staged batches (from the first) end at or before ``upto_lsn`` / commit by ``upto_time``.

    Replay works on whole batches: a batch is included only when its last transaction qualifies.
    """
    import pyarrow.compute as pc

    from airflow_provider_pglogical.staging.reader import StagingReader

    reader = StagingReader.from_uri(spec.staging.uri, spec.source.slot)
    count = 0
    for ref in reader.batches():
        if upto_lsn is not None and ref.end_lsn > upto_lsn:
            break
        if upto_time is not None:
            commits = reader.read_file(ref, "transactions.parquet").column("commit_time")
            last = pc.max(commits).as_py() if len(commits) else None
            if last is not None and last > upto_time:
                break
        count += 1
    return count


def reset_target(spec: PipelineSpec, *, log: Log = _quiet) -> dict[str, Any]:
    """Empty the spec's target tables and forget the slot's watermarks, in one transaction.

    Used by replay before re-applying the staged log from its first batch; crashing before the
    commit leaves the target untouched, after it a replay simply starts from an empty target.
    """
    if spec.target.kind == "delta":
        # A Delta table's watermark lives in its log with its data: replay into a new uri (or delete the
        # table directories) rather than rewriting history under readers.
        raise SpecError(f"{spec.origin}: reset of a delta target is not supported; point target.uri at a new "
                        "location to rebuild it (docs/delta.md)")
    import psycopg2

    from airflow_provider_pglogical.apply.targets.postgres.progress import reset
    from airflow_provider_pglogical.pipeline.selection import resolved

    spec = resolved(spec)
    targets = sorted({t.target_name for t in spec.tables.values()})
    progress = target_progress_table(spec)
    conn = psycopg2.connect(target_dsn(spec))
    try:
        existing = reset(conn, spec.source.slot, targets, progress)
    finally:
        conn.close()
    log(f"emptied {len(existing)} target table(s) and reset the watermarks of slot {spec.source.slot}")
    return {"truncated": existing}


def first_batch_start(spec: PipelineSpec) -> str | None:
    """Start LSN of the oldest staged batch (replay needs the log from the slot's creation)."""
    from airflow_provider_pglogical.staging.reader import StagingReader

    batches = StagingReader.from_uri(spec.staging.uri, spec.source.slot).batches()
    if not batches:
        raise StagingError(f"no staged batches for slot {spec.source.slot!r} under {spec.staging.uri}")
    return format_lsn(batches[0].start_lsn)


__all__ = ["apply_config", "apply_pending", "batches_upto", "decode_pending", "drain", "local_spark", "reset_target"]
