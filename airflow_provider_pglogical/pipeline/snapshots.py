"""Snapshot steps of a pipeline run (initial snapshot with the slot, added tables, resyncs, sync state)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_provider_pglogical.exceptions import SnapshotOnExistingSlotError, SpecError, format_lsn
from airflow_provider_pglogical.hooks.airflow_connection import hook_params
from airflow_provider_pglogical.hooks.dsn import params_dsn
from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient
from airflow_provider_pglogical.pipeline.source import publication_marker, resolve_with, resolved
from airflow_provider_pglogical.pipeline.spec import PipelineSpec, split_qualified
from airflow_provider_pglogical.pipeline.target import spec_target
from airflow_provider_pglogical.snapshot.layout import SnapshotLayout
from airflow_provider_pglogical.snapshot.run import (
    Published,
    SnapshotJob,
    SnapshotSettings,
    initial_snapshot,
    request_added_tables,
    request_resync,
    sync_pending,
)

if TYPE_CHECKING:
    from airflow_provider_pglogical.apply.config import ApplyConfig
    from airflow_provider_pglogical.apply.targets.postgres.overlap import OverlappedLoad

Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def source_dsn(spec: PipelineSpec) -> str:
    """The source as a libpq DSN (snapshot readers and the replication connection open their own)."""
    if spec.source.dsn is not None:
        return spec.source.dsn
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    # The one DSN builder and extras allowlist (hooks/dsn.py), with the hook's database override and IAM token.
    return params_dsn(hook_params(PgLogicalHook(postgres_conn_id=spec.source.conn_id)))


def snapshot_job(spec: PipelineSpec) -> Any:
    settings = SnapshotSettings(initial=spec.snapshot.initial, parallelism=spec.snapshot.parallelism,
                                chunk_bytes=spec.snapshot.chunk_size)
    tables = {name: (t.columns, t.row_filter) for name, t in spec.tables.items()}
    return SnapshotJob(dsn=source_dsn(spec), slot=spec.source.slot, publication=spec.source.publication,
                       staging_uri=spec.staging.uri, tables=tables, settings=settings,
                       publications=spec.source.publications,
                       routing=tuple(name for name, t in spec.tables.items() if t.leaves == "route_to_root"))


def initial_snapshot_if_new(spec: PipelineSpec, client: PgLogicalClient, *, log: Log = _quiet,
                            on_checkpoint: Callable[[str], None] | None = None,
                            on_published: Published | None = None) -> dict[str, Any] | None:
    """With ``snapshot.initial``: when the slot does not exist yet, create the publication (with
    ``source.create``), then the slot with an exported snapshot, and stage every table at its
    consistent point. A slot that exists without any snapshot state is an error (no exported
    snapshot consistent with it can be taken any more)."""
    if not spec.snapshot.initial:
        return None
    slot = spec.source.slot
    if client.slot_info(slot) is not None:
        if not SnapshotLayout.from_uri(spec.staging.uri, slot).tables():
            raise SnapshotOnExistingSlotError(
                f"snapshot.initial is set but slot {slot!r} already exists without a snapshot: the snapshot "
                "consistent with it is gone. Set snapshot.initial: false and resync tables one by one "
                "(pglogical resync --spec FILE --table schema.table)")
        return None
    if spec.selectors:  # create the publication for the selection, then snapshot what it publishes
        spec = resolve_with(spec, client)
    if spec.source.create:
        client.check_wal_level()
        client.create_publication(spec.source.publication, [split_qualified(t) for t in spec.tables],
                                  comment=publication_marker(spec))
    else:
        missing = [p for p in spec.source.all_publications if not client.publication_exists(p)]
        if missing:
            raise SpecError(f"publication {missing[0]!r} does not exist; create it or set source.create")
    log(f"creating slot {slot} with an exported snapshot and copying {len(spec.tables)} table(s)")
    result = initial_snapshot(snapshot_job(spec), on_checkpoint=on_checkpoint, on_published=on_published)
    log(f"initial snapshot at {result.to_summary()['lsn']}: "
        + ", ".join(f"{t} {s['rows']} rows" for t, s in sorted(result.tables.items())))
    return result.to_summary()


def sync_tables(spec: PipelineSpec, *, resync: list[str] | None = None, log: Log = _quiet,
                on_checkpoint: Callable[[str], None] | None = None,
                on_published: Published | None = None) -> dict[str, Any]:
    """Snapshot tables waiting for one: ``resync`` ones, tables added to a snapshotting pipeline,
    and tables a crashed snapshot left unfinished — each at a later sync LSN (temporary slot)."""
    if resync:
        # The snapshot is staged once; every target whose selection holds the table loads it (``targets:``).
        for view in spec.target_views().values():
            view = resolved(view)
            spec_target(view).check_resync([t for t in resync if t in view.tables])
    spec = resolved(spec)  # tables newly selected in the publication are "added" tables
    job = snapshot_job(spec)
    if resync:
        request_resync(job, resync)
    added = request_added_tables(job) if spec.snapshot.initial else []
    if added:
        log(f"tables added to the spec: {', '.join(added)}; snapshotting them")
    result = sync_pending(job, on_checkpoint=on_checkpoint, on_published=on_published)
    if result.tables:
        log(f"snapshots at {result.to_summary()['lsn']}: "
            + ", ".join(f"{t} {s['rows']} rows" for t, s in sorted(result.tables.items())))
    return {**result.to_summary(), "added": added}


def sync_states(spec: PipelineSpec, applied: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """Per spec table: pending / copying (progress) / staged at LSN / synced at LSN (applied on the
    target) / none (the table only carries changes)."""
    states = SnapshotLayout.from_uri(spec.staging.uri, spec.source.slot).sync_states(sorted(spec.tables))
    for table, state in states.items():
        done = (applied or {}).get(spec.tables[table].target_name)
        if done is not None:
            state["applied_snapshot_lsn"] = format_lsn(done)
            if state["state"] == "staged" and state.get("latest_snapshot_lsn") == format_lsn(done):
                state["state"] = "synced"
    return states


def unapplied_snapshots(spec: PipelineSpec, marks: dict[str, int] | None = None) -> list[str]:
    """Source tables whose latest staged snapshot the target has not loaded yet."""
    layout = SnapshotLayout.from_uri(spec.staging.uri, spec.source.slot)
    if marks is None:
        with spec_target(spec) as target:
            marks = target.sync_marks()
    out = []
    for name, table in sorted(spec.tables.items()):
        ref = layout.latest(name)
        if ref is not None and marks.get(table.target_name, -1) < ref.lsn:
            out.append(name)
    return out


@contextmanager
def overlapped_load(spec: PipelineSpec, config: Callable[[], ApplyConfig], *, local_master: bool,
                    log: Log = _quiet) -> Iterator[OverlappedLoad | None]:
    """For a process that takes the spec's snapshots and then applies them (``pglogical run``): the target's loader
    of each set of tables the snapshot publishes while it reads the others (``SpecTarget.overlapped_snapshot_load``),
    or None; after the block, every load it began has ended (committed, or left whole to the apply)."""
    loader = None if len(spec.targets) > 1 else spec_target(spec).overlapped_snapshot_load(
        config, local_master=local_master, log=log)
    try:
        yield loader
    finally:
        if loader is not None:
            loader.close()
