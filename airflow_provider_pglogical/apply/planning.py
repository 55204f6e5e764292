"""Driver-side planning without I/O: validate table configs, choose keys and columns, place truncates, order tables by FKs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from airflow_provider_pglogical.apply.batches import RelationInfo, TruncateEvent
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.targets.postgres import TargetTable
from airflow_provider_pglogical.exceptions import ApplyError


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


def written_columns(rel: RelationInfo, cfg: TableApplyConfig) -> tuple[str, ...]:
    """The column list (validated), in relation order; all columns without one."""
    if cfg.columns is None:
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
    return tuple(c for c in rel.column_names if c in cfg.columns)


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
        outside = sorted({c.lower() for c in filter_columns} - {c.lower() for c in rel.identity_columns})
        if outside:
            return (f"has a row filter on column(s) {', '.join(outside)} outside the replica identity, which cannot "
                    "judge the old row (use REPLICA IDENTITY FULL or USING INDEX on the source)")
    return None


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


def plan_truncates(events: Sequence[TruncateEvent], targets: dict[str, tuple[str, TableApplyConfig]],
                   fks: Sequence[tuple[str, str]]) -> TruncatePlan:
    """Which targets a batch's TRUNCATEs empty, and the last position at which each was emptied.

    ``targets`` maps configured source names to (target, config); unconfigured relations are
    ignored like a subscriber ignores tables outside its subscription, and so are tables whose
    publication does not publish truncate. With CASCADE and policy
    ``follow_source`` the target tables referencing a truncated one (transitively) go too.
    """
    position: dict[str, tuple[int, int]] = {}
    restart: set[str] = set()
    for ev in events:
        listed = [targets[r] for r in ev.relations if r in targets and "truncate" in targets[r][1].actions]
        emptied = {t for t, _ in listed}
        if ev.cascade:
            emptied = descendants({t for t, c in listed if c.truncate_cascade == "follow_source"}, fks) | emptied
        for t in emptied:
            pos = (ev.commit_lsn, ev.tx_order)
            position[t] = max(position.get(t, pos), pos)
            if ev.restart_identity:
                restart.add(t)
    return TruncatePlan(position, frozenset(restart))


def parents_first(tables: Sequence[str], fks: Sequence[tuple[str, str]]) -> list[str]:
    """Topological order (referenced tables before referencing ones); cycles keep input order."""
    pending, ordered = list(tables), []
    deps = {t: {p for c, p in fks if c == t and p in tables and p != t} for t in tables}
    while pending:
        ready = [t for t in pending if not (deps[t] - set(ordered))] or pending[:1]
        for t in ready:
            ordered.append(t)
            pending.remove(t)
    return ordered
