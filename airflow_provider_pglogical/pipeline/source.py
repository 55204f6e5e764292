"""The source side of a pipeline run, shared by the CLI and the DAG tasks: the slot client, ensure
publication and slot, the WAL-retention check, and table selection (``"*"`` / ``schema.*`` resolved
against what the publication publishes)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from airflow_provider_pglogical.exceptions import (
    PipelineBusyError,
    PublicationNotFoundError,
    SlotPluginMismatchError,
    SpecError,
    format_lsn,
)
from airflow_provider_pglogical.hooks.slot_client import PLUGIN, PgLogicalClient
from airflow_provider_pglogical.hooks.slots import check_wal_retention, slot_lag_bytes, slot_summary
from airflow_provider_pglogical.pipeline.spec import PipelineSpec, TableSpec, split_qualified
from airflow_provider_pglogical.row_filter import fold_hint, parse_row_filter


def source_client(spec: PipelineSpec) -> PgLogicalClient:
    """A slot client on the source: the spec's DSN (no Airflow import: the CLI's path), or its
    Airflow connection (through ``PgLogicalHook``, which resolves it when the client connects)."""
    if spec.source.dsn is not None:
        return PgLogicalClient.from_dsn(spec.source.dsn)
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    return PgLogicalHook(postgres_conn_id=spec.source.conn_id).client


def publication_marker(spec: PipelineSpec) -> str:
    """The comment a publication the pipeline creates carries: how ``drop`` tells it from one that pre-existed."""
    return f"created by airflow-provider-pglogical for slot {spec.source.slot}"


def check_column_lists(spec: PipelineSpec, client: PgLogicalClient) -> None:
    """Every column a spec table's column list or row filter names exists in the table on the source (a SpecError
    naming the first that does not), so a typo or a mixed-case name left unquoted in a filter fails before anything
    is staged or the slot advanced."""
    for target, view in spec.target_views().items():  # each target's own lists (``targets:`` has several)
        where = f"targets.{target}.tables" if spec.targets else "tables"
        for name, table in sorted(view.tables.items()):
            if (table.columns is None and table.row_filter is None) or name.endswith("*"):
                continue
            existing = client.table_columns(name)
            if existing is None:
                continue  # a missing table: the publication check names it
            missing = [c for c in table.columns or () if c not in existing]
            if missing:
                raise SpecError(f"{spec.origin}: {where}.{name}.columns: column {missing[0]!r} does not exist in "
                                f"{name} on the source")
            unknown = sorted(parse_row_filter(table.row_filter).columns - set(existing)) if table.row_filter else []
            if unknown:  # exact, as PostgreSQL's: an unquoted name is folded to lower case
                raise SpecError(f"{spec.origin}: {where}.{name}.row_filter: column(s) {', '.join(unknown)} do not "
                                f"exist in {name} on the source{fold_hint(unknown, existing)}")


def ensure_replication(spec: PipelineSpec, client: PgLogicalClient) -> dict[str, Any]:
    """Make sure the publication and the slot exist (creating them when ``source.create``).

    The publication is created before the slot: pgoutput looks publications up with the
    catalog as of each decoded change, so WAL older than the publication could not be decoded.
    """
    publication, slot = spec.source.publication, spec.source.slot
    created_publication = created_slot = False
    if spec.selectors:
        created_publication = spec.source.create and create_selected_publication(spec, client)
        spec = resolve_with(spec, client)
    if spec.source.create:
        client.check_wal_level()
        created_publication = (client.create_publication(publication, [split_qualified(t) for t in spec.tables],
                                                         comment=publication_marker(spec))
                               or created_publication)
    for name in spec.source.all_publications if not spec.source.create else ():
        if not client.publication_exists(name):
            raise PublicationNotFoundError(
                f"publication {name!r} does not exist; create it or set source.create: true in the spec")
    published = client.published_tables(spec.source.all_publications)
    # Without publish_via_partition_root a publication lists a partitioned table's leaves, not the table:
    # an entry routing its leaves is published when they are.
    missing = sorted(name for name in set(spec.tables) - published
                     if not (spec.tables[name].leaves == "route_to_root" and published & set(client.partition_leaves(name))))
    if missing:
        names = ", ".join(repr(p) for p in spec.source.all_publications)
        raise SpecError(
            f"publication {names} does not publish {', '.join(missing)}; add them with ALTER PUBLICATION "
            "... ADD TABLE or remove them from the spec's tables")
    if spec.source.create:
        created_slot = client.create_slot(slot)
    info = client.require_slot(slot)
    return {"publication": publication, "created_publication": created_publication, "slot": slot,
            "created_slot": created_slot, "confirmed_flush_lsn": format_lsn(info.confirmed_flush_lsn)}


@contextmanager
def exclusive_slot(spec: PipelineSpec, client: PgLogicalClient) -> Iterator[None]:
    """Hold the slot's drain lock (what every drain holds, ``staging/drain.py``) on ``client``'s session for the
    block, so no run starts meanwhile; ``PipelineBusyError`` when a run holds it or a consumer has the slot active."""
    slot = spec.source.slot
    if not client.try_lock_slot(slot):
        raise PipelineBusyError(f"slot {slot!r} is being drained by another session (its drain lock is held); "
                                "let the run finish, then drop")
    try:
        info = client.slot_info(slot)
        if info is not None and info.active:
            raise PipelineBusyError(f"replication slot {slot!r} is active for PID {info.active_pid}; stop that "
                                    "consumer, then drop")
        yield
    finally:
        client.unlock_slot(slot)


def drop_replication(spec: PipelineSpec, client: PgLogicalClient, *, dry_run: bool = False,
                     log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Drop the slot (releasing the WAL it pins) and every publication of the spec this pipeline created —
    those carrying ``publication_marker`` — keeping the others. Idempotent: what is gone is skipped.

    ``dry_run``: only report. The caller holds ``exclusive_slot`` when not.
    """
    slot = spec.source.slot
    info = client.slot_info(slot)
    if info is not None:
        database = client.current_database()
        if info.slot_type != "logical" or info.plugin != PLUGIN or info.database != database:
            # Another tool's slot of that name (or another database's): not this pipeline's to drop.
            raise SlotPluginMismatchError(
                f"replication slot {slot!r} is a {info.slot_type} slot of plugin {info.plugin!r} in database "
                f"{info.database!r}, not this pipeline's ({PLUGIN} in {database!r}); it was not dropped",
                hint="drop it with pg_drop_replication_slot if it is no longer used")
    drop: list[str] = []
    keep: dict[str, str] = {}
    for name in spec.source.all_publications:
        if not client.publication_exists(name):
            continue
        if client.publication_comment(name) == publication_marker(spec):
            drop.append(name)
        else:
            keep[name] = "not created by this pipeline"
    restart = None if info is None or info.restart_lsn is None else format_lsn(info.restart_lsn)
    retained = None if info is None else info.retained_bytes
    if not dry_run:
        if info is not None:
            client.drop_slot_if_exists(slot)
        for name in drop:
            client.drop_publication(name)
        if log is not None:
            log(f"dropped slot {slot}" if info is not None else f"slot {slot} does not exist")
            log(f"dropped publication(s) {', '.join(drop)}" if drop else "no publication of this pipeline to drop")
    # restart_lsn / retained_bytes: the WAL the slot pinned, released with it.
    return {"slot": {"name": slot, "exists": info is not None, "restart_lsn": restart, "retained_bytes": retained},
            "publications": {"drop": drop, "keep": keep}}


def check_retention(spec: PipelineSpec, client: PgLogicalClient) -> dict[str, Any]:
    """Fail (typed error) when the slot is lost, unreserved or under ``source.min_safe_wal_bytes``."""
    info = check_wal_retention(client.slot_info(spec.source.slot), slot=spec.source.slot,
                               min_safe_wal_bytes=spec.source.min_safe_wal_bytes)
    return {**slot_summary(info), "lag_bytes": slot_lag_bytes(info)}


# -- Table selection ------------------------------------------------------------------------------
# Table selection like a publication's: ``"*"`` and ``schema.*`` entries resolved against what the
# publication publishes when a run starts, so tables added to the publication are picked up by the
# next run (and, with ``snapshot.initial``, copied first by the snapshot feature's added-tables path).
#
# Named entries win over ``schema.*``, which wins over ``"*"`` — the order ``ApplyConfig.table_config``
# uses too. A selected table keeps its own name as its target.


def selector_for(spec: PipelineSpec, table: str) -> TableSpec | None:
    """The ``schema.*`` or ``"*"`` entry that selects ``table`` (None: not selected)."""
    return spec.selectors.get(f"{split_qualified(table)[0]}.*") or spec.selectors.get("*")


def resolve(spec: PipelineSpec, published: Collection[str], routed: Collection[str] = ()) -> PipelineSpec:
    """``spec`` with every ``published`` table its selectors pick added to ``tables`` (pure).

    A selected table whose name is already a named entry's target is an error naming both: two
    sources would write one target table. ``routed``: leaf partitions of entries with ``leaves:
    route_to_root``, which go to their root's target and are not selected on their own.
    """
    if not spec.selectors:
        return spec
    tables = dict(spec.tables)
    targets = {t.target_name: name for name, t in tables.items()}
    for name in sorted(published):
        selector = selector_for(spec, name)
        if name in tables or selector is None or name in routed:
            continue
        if name in targets:
            raise SpecError(f"{spec.origin}: tables.{selector.name} selects the published table {name}, which is "
                            f"also the target of tables.{targets[name]}; give {name} an entry of its own with "
                            "another target, or rename that entry's target")
        tables[name] = replace(selector, name=name)
        targets[name] = name
    return replace(spec, tables=tables)


def create_selected_publication(spec: PipelineSpec, client: PgLogicalClient) -> bool:
    """With ``source.create``: create the publication for the spec's selection unless it exists —
    ``FOR ALL TABLES`` for ``"*"``, else ``FOR TABLE <named>, TABLES IN SCHEMA <schemas>`` (PostgreSQL 15+)."""
    if "*" in spec.selectors:
        return client.create_publication(spec.source.publication, all_tables=True, comment=publication_marker(spec))
    schemas = sorted(name[:-2] for name in spec.selectors)
    return client.create_publication(spec.source.publication, [split_qualified(t) for t in spec.tables],
                                     schemas=schemas, comment=publication_marker(spec))


def resolve_with(spec: PipelineSpec, client: PgLogicalClient) -> PipelineSpec:
    """``resolve`` against the publication on ``client`` (created first with ``source.create``); a missing
    publication leaves the spec as it is (``ensure_replication`` reports it)."""
    if not spec.selectors:
        return spec
    if spec.source.create:
        create_selected_publication(spec, client)
    if not all(client.publication_exists(p) for p in spec.source.all_publications):
        return spec
    routed = {leaf for name, t in spec.tables.items() if t.leaves == "route_to_root"
              for leaf in client.partition_leaves(name)}
    return resolve(spec, client.published_tables(spec.source.all_publications), routed)


def resolved(spec: PipelineSpec) -> PipelineSpec:
    """``resolve_with`` on a connection of its own; no connection when the spec selects nothing."""
    if not spec.selectors:
        return spec
    client = source_client(spec)
    try:
        return resolve_with(spec, client)
    finally:
        client.close()
