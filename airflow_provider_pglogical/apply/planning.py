"""Driver-side planning without I/O: validate table configs, choose keys and columns, place truncates, order tables by FKs."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from airflow_provider_pglogical.apply import schema_changes
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.meta import META
from airflow_provider_pglogical.apply.targets.base import (
    PlannedBatch,
    PlannedLeafTruncate,
    PlannedTable,
    PlannedTruncate,
    TargetTable,
)
from airflow_provider_pglogical.exceptions import (
    ApplyError,
    InternalColumnNameError,
    ReplicaIdentityError,
    RowFilterError,
    format_lsn,
)
from airflow_provider_pglogical.row_filter import referenced_names
from airflow_provider_pglogical.staging.reader import RelationColumn, RelationInfo, TruncateEvent


@dataclass(frozen=True)
class TableShape:
    """What is written for one source table: key and columns, validated against the relation."""

    source: str
    target: str
    key: tuple[str, ...]  # empty: keyless, insert-only (appended)
    columns: tuple[str, ...]
    update_delete_problem: str | None = None  # why an arriving UPDATE/DELETE must stop the batch


def target_name(source: str, cfg: TableApplyConfig) -> str:
    name = cfg.target or source
    return name if "." in name else f"public.{name}"


def check_internal_names(table: str, columns: Iterable[str], row_filter: str | None = None) -> None:
    """``InternalColumnNameError`` when a replicated column's name starts with ``META`` (``_pgl_``, in any case): the
    apply's transforms (Spark's and this process's) and the targets' merges put their own working columns
    (``_pgl_kind``, ``_pgl_keep``, ``_pgl_from_0``, ``_pgl_k_<column>``…) beside the table's columns in one flat
    frame, where such a column would be taken for one of them (Delta matches names regardless of case). The columns
    ``row_filter`` references count too, listed or not: its evaluation puts them beside the working columns."""
    named = dict.fromkeys([*columns, *sorted(referenced_names(row_filter) if row_filter else ())])
    clashing = tuple(c for c in named if c.lower().startswith(META))
    if clashing:
        names = ", ".join(f'"{c}"' for c in clashing)
        raise InternalColumnNameError(
            f"{table}: column(s) {names} start with {META}, the prefix of the apply's own working columns; leave them "
            "out with the table's `columns:` (the publication's column list) and out of its `row_filter`, or rename "
            "them on the source", table=table, columns=clashing)


def written_columns(rel: RelationInfo, cfg: TableApplyConfig) -> tuple[str, ...]:
    """The column list (validated), in relation order; all columns without one. A column named like the apply's
    own is refused (``check_internal_names``)."""
    if cfg.columns is None:
        check_internal_names(rel.qualified_name, rel.column_names, cfg.row_filter)
        return rel.column_names
    unknown = sorted(set(cfg.columns) - set(rel.column_names))
    if unknown:
        raise ApplyError(f"column list of {rel.qualified_name} names unknown column(s) {', '.join(unknown)}")
    if {"update", "delete"} & set(cfg.actions):
        # PostgreSQL refuses UPDATE/DELETE when a column list does not cover the replica identity.
        missing = sorted(set(rel.identity_columns) - set(cfg.columns))
        if missing:
            raise ApplyError(f"column list of {rel.qualified_name} does not cover replica identity column(s) "
                             f"{', '.join(missing)} while UPDATE/DELETE are applied")
    written = tuple(c for c in rel.column_names if c in cfg.columns)
    check_internal_names(rel.qualified_name, written, cfg.row_filter)
    return written


def batch_columns(versions: Sequence[RelationInfo], cfg: TableApplyConfig) -> tuple[str, ...]:
    """The columns a batch writes: those of every staged schema version (through the column list), in the
    order they first appear. A column the source dropped (or added and dropped) inside the batch is
    written by the changes of the versions that have it (``batches.read_changes``: ``_pgl_absent``)."""
    listed = None if cfg.columns is None else set(cfg.columns)
    names = (c for rel in versions for c in rel.column_names)
    written = tuple(dict.fromkeys(c for c in names if listed is None or c in listed))
    if versions:
        check_internal_names(versions[-1].qualified_name, written, cfg.row_filter)
    return written


def batch_types(versions: Sequence[RelationInfo]) -> dict[str, str | None]:
    """Each column's staged type in the last of ``versions`` that has it."""
    return {c.name: c.type_name for rel in versions for c in rel.columns}


def has_replica_identity(rel: RelationInfo) -> bool:
    """Whether old images identify rows: REPLICA IDENTITY FULL, or identity columns (PK / USING INDEX)."""
    return rel.replica_identity == "f" or bool(rel.identity_columns)


def choose_key(rel: RelationInfo, cfg: TableApplyConfig, target: TargetTable | None,
               columns: Sequence[str]) -> tuple[str, ...]:
    """Key to compact and match rows: configured, else the target PK for RI FULL, else the replica identity.

    A table without a replica identity gets the empty key (insert-only, appended) unless
    ``key_columns`` names a unique key of the target: INSERTs then upsert on it. Its UPDATEs and
    DELETEs cannot be matched (old images carry nothing) and fail when they arrive
    (``update_delete_problem``), as PostgreSQL fails them on the publisher.
    """
    if cfg.key_columns:
        key = cfg.key_columns
    elif rel.replica_identity == "f":
        key = target.primary_key if target is not None and target.primary_key else tuple(columns)
    else:
        key = rel.identity_columns
    outside = sorted(set(key) - set(columns))
    if outside:
        raise ApplyError(f"key column(s) {', '.join(outside)} of {rel.qualified_name} are not replicated")
    if has_replica_identity(rel) and rel.replica_identity != "f" and set(key) - set(rel.identity_columns):
        raise ApplyError(f"key of {rel.qualified_name} must be within its replica identity (old images carry only it)")
    return tuple(key)


def created_key(rel: RelationInfo, cfg: TableApplyConfig, columns: Sequence[str]) -> tuple[str, ...]:
    """Primary key of a target table the apply creates: ``key_columns``, else the source's primary key for a
    REPLICA IDENTITY FULL table (staged with its relation; none when the source has none, when the column list
    leaves part of it out, or when older staging did not record it), else the replica identity (``choose_key``).

    Not the REPLICA IDENTITY FULL matching key of every column: a unique index over every column fails on the
    first value too large for a btree entry, and the source never promised their combination to be unique. A
    target without a primary key matches such a table's rows by every column (``choose_key``)."""
    if cfg.key_columns or rel.replica_identity != "f":
        return choose_key(rel, cfg, None, columns)
    key = rel.primary_key or ()
    return tuple(key) if set(key) <= set(columns) else ()


def update_delete_problem(rel: RelationInfo, cfg: TableApplyConfig, filter_columns: Iterable[str]) -> str | None:
    """Why an UPDATE/DELETE of this table cannot be applied, if it cannot; None when it can.

    Checked when such a change actually arrives in a batch (PostgreSQL refuses it on the publisher
    at that moment, not when the publication is created): a table without a replica identity is
    insert-only, and a row filter over columns outside the replica identity cannot judge the old
    row of an UPDATE/DELETE unless the table is REPLICA IDENTITY FULL.
    """
    if not ({"update", "delete"} & set(cfg.actions)):
        return None
    if not has_replica_identity(rel):
        return "has no replica identity (no primary key, or REPLICA IDENTITY NOTHING), so it is applied insert-only"
    if rel.replica_identity != "f":
        outside = sorted(set(filter_columns) - set(rel.identity_columns))  # exact: "Val" does not cover val
        if outside:
            return (f"has a row filter on column(s) {', '.join(outside)} outside the replica identity, which cannot "
                    "judge the old row (use REPLICA IDENTITY FULL or USING INDEX on the source)")
    return None


def update_delete_error(rel: RelationInfo, source: str, problem: str, count: int, lsn: int | None, start_lsn: int,
                        end_lsn: int) -> ApplyError:
    """The batch's typed error for ``count`` UPDATE/DELETE changes of ``source`` (the first at ``lsn``) that the
    table cannot apply (``problem``: ``update_delete_problem``'s text), whichever path found them (Spark's
    ``changes.check_updates_deletes``, this process's ``direct.keyless_files``): ``RowFilterError`` for the
    filter rule, ``ReplicaIdentityError`` otherwise."""
    text = (f"{count} UPDATE/DELETE change(s) of {source} from LSN {format_lsn(lsn)} cannot be applied: the table "
            f"{problem}; batch {format_lsn(start_lsn)}-{format_lsn(end_lsn)} not applied (PostgreSQL refuses such "
            "changes on the publisher)")
    if has_replica_identity(rel):
        return RowFilterError(text)
    return ReplicaIdentityError(text, table=source, lsn=lsn)


def check_target_columns(shape: TableShape, target: TargetTable) -> None:
    missing = sorted(set(shape.columns) - set(target.columns))
    if missing:
        # The native subscriber's error too ("is missing replicated column(s)").
        raise ApplyError(f"target table {shape.target} is missing replicated column(s) {', '.join(missing)}")


def descendants(tables: Iterable[str], fks: Sequence[tuple[str, str]]) -> set[str]:
    """Tables that reference ``tables`` through FKs, transitively (what TRUNCATE CASCADE empties)."""
    found, frontier = set(tables), list(tables)
    while frontier:
        parent = frontier.pop()
        for child, p in fks:
            if p == parent and child not in found:
                found.add(child)
                frontier.append(child)
    return found


@dataclass(frozen=True)
class TruncatePlan:
    position: dict[str, tuple[int, int]]  # target -> last truncate (commit_lsn, tx_order)
    restart_identity: frozenset[str]
    events: tuple[tuple[str, TruncateEvent], ...] = ()  # (target, truncate emptying it), in LSN order
    # Routed leaf partitions (config ``partition_of``): a TRUNCATE of one empties only its rows in the
    # shared target. (source, target, truncate) in LSN order, and source -> its last truncate position.
    leaf_events: tuple[tuple[str, str, TruncateEvent], ...] = ()
    leaf_position: dict[str, tuple[int, int]] | None = None
    # Targets a CASCADE reached whose snapshot is newer than the truncate: kept, with the truncate and the sync LSN.
    kept: tuple[tuple[str, TruncateEvent, int], ...] = ()


def plan_truncates(events: Sequence[TruncateEvent], targets: dict[str, tuple[str, TableApplyConfig]],
                   fks: Sequence[tuple[str, str]], synced: Mapping[str, int] | None = None) -> TruncatePlan:
    """Which targets a batch's TRUNCATEs empty, and the last position at which each was emptied.

    ``targets`` maps configured source names to (target, config); unconfigured relations are
    ignored like a subscriber ignores tables outside its subscription, and so are tables whose
    publication does not publish truncate. With CASCADE and policy
    ``follow_source`` the target tables referencing a truncated one (transitively) go too.
    ``synced`` maps a target table to the sync LSN of the snapshot it holds: a truncate committed
    before it is in that snapshot already and does not empty the table, whether it names the table
    or reaches it through a foreign key (``snapshots.drop_synced_truncates`` drops the named ones).
    """
    position: dict[str, tuple[int, int]] = {}
    restart: set[str] = set()
    emptying: list[tuple[str, TruncateEvent]] = []
    leaf_events: list[tuple[str, str, TruncateEvent]] = []
    leaf_position: dict[str, tuple[int, int]] = {}
    kept: list[tuple[str, TruncateEvent, int]] = []
    for ev in sorted(events, key=lambda e: (e.commit_lsn, e.tx_order)):
        named = [r for r in ev.relations if r in targets and "truncate" in targets[r][1].actions]
        listed = [targets[r] for r in named]
        # A routed leaf's TRUNCATE empties only its rows of the shared target (a positioned delete).
        for r in named:
            if targets[r][1].partition_of is not None:
                leaf_events.append((r, targets[r][0], ev))
                leaf_position[r] = (ev.commit_lsn, ev.tx_order)
        emptied = {t for t, c in listed if c.partition_of is None}
        if ev.cascade:
            starts = {t for t, c in listed if c.truncate_cascade == "follow_source"}
            # Tables referencing a truncated one go entirely (as on the source); a leaf's own target does not.
            emptied = (descendants(starts, fks) - (starts - emptied)) | emptied
        newer = {t: lsn for t in emptied if (lsn := (synced or {}).get(t, -1)) > ev.commit_lsn}
        kept.extend((t, ev, lsn) for t, lsn in sorted(newer.items()))
        emptied -= set(newer)
        for t in sorted(emptied):
            emptying.append((t, ev))
            pos = (ev.commit_lsn, ev.tx_order)
            position[t] = max(position.get(t, pos), pos)
            if ev.restart_identity:
                restart.add(t)
    return TruncatePlan(position, frozenset(restart), tuple(emptying), tuple(leaf_events), leaf_position, tuple(kept))


def parents_first(tables: Sequence[str], fks: Sequence[tuple[str, str]]) -> list[str]:
    """Topological order (referenced tables before referencing ones); cycles keep input order."""
    pending, ordered = list(tables), list[str]()
    deps = {t: {p for c, p in fks if c == t and p in tables and p != t} for t in tables}
    while pending:
        ready = [t for t in pending if not (deps[t] - set(ordered))] or pending[:1]
        for t in ready:
            ordered.append(t)
            pending.remove(t)
    return ordered


def is_pending(mark: int | None, end_lsn: int) -> bool:
    """Whether a batch ending at ``end_lsn`` is still to be applied to a table at watermark ``mark``."""
    return (mark if mark is not None else -1) < end_lsn


def batch_sources(tables: Iterable[str], truncates: Iterable[TruncateEvent]) -> set[str]:
    """Source tables a batch touches: those with row changes and those its truncates name."""
    return set(tables) | {r for ev in truncates for r in ev.relations}


def configured_targets(sources: Iterable[str], config: ApplyConfig) -> set[str]:
    """Target tables of the configured ones among ``sources`` (whose watermarks a batch's planning reads)."""
    return {target_name(s, c) for s in sources if (c := config.table_config(s)) is not None}


def pending_tables(sources: Iterable[str], config: ApplyConfig, marks: Mapping[str, int],
                   end_lsn: int) -> dict[str, tuple[str, TableApplyConfig]]:
    """Configured source tables among ``sources`` (changed or truncated in a batch) whose target has
    not applied the batch: source → (target, config). The one definition of "pending"."""
    configured = {s: (target_name(s, c), c) for s in sources if (c := config.table_config(s)) is not None}
    return {s: tc for s, tc in configured.items() if is_pending(marks.get(tc[0]), end_lsn)}


def column_types(rel: RelationInfo, columns: Sequence[str], target: str,
                 versions: Sequence[RelationInfo] = ()) -> list[tuple[str, str]]:
    """(name, staged PostgreSQL type) of ``columns``, to create the target table from: ``rel``'s type, or for
    a column ``rel`` lacks, that of the last of the batch's earlier schema ``versions`` that has it."""
    types = batch_types([*versions, rel])
    out = []
    for c in columns:
        type_name = types[c]
        if type_name is None:
            raise ApplyError(f"cannot create {target}: the staged relation lacks type names")
        out.append((c, type_name))
    return out


def source_versions(versions: Sequence[tuple[int, RelationInfo]]) -> list[schema_changes.SourceVersion]:
    """A table's staged schema versions (first LSN, relation; LSN order) as schema-change planning sees them."""
    return [schema_changes.SourceVersion(lsn, {c.name: c.type_name for c in rel.columns},
                                         {c.name: c.missing for c in rel.columns if c.missing is not None})
            for lsn, rel in versions]


def previous_shapes(state: Any) -> dict[str, RelationInfo]:
    """Each table's shape before a batch, from the decoder's relation state the previous batch left
    (``StagingReader.relation_state``), so a type change between two batches is judged like one inside a
    batch. The state has type OIDs, not names: only builtin types planning judges get a name
    (``schema_changes.builtin_type_name``), the others None (unknown, not judged)."""
    before: dict[str, RelationInfo] = {}
    for rel in (state or {}).get("relations", []) if isinstance(state, Mapping) else []:
        cols = tuple(RelationColumn(str(name), schema_changes.builtin_type_name(int(oid), int(typmod)), bool(key))
                     for name, oid, typmod, key in rel["columns"])
        info = RelationInfo(str(rel["namespace"]), str(rel["name"]), str(rel["replica_identity"]), cols)
        before[info.qualified_name] = info
    return before


def plan_batch(slot: str, start_lsn: int, end_lsn: int, changed: Collection[str],
               pending: Mapping[str, tuple[str, TableApplyConfig]], relations: Mapping[str, RelationInfo],
               truncates: Sequence[TruncateEvent], marks: Mapping[str, int], fks: Sequence[tuple[str, str]],
               existing: Mapping[str, TargetTable | None],
               versions: Mapping[str, Sequence[tuple[int, RelationInfo]]] | None = None,
               filter_columns: Mapping[str, Collection[str]] | None = None,
               previous: Mapping[str, RelationInfo] | None = None,
               synced: Mapping[str, int] | None = None) -> PlannedBatch:
    """The batch's plan, without I/O: keys and columns of every pending table with row changes
    (``changed``), the source schema changes its target follows, the last truncate position of each,
    the tables emptied (those that exist) and the order parents → children. ``existing`` describes the
    target tables (None: missing); ``versions`` gives each source's staged schema versions as
    (first LSN, relation) in LSN order (default: ``relations`` alone, at ``start_lsn``); the columns of
    all of them are written (``batch_columns``). ``filter_columns`` the columns each source's row filter
    references; ``previous`` each source's shape before the batch (``previous_shapes``), judged first;
    ``synced`` each target table's snapshot sync LSN (``plan_truncates``)."""
    truncs = plan_truncates(truncates, dict(pending), fks, synced)
    truncated_at = {t: p for t, p in truncs.position.items() if is_pending(marks.get(t), end_lsn)}
    members: dict[str, list[PlannedTable]] = {}
    for source, (target, cfg) in sorted(pending.items()):
        if source not in changed:
            continue
        rel = relations[source]
        table = existing.get(target)
        if table is None:
            raise ApplyError(f"target table {target} does not exist")
        staged = list((versions or {}).get(source) or [(start_lsn, rel)])
        # The key (a full-identity table's columns, without a target key) is the latest version's: every
        # change of the batch is matched by it.
        latest_columns = written_columns(rel, cfg)
        columns = batch_columns([r for _, r in staged], cfg)
        problem = update_delete_problem(rel, cfg, (filter_columns or {}).get(source, ()))
        shape = TableShape(source, target, choose_key(rel, cfg, table, latest_columns), columns, problem)
        before = (previous or {}).get(source)
        judged = ([(start_lsn, before)] if before is not None else []) + staged
        changes = tuple(schema_changes.plan_column_changes(target, table.columns, table.required,
                                                           source_versions(judged), columns,
                                                           policy=cfg.schema_changes))
        check_target_columns(shape, table.after(changes))
        voided = max((p for p in (truncated_at.get(target), (truncs.leaf_position or {}).get(source)) if p),
                     default=None)
        members.setdefault(target, []).append(PlannedTable(source, target, shape.key, columns, rel, cfg, voided,
                                                           changes, problem,
                                                           versions=tuple(r for _, r in staged)))
    by_target = {target: merge_sources(target, parts) for target, parts in members.items()}
    order = parents_first(sorted(by_target), fks)
    truncate = parents_first(sorted(t for t in truncated_at if existing.get(t) is not None), fks)
    check_kept_references(start_lsn, end_lsn, truncs, truncate, fks, pending, existing)
    return PlannedBatch(
        slot=slot, start_lsn=start_lsn, end_lsn=end_lsn, tables=tuple(by_target[t] for t in order),
        truncate=tuple(truncate), restart_identity=tuple(t for t in truncate if t in truncs.restart_identity),
        watermark_tables=tuple(sorted({t for t, _ in pending.values()} | set(truncate))),
        truncates=tuple(PlannedTruncate(t, ev.commit_lsn, ev.tx_order, ev.lsn, ev.xid, ev.commit_time)
                        for t, ev in truncs.events if t in truncate and t in truncated_at),
        leaf_truncates=leaf_truncates(truncs, relations, marks, end_lsn, existing))


def check_kept_references(start_lsn: int, end_lsn: int, truncs: TruncatePlan, truncate: Collection[str],
                          fks: Sequence[tuple[str, str]], pending: Mapping[str, tuple[str, TableApplyConfig]],
                          existing: Mapping[str, TargetTable | None]) -> None:
    """Refuse a batch that would empty a table a kept one references: a table a CASCADE reached but whose
    snapshot is newer than the truncate keeps its rows (``plan_truncates``), and a target table cannot be
    emptied while another keeps rows referencing it (PostgreSQL refuses such a TRUNCATE, a native subscriber
    too). Resyncing the two together puts both snapshots after the truncate: it then empties neither."""
    source = {target: s for s, (target, _) in pending.items()}
    for child, ev, sync_lsn in truncs.kept:
        if child in truncate or existing.get(child) is None:
            continue  # emptied by a later truncate of the batch, or no such target table
        parent = min((p for c, p in fks if c == child and p in truncate and p != child), default=None)
        if parent is not None:
            raise ApplyError(
                f"batch {format_lsn(start_lsn)}-{format_lsn(end_lsn)} not applied: the TRUNCATE CASCADE at LSN "
                f"{format_lsn(ev.lsn or ev.commit_lsn)} empties {parent}, but {child} references it and its snapshot "
                f"(sync LSN {format_lsn(sync_lsn)}) is newer than the truncate: resync both "
                f"(pglogical resync --table {source.get(parent, parent)} --table {source.get(child, child)})")


def leaf_truncates(truncs: TruncatePlan, relations: Mapping[str, RelationInfo], marks: Mapping[str, int],
                   end_lsn: int, existing: Mapping[str, TargetTable | None]) -> tuple[PlannedLeafTruncate, ...]:
    """The routed leaves' TRUNCATEs of a batch as deletes by partition constraint, for pending, existing
    targets; a leaf whose constraint was not staged (a batch staged before it was) cannot be emptied exactly."""
    out = []
    for source, target, ev in truncs.leaf_events:
        if not is_pending(marks.get(target), end_lsn) or existing.get(target) is None:
            continue
        rel = relations.get(source)
        if rel is None or rel.partition_constraint is None:
            raise ApplyError(f"TRUNCATE of leaf partition {source} at LSN {format_lsn(ev.lsn or ev.commit_lsn)} cannot "
                             f"empty only its rows of {target}: its partition constraint was not staged (a batch "
                             "staged by an older version); resync the table")
        out.append(PlannedLeafTruncate(target, source, rel.partition_constraint, ev.commit_lsn, ev.tx_order, ev.lsn))
    return tuple(out)


def merge_sources(target: str, parts: Sequence[PlannedTable]) -> PlannedTable:
    """One planned table of several sources writing ``target``: allowed for leaf partitions routed to one
    ancestor's target (and that ancestor itself, when a publication sends it via the root). The key must
    be the same for all (it includes the partition key, so rows of different leaves never share one);
    columns are matched by name, in the first source's order, plus any a later one adds; the column
    changes of all of them, each column once."""
    if len(parts) == 1:
        return parts[0]
    roots = {p.config.partition_of or p.source for p in parts}
    if len(roots) > 1:
        raise ApplyError(f"source tables {', '.join(p.source for p in parts)} all write target table {target}; "
                         "only leaf partitions routed to their root's target (leaves: route_to_root) may share one")
    first = parts[0]
    for p in parts[1:]:
        if set(p.key) != set(first.key):
            raise ApplyError(f"leaf partitions {first.source} and {p.source} routed to {target} have different keys "
                             f"({', '.join(first.key) or 'none'} / {', '.join(p.key) or 'none'})")
    # A leaf attached with another column order lists the same key in its own order: use the first's.
    parts = [replace(p, key=first.key) for p in parts]
    columns = list(first.columns)
    columns += [c for p in parts[1:] for c in p.columns if c not in columns]
    seen: set[tuple[str, str]] = set()
    changes = []
    for p in parts:
        for ch in p.column_changes:
            if (ch.kind, ch.column) not in seen:
                seen.add((ch.kind, ch.column))
                changes.append(ch)
    problem = next((p.update_delete_problem for p in parts if p.update_delete_problem), None)
    return replace(first, columns=tuple(dict.fromkeys(columns)), column_changes=tuple(changes),
                   update_delete_problem=problem, parts=tuple(parts))
