"""Snapshots in the apply: each table's snapshot is loaded before any of its changes, exactly once.

Target-neutral: a snapshot group (the tables snapshotted at one LSN) is handed to the target as
``PlannedSnapshot`` plus the same ``BatchChanges`` frames as a batch (``changes.SnapshotChanges``) — every row
an INSERT (``KIND`` ``I``). A ``SnapshotTarget`` (``targets/base.py``) must, atomically: empty those tables, insert the rows, set each table's
watermark *to* the snapshot LSN (also backwards: a resync replaces a table whose changes were
applied further) and record it as the table's sync LSN; and skip tables whose recorded sync LSN is
already at or past it (idempotent under replay).

Changes then follow PostgreSQL's per-table rule (worker.c ``should_apply_changes_for_rel``): a
table's changes and truncates with ``commit_lsn`` below its sync LSN are in the snapshot and are
dropped; batches ending at or below it are skipped by the watermark. Tables with an open snapshot
request (pending, copying) are held: none of their changes are applied until the snapshot is.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_pglogical.apply import planning
from airflow_provider_pglogical.apply.batches import NOTES_COLUMNS
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.targets.base import (
    BatchReport,
    PlannedSnapshot,
    PlannedTable,
    SnapshotTarget,
    Target,
)
from airflow_provider_pglogical.exceptions import ApplyError, format_lsn
from airflow_provider_pglogical.snapshot.layout import SnapshotLayout, SnapshotManifest
from airflow_provider_pglogical.snapshot.links import linked_components
from airflow_provider_pglogical.staging.reader import RelationInfo, TruncateEvent

if TYPE_CHECKING:
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.changes import SnapshotFiles
    from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand

log = logging.getLogger(__name__)


def relation_info(manifest: SnapshotManifest) -> RelationInfo:
    return RelationInfo.from_row(manifest.relation)


def snapshot_has_notes(layout: SnapshotLayout, ref_path: str, files: Sequence[str]) -> bool:
    """Whether any row of the snapshot's chunk files carries an exactness note (read from the notes column only)."""
    import pyarrow.parquet as pq

    from airflow_provider_pglogical.staging.verify import naming_file

    for rel in files:
        with naming_file(f"staged snapshot {ref_path.rsplit('/', 2)[-2]}/{ref_path.rsplit('/', 1)[-1]}", rel):
            if file_has_notes(pq.ParquetFile(f"{ref_path}/{rel}", filesystem=layout.fs)):
                return True
    return False


def file_has_notes(parquet: pq.ParquetFile) -> bool:
    """Whether any row of one staged snapshot file carries an exactness note (its notes columns read only)."""
    present = [c for c in NOTES_COLUMNS if c in parquet.schema_arrow.names]
    return bool(present) and any(len(chunk.keys) for column in parquet.read(columns=present).columns
                                 for chunk in column.chunks)


def _uri(layout: SnapshotLayout, path: str) -> str:
    """A snapshot directory as a URI Spark reads (``s3://…`` stays ``s3://…``)."""
    return layout.staging.uri_for(path)


def open_requests(config: ApplyConfig) -> set[str]:
    """Source tables whose snapshot is requested but not published yet: their changes wait."""
    return {t for t in SnapshotLayout.from_uri(config.staging_root, config.slot).requests()
            if config.table_config(t) is not None}


def waiting(config: ApplyConfig, target: Target) -> set[str]:
    """Source tables whose changes (and snapshot) wait for a later run: those with an open snapshot request,
    and those whose unloaded snapshot a foreign key of the target links (either way, transitively) to one.

    Why the second kind: linked tables are published and loaded together at one LSN (``snapshot/run.py``);
    a referenced table cannot be emptied without its referencing tables, and loading a linked table's
    snapshot alone (one left over from a crashed copy) would pair it with rows of another LSN."""
    held = open_requests(config)
    if not held or not isinstance(target, SnapshotTarget):
        return held
    layout = SnapshotLayout.from_uri(config.staging_root, config.slot)
    marks = target.sync_marks(config.slot, candidate_targets(config))
    names = {s: planning.target_name(s, cfg) for s in (config.tables or layout.tables())
             if (cfg := config.table_config(s)) is not None}
    unloaded = {s: n for s, n in names.items() if s not in held
                and (ref := layout.latest(s)) is not None and marks.get(n, -1) < ref.lsn}
    if not unloaded:
        return held
    waiting_targets = {names[s] for s in held if s in names}
    tables = sorted(waiting_targets | set(unloaded.values()))
    linked = {t: group for group in linked_components(tables, target.foreign_keys()) for t in group}
    return held | {s for s, n in unloaded.items() if waiting_targets & set(linked[n])}


def linked_outside(config: ApplyConfig, target: Target, group: Collection[str]) -> list[str]:
    """Source tables outside ``group`` whose snapshot is still requested or unloaded and that a foreign key of the
    target links (transitively) to one of ``group``'s tables: ``group`` cannot load on its own (``overlap.py``).

    Why: the snapshot sets its sets by the *source's* foreign keys, while the apply loads, in one transaction,
    the tables the *target's* link (``atomic_groups``). A set loaded alone would leave a table the target links
    to it to be loaded later, alone, where TRUNCATE refuses a referenced table (or pairs rows of two LSNs)."""
    if not isinstance(target, SnapshotTarget):
        return []
    layout = SnapshotLayout.from_uri(config.staging_root, config.slot)
    requested = open_requests(config)
    names = {s: planning.target_name(s, cfg) for s in set(config.tables or layout.tables()) | requested | set(group)
             if (cfg := config.table_config(s)) is not None}
    marks = target.sync_marks(config.slot, set(names.values()))
    unloaded = {s for s in names if s not in group and (
        s in requested or ((ref := layout.latest(s)) is not None and marks.get(names[s], -1) < ref.lsn))}
    if not unloaded:
        return []
    mine = {names[s] for s in group if s in names}
    components = linked_components(sorted(mine | {names[s] for s in unloaded}), target.foreign_keys())
    reached = {t for component in components if mine & set(component) for t in component}
    return sorted(s for s in unloaded if names[s] in reached)


def unloaded(config: ApplyConfig, target: Target, tables: Sequence[str]) -> list[str]:
    """Those of ``tables`` whose latest published snapshot the target's sync marks do not reach (all of them for a
    target without snapshots): after a load that failed part way, the atomic groups that did not commit."""
    if not isinstance(target, SnapshotTarget):
        return list(tables)
    layout = SnapshotLayout.from_uri(config.staging_root, config.slot)
    marks = target.sync_marks(config.slot, candidate_targets(config) | {
        planning.target_name(s, cfg) for s in tables if (cfg := config.table_config(s)) is not None})
    return [s for s in tables if (cfg := config.table_config(s)) is None or (ref := layout.latest(s)) is None
            or marks.get(planning.target_name(s, cfg), -1) < ref.lsn]


def without(config: ApplyConfig, held: set[str], known: Iterable[str] = ()) -> ApplyConfig | None:
    """The config minus the held tables (their batches are left for a later run); None when every table is held.

    A config without tables means every staged table: it becomes ``known`` (the staged source
    tables) and the snapshotted ones with the default table config, minus the held ones. (None rather
    than an empty table map, which would mean every table again.)
    """
    if not held:
        return config
    if not config.tables:
        staged = set(known) | set(SnapshotLayout.from_uri(config.staging_root, config.slot).tables())
        tables = {t: TableApplyConfig() for t in sorted(staged - held)}
    else:
        tables = {k: v for k, v in config.tables.items() if k not in held}
    return dataclasses.replace(config, tables=tables) if tables else None


def candidate_targets(config: ApplyConfig) -> set[str]:
    """The target tables whose sync marks a run may need: the configured tables' (or every snapshotted one's)."""
    sources = config.tables or SnapshotLayout.from_uri(config.staging_root, config.slot).tables()
    return {planning.target_name(s, cfg) for s in sources if (cfg := config.table_config(s)) is not None}


def source_sync_lsns(config: ApplyConfig, marks: Mapping[str, int]) -> dict[str, int]:
    """Source table → its target's sync LSN."""
    out = {}
    sources = config.tables or SnapshotLayout.from_uri(config.staging_root, config.slot).tables()
    for source in sources:
        cfg = config.table_config(source)
        if cfg is not None and (lsn := marks.get(planning.target_name(source, cfg))) is not None:
            out[source] = lsn
    return out


def routed_sync_lsns(config: ApplyConfig, sync: Mapping[str, int]) -> dict[str, int]:
    """``sync`` plus each routed leaf partition (``config.routed``) with its root's sync LSN: the root's snapshot
    holds every leaf's rows, so a leaf's changes and truncates committed before it are in it already."""
    out = dict(sync)
    for source, cfg in config.tables.items():
        if cfg.partition_of is not None and source not in out and cfg.partition_of in sync:
            out[source] = sync[cfg.partition_of]
    return out


def drop_synced_truncates(events: Sequence[TruncateEvent], sync: Mapping[str, int]) -> list[TruncateEvent]:
    """Truncates of a table committed before its sync LSN are in its snapshot already."""
    out = []
    for ev in events:
        keep = tuple(r for r in ev.relations if ev.commit_lsn >= sync.get(r, -1))
        if keep:
            out.append(dataclasses.replace(ev, relations=keep))
    return out


def _newer_snapshots(config: ApplyConfig, target: SnapshotTarget, layout: SnapshotLayout,
                     held: Collection[str]) -> Iterator[tuple[str, TableApplyConfig, Any]]:
    """(source, config, latest snapshot ref) of each source table whose latest snapshot is newer than the sync mark
    of its target table, but the ``held`` ones (``waiting``): read from the layout and the target's marks only."""
    marks = target.sync_marks(config.slot, candidate_targets(config))
    for source in sorted(config.tables or layout.tables()):  # no tables configured: every staged one
        cfg = config.table_config(source)
        ref = layout.latest(source)
        if cfg is None or ref is None or source in held:
            continue
        if marks.get(planning.target_name(source, cfg), -1) >= ref.lsn:
            continue
        yield source, cfg, ref


def has_pending_snapshots(config: ApplyConfig, target: Target, held: Collection[str] = ()) -> bool:
    """Whether ``pending_snapshots`` would load anything, asked without its side effects (no file verified, no
    target table created): a check before deciding who applies."""
    if not isinstance(target, SnapshotTarget):
        return False
    layout = SnapshotLayout.from_uri(config.staging_root, config.slot)
    return next(_newer_snapshots(config, target, layout, held), None) is not None


def pending_snapshots(config: ApplyConfig, target: Target,
                      held: Collection[str] = ()) -> list[tuple[PlannedSnapshot, dict[str, Any]]]:
    """Published snapshots newer than what the target holds, grouped by LSN (oldest first), but those of the
    ``held`` source tables (``waiting``)."""
    if not isinstance(target, SnapshotTarget):
        return []
    layout = SnapshotLayout.from_uri(config.staging_root, config.slot)
    groups: dict[int, list[tuple[str, Any, SnapshotManifest, dict[str, SnapshotFiles]]]] = {}
    for source, cfg, ref in _newer_snapshots(config, target, layout, held):
        from airflow_provider_pglogical.apply.changes import SnapshotFiles  # imports pyspark: only with a snapshot

        manifest = layout.manifest(ref)
        layout.verify(ref, manifest)  # before the target sees any of it (a table created, a row read)
        uri = _uri(layout, ref.path)
        # A routed partitioned table's snapshot has one part per leaf: files keyed by the leaf.
        snaps = {p["table"]: SnapshotFiles(uri, tuple(p["files"]), p.get("row_filter"),
                                           snapshot_has_notes(layout, ref.path, p["files"]), layout.fs, ref.path)
                 for p in manifest.parts} or \
            {source: SnapshotFiles(uri, tuple(manifest.files), manifest.row_filter,
                                   snapshot_has_notes(layout, ref.path, manifest.files), layout.fs, ref.path)}
        groups.setdefault(ref.lsn, []).append((source, cfg, manifest, snaps))
    out = []
    fks = target.foreign_keys()
    for lsn in sorted(groups):
        planned: dict[str, PlannedTable] = {}
        uris: dict[str, Any] = {}
        for source, cfg, manifest, snaps in groups[lsn]:
            table = planned_table(target, source, cfg, relation_info(manifest), manifest.parts)
            planned[table.target] = table
            uris.update(snaps)
        order = planning.parents_first(sorted(planned), fks)
        out.append((PlannedSnapshot(config.slot, lsn, tuple(planned[t] for t in order)), uris))
    return out


def planned_table(target: Target, source: str, cfg: TableApplyConfig, rel: RelationInfo,
                  parts: Sequence[Mapping[str, Any]] = ()) -> PlannedTable:
    """The planned table of ``source``'s snapshot (``rel``: its relation as staged), its target table created
    when missing and its columns checked against the target's."""
    name = planning.target_name(source, cfg)
    columns = planning.written_columns(rel, cfg)
    existing = target.describe(name)
    if existing is None:
        target.create_table(name, planning.column_types(rel, columns, name), planning.created_key(rel, cfg, columns))
        existing = target.describe(name)
    if existing is None:
        raise ApplyError(f"target table {name} does not exist after CREATE TABLE")
    shape = planning.TableShape(source, name, planning.choose_key(rel, cfg, existing, columns), columns)
    planning.check_target_columns(shape, existing)
    return routed_table(source, name, shape, rel, cfg, parts, existing)


def routed_table(source: str, target: str, shape: planning.TableShape, rel: RelationInfo, cfg: TableApplyConfig,
                 parts: Sequence[Mapping[str, Any]], existing: Any) -> PlannedTable:
    """The planned table of one snapshot: ``source`` itself, or for a routed partitioned table (``parts``) the
    root's columns filled from one part per leaf, each with its own relation and the entry's config as the
    change batches route it (``ApplyConfig.routed``). The leaves' keys must agree, as for their changes."""
    if not parts:
        return PlannedTable(source, target, shape.key, shape.columns, rel, cfg, None)
    leaf_cfg = dataclasses.replace(cfg, target=target, leaves="own", partition_of=source)
    members = []
    for part in parts:
        leaf = RelationInfo.from_row(part["relation"])
        columns = planning.written_columns(leaf, leaf_cfg)
        members.append(PlannedTable(str(part["table"]), target, planning.choose_key(leaf, leaf_cfg, existing, columns),
                                    columns, leaf, leaf_cfg, None))
    merged = planning.merge_sources(target, members) if len(members) > 1 else members[0]
    return PlannedTable(source, target, merged.key, shape.columns, rel, cfg, None,
                        parts=tuple(dataclasses.replace(m, key=merged.key) for m in members))


def apply_snapshots(spark: SparkSession | SparkOnDemand, config: ApplyConfig, target: Target,
                    held: Collection[str] = ()) -> list[BatchReport]:
    """Load every pending snapshot group (before any change batch) but the ``held`` tables'; one report per group."""
    reports: list[BatchReport] = []
    if not isinstance(target, SnapshotTarget):  # pending_snapshots() has none for it either
        return reports
    for plan, uris in pending_snapshots(config, target, held):
        from airflow_provider_pglogical.apply.changes import SnapshotChanges

        result = target.apply_snapshot(plan, SnapshotChanges(spark, uris))
        report = BatchReport(plan.lsn, plan.lsn, applied=result.applied, rows=result.rows, seconds=result.seconds)
        log.info("snapshot at %s of %s applied=%s rows=%s", format_lsn(plan.lsn),
                 ", ".join(t.target for t in plan.tables), result.applied, result.rows)
        reports.append(report)
    return reports


def sync_lsns(config: ApplyConfig, target: Target) -> dict[str, int]:
    """Source table → sync LSN of the snapshot its target holds ({} for targets without snapshots)."""
    if not isinstance(target, SnapshotTarget):
        return {}
    return source_sync_lsns(config, target.sync_marks(config.slot, candidate_targets(config)))
