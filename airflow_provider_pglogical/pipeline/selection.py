"""Table selection like a publication's: ``"*"`` and ``schema.*`` entries resolved against what the
publication publishes when a run starts, so tables added to the publication are picked up by the
next run (and, with ``snapshot.initial``, copied first by the snapshot feature's added-tables path).

Named entries win over ``schema.*``, which wins over ``"*"`` — the order ``ApplyConfig.table_config``
uses too. A selected table keeps its own name as its target.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient
from airflow_provider_pglogical.pipeline.spec import PipelineSpec, TableSpec, split_qualified


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
        return client.create_publication(spec.source.publication, all_tables=True)
    schemas = sorted(name[:-2] for name in spec.selectors)
    return client.create_publication(spec.source.publication, [split_qualified(t) for t in spec.tables],
                                     schemas=schemas)


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
    from airflow_provider_pglogical.pipeline.source import source_client

    client = source_client(spec)
    try:
        return resolve_with(spec, client)
    finally:
        client.close()
