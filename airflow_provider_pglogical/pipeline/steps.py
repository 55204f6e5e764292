"""The steps of a pipeline run (ensure replication, WAL check, status), shared by the CLI and the DAG tasks."""

from __future__ import annotations

from typing import Any

from airflow_provider_pglogical.apply.targets.postgres.progress import PROGRESS_TABLE
from airflow_provider_pglogical.exceptions import (
    PublicationNotFoundError,
    SlotError,
    SpecError,
    WatermarksMissingError,
    format_lsn,
)
from airflow_provider_pglogical.hooks.dsn import libpq_dsn
from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient
from airflow_provider_pglogical.hooks.slots import check_wal_retention, slot_lag_bytes, slot_summary
from airflow_provider_pglogical.lsn import parse_lsn
from airflow_provider_pglogical.pipeline.spec import PipelineSpec, split_qualified


def source_client(spec: PipelineSpec) -> PgLogicalClient:
    """A slot client on the source: the spec's DSN (no Airflow import: the CLI's path), or its
    Airflow connection (through ``PgLogicalHook``, which resolves it when the client connects)."""
    if spec.source.dsn is not None:
        return PgLogicalClient.from_dsn(spec.source.dsn)
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    return PgLogicalHook(postgres_conn_id=spec.source.conn_id).client


def target_dsn(spec: PipelineSpec) -> str:
    """The target as a libpq DSN (resolving an Airflow connection when the spec names one)."""
    if spec.target.dsn is not None:
        return spec.target.dsn
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    # The same builder and extras allowlist as the hook and the apply operator (hooks/dsn.py).
    return libpq_dsn(PostgresHook.get_connection(spec.target.conn_id))


def target_progress_table(spec: PipelineSpec) -> str:
    """The progress table's qualified name in the pipeline's bookkeeping schema (``WatermarksMissingError``
    when batches were applied but their watermarks are gone: see ``bookkeeping_schema.locate``)."""
    from airflow_provider_pglogical.apply.targets.postgres.bookkeeping_schema import locate_for_dsn, qualified

    schema = locate_for_dsn(target_dsn(spec), spec.target.bookkeeping_schema,
                            [t.target_name for t in spec.tables.values()], slot=spec.source.slot,
                            staging_uri=spec.staging.uri, progress_table=PROGRESS_TABLE)
    return qualified(schema, PROGRESS_TABLE)


def check_column_lists(spec: PipelineSpec, client: PgLogicalClient) -> None:
    """Every column a spec table's column list names exists in the table on the source (a SpecError
    naming the first that does not), so a typo fails before anything is staged or the slot advanced."""
    for name, table in sorted(spec.tables.items()):
        if table.columns is None or name.endswith("*"):
            continue
        existing = client.table_columns(name)
        if existing is None:
            continue  # a missing table: the publication check names it
        missing = [c for c in table.columns if c not in existing]
        if missing:
            raise SpecError(f"{spec.origin}: tables.{name}.columns: column {missing[0]!r} does not exist in {name} "
                            "on the source")


def ensure_replication(spec: PipelineSpec, client: PgLogicalClient) -> dict[str, Any]:
    """Make sure the publication and the slot exist (creating them when ``source.create``).

    The publication is created before the slot: pgoutput looks publications up with the
    catalog as of each decoded change, so WAL older than the publication could not be decoded.
    """
    from airflow_provider_pglogical.pipeline.selection import create_selected_publication, resolve_with

    publication, slot = spec.source.publication, spec.source.slot
    created_publication = created_slot = False
    if spec.selectors:
        created_publication = spec.source.create and create_selected_publication(spec, client)
        spec = resolve_with(spec, client)
    if spec.source.create:
        client.check_wal_level()
        created_publication = (client.create_publication(publication, [split_qualified(t) for t in spec.tables])
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


def check_retention(spec: PipelineSpec, client: PgLogicalClient) -> dict[str, Any]:
    """Fail (typed error) when the slot is lost, unreserved or under ``source.min_safe_wal_bytes``."""
    info = check_wal_retention(client.slot_info(spec.source.slot), slot=spec.source.slot,
                               min_safe_wal_bytes=spec.source.min_safe_wal_bytes)
    return {**slot_summary(info), "lag_bytes": slot_lag_bytes(info)}


def staged_batches(spec: PipelineSpec) -> list[dict[str, Any]]:
    """Every visible batch of the spec's slot, in LSN order, with its counts."""
    from airflow_provider_pglogical.staging.reader import StagingReader

    reader = StagingReader.from_uri(spec.staging.uri, spec.source.slot)
    out = []
    for ref in reader.batches():
        manifest = reader.manifest(ref)
        out.append({"batch": ref.name, "start_lsn": manifest.start_lsn, "end_lsn": manifest.end_lsn,
                    "transactions": manifest.transactions, "changes": manifest.changes,
                    "truncates": manifest.truncates, "bytes": manifest.bytes,
                    "tables": {name: t["rows"] for name, t in sorted(manifest.tables.items())}})
    return out


def target_watermark_ints(spec: PipelineSpec, progress_table: str | None = None) -> dict[str, int]:
    """Target table → the end LSN apply has committed for it ({} before the first apply)."""
    if spec.target.kind == "delta":  # app transactions in each table's Delta log
        from airflow_provider_pglogical.apply.targets.delta import settings

        with settings.environment(settings.spec_env(spec)):
            return settings.target_for_spec(spec).watermarks(spec.source.slot,
                                                             {t.target_name for t in spec.tables.values()})
    import psycopg2

    from airflow_provider_pglogical.apply.targets.postgres.progress import read_watermarks

    progress_table = progress_table or target_progress_table(spec)
    conn = psycopg2.connect(target_dsn(spec))
    try:
        return read_watermarks(conn, spec.source.slot, progress_table)
    finally:
        conn.close()


def target_watermarks(spec: PipelineSpec) -> dict[str, str]:
    """Target table → committed end LSN in ``X/X`` form."""
    return {table: format_lsn(lsn) for table, lsn in sorted(target_watermark_ints(spec).items())}


def status(spec: PipelineSpec) -> dict[str, Any]:
    """Slot position and lag, staged batches and target watermarks, as one JSON-friendly dict.

    ``problems``: why the next run would fail (a missing or unusable slot, a gap between the staged log
    and the slot, watermarks gone), each as its error's one line; empty when the pipeline can run.
    """
    with source_client(spec) as client:
        info = client.slot_info(spec.source.slot)
        current = client.current_wal_flush_lsn()
    slot = None
    if info is not None:
        slot = {**slot_summary(info), "lag_bytes": slot_lag_bytes(info)}
        if spec.source.max_lag_bytes is not None:
            slot["lag_ok"] = slot["lag_bytes"] <= spec.source.max_lag_bytes
        try:
            check_wal_retention(info, slot=spec.source.slot, min_safe_wal_bytes=spec.source.min_safe_wal_bytes)
            slot["wal_retention"] = "ok"
        except SlotError as exc:  # status reports the problem; decode is what fails on it
            slot["wal_retention"] = str(exc)
    batches = staged_batches(spec)
    problems = []
    if info is None and (batches or not spec.source.create):
        problems.append(f"slot {spec.source.slot!r} does not exist" + (" but batches of it are staged" if batches
                                                                      else " and source.create is false"))
    elif slot is not None and slot["wal_retention"] != "ok":
        problems.append(slot["wal_retention"])
    if info is not None and info.confirmed_flush_lsn is not None and batches:
        from airflow_provider_pglogical.pipeline.runs import drain_config
        from airflow_provider_pglogical.staging.drain import gap_uncovered

        end, at = parse_lsn(batches[-1]["end_lsn"]), info.confirmed_flush_lsn
        if at < end or (at > end and gap_uncovered(drain_config(spec), at)):
            problems.append(f"slot {spec.source.slot!r} is at {format_lsn(at)} but the staged log ends at "
                            f"{format_lsn(end)}: the slot was "
                            "moved outside the drain (or recreated); `pglogical run` names the ways out")
    try:
        watermarks: dict[str, str] | None = target_watermarks(spec)
    except WatermarksMissingError as exc:
        watermarks = None
        problems.append(str(exc))
    return {
        "spec": spec.origin,
        "source": {"publication": ", ".join(spec.source.all_publications), "current_wal_flush_lsn": format_lsn(current), "slot": slot},
        "staging": {"uri": spec.staging.uri, "batches": batches,
                    "staged_changes": sum(b["changes"] for b in batches),
                    "last_end_lsn": batches[-1]["end_lsn"] if batches else None},
        "target": {"kind": spec.target.kind, "watermarks": watermarks},
        "sync": _sync_states(spec),
        "problems": problems,
    }



def _sync_states(spec: PipelineSpec) -> dict[str, Any]:
    """Per table: pending / copying (with progress) / staged / synced at LSN / none."""
    from airflow_provider_pglogical.pipeline.snapshots import sync_states, target_sync_marks

    return sync_states(spec, target_sync_marks(spec))
