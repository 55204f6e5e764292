"""Operator that runs one drain cycle of a pgoutput slot into the Parquet staging area."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias, BaseOperator

from airflow_provider_pglogical.assets.pglogical import staged_table_asset
from airflow_provider_pglogical.history.recorder import Stopwatch, recording, slot_figures
from airflow_provider_pglogical.hooks.storage_connection import staging_connection
from airflow_provider_pglogical.metrics.batches import decode_metrics, emit_decode_batch
from airflow_provider_pglogical.staging.drain import (
    DEFAULT_MAX_CHANGES,
    DEFAULT_MAX_WAL_BYTES,
    DRAIN_MODES,
    DrainConfig,
    DrainResult,
    drain_read,
    drain_slot,
)
from airflow_provider_pglogical.staging.writer import DEFAULT_ROW_GROUP_ROWS

if TYPE_CHECKING:
    from airflow.sdk import Context


def table_asset(slot: str, qualified_name: str) -> Asset:
    """The Asset of one source table's staged changes: ``pglogical://<slot>/<schema>.<table>``.

    Schema and table are URL-quoted with '.' escaped too, so every name maps to one URI
    (``assets/pglogical.py`` defines the scheme).
    """
    return staged_table_asset(slot, qualified_name)


def _optional_int(value: Any) -> int | None:
    # Templated limits arrive as strings; "" / "none" switch a limit off.
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    return int(value)


class PgLogicalDecodeOperator(BaseOperator):
    """Stage the changes of a pgoutput slot as one LSN-keyed Parquet batch, then advance the slot.

    Exactly-once by default (peek → publish manifest → advance; a rerun after any crash stages
    nothing twice). Returns a small summary (LSNs as text and int, changes per table, bytes,
    duration) as XCom. For each staged table, an asset event is attached to any outlet Asset made
    with :func:`table_asset`, and added through every outlet ``AssetAlias``.

    :param slot: replication slot name (templated)
    :param publication: publication name or names (templated)
    :param staging_uri: staging root, a local path or pyarrow filesystem URI (templated)
    :param postgres_conn_id: Airflow connection of the source database
    :param max_wal_bytes: WAL read per batch at most; bounds server memory (templated)
    :param max_changes: soft change budget: the batch ends at the next commit (templated)
    :param mode: ``peek`` (exactly-once) or ``get`` (consumes while reading: at-most-once)
    :param read: ``sql`` (the peek function) or ``stream`` (a logical replication connection; ``DrainConfig.read``)
    :param empty_advance_bytes: publish an empty batch when this much WAL holds no changes (templated)
    :param row_group_rows: rows per Parquet row group
    :param staging_conn_id: Airflow connection whose credentials reach an object-store staging root (AWS for
        ``s3://``, Google Cloud for ``gs://``, ``wasb``/``adls`` for ``abfs://``/``az://``)
        (default: the worker's environment)
    """

    template_fields: Sequence[str] = ("slot", "publication", "staging_uri", "max_wal_bytes", "max_changes",
                                      "empty_advance_bytes")
    ui_color = "#336791"

    def __init__(self, *, slot: str, publication: str | Sequence[str], staging_uri: str,
                 postgres_conn_id: str = "postgres_default", max_wal_bytes: int | str | None = DEFAULT_MAX_WAL_BYTES,
                 max_changes: int | str | None = DEFAULT_MAX_CHANGES, mode: str = "peek", read: str = "sql",
                 empty_advance_bytes: int | str | None = 64 << 20,
                 row_group_rows: int = DEFAULT_ROW_GROUP_ROWS, staging_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slot = slot
        self.publication = publication
        self.staging_uri = staging_uri
        self.postgres_conn_id = postgres_conn_id
        self.max_wal_bytes = max_wal_bytes
        self.max_changes = max_changes
        self.mode = mode
        self.read = read
        self.empty_advance_bytes = empty_advance_bytes
        self.row_group_rows = row_group_rows
        self.staging_conn_id = staging_conn_id

    def build_config(self) -> DrainConfig:
        mode = next((m for m in DRAIN_MODES if m == self.mode), None)
        if mode is None:
            raise ValueError(f"mode must be 'peek' or 'get', not {self.mode!r}")
        read = drain_read(self.read)
        publication = self.publication if isinstance(self.publication, str) else tuple(self.publication)
        return DrainConfig(slot=self.slot, publication=publication, staging_uri=self.staging_uri,
                           max_wal_bytes=_optional_int(self.max_wal_bytes),
                           max_changes=_optional_int(self.max_changes), mode=mode, read=read,
                           empty_advance_bytes=_optional_int(self.empty_advance_bytes),
                           row_group_rows=self.row_group_rows)

    def get_hook(self) -> Any:
        from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

        return PgLogicalHook(postgres_conn_id=self.postgres_conn_id)

    def execute(self, context: Context) -> dict[str, Any]:
        config = self.build_config()
        hook = self.get_hook()
        # One record in the slot's run history (docs/staging-format.md#run-history), failed runs included.
        with (staging_connection(config.staging_uri, self.staging_conn_id),
              recording(config.staging_uri, config.slot, "decode", tool="airflow", log=self.log.warning) as record):
            try:
                watch = Stopwatch()
                result = drain_slot(hook, config, logger=self.log)
                record.decoded([result.to_summary()], watch.seconds)
                lag = hook.slot_info(config.slot)
                record.saw_slot(slot_figures(lag))
                published = hook.published_tables(config.publications)
            finally:
                hook.close()
            summary = result.to_summary()
            # One line with the batch's numbers, the same ones sent to Stats. Inside the block: the newest batch's
            # age is read from the staging root, which only the connection's credentials reach.
            emit_decode_batch(decode_metrics(summary, staging_uri=config.staging_uri,
                                             lag_bytes=None if lag is None else max(lag.pending_bytes or 0, 0)),
                              self.log.info)
        self._lineage_tables = (published, dict(result.tables))
        self.emit_asset_events(context, result)
        return summary

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Inputs: the publication's source tables; outputs: their staged change logs with the rows staged."""
        from airflow.sdk import BaseHook

        from airflow_provider_pglogical.lineage.datasets import postgres_authority, postgres_table, staged_table
        from airflow_provider_pglogical.lineage.openlineage import operator_lineage

        published, staged = getattr(self, "_lineage_tables", ((), {}))
        conn = BaseHook.get_connection(self.postgres_conn_id)
        authority = postgres_authority(conn.host or "", conn.port)
        tables = sorted(set(published) | set(staged))
        return operator_lineage([postgres_table(authority, conn.schema or "", t) for t in tables],
                                {staged_table(self.slot, t): staged.get(t, 0) for t in tables})

    def emit_asset_events(self, context: Context, result: DrainResult) -> None:
        """Attach per-table extras to matching outlet Assets and add them through outlet aliases."""
        if not result.tables:
            return
        events = context["outlet_events"]
        summary = result.to_summary()
        extras = {table_asset(result.slot, name).uri: {
            "table": name, "rows": rows, "start_lsn": summary["start_lsn"], "end_lsn": summary["end_lsn"],
            "end_lsn_int": result.end_lsn, "batch_path": result.batch_path,
        } for name, rows in result.tables.items()}
        for outlet in self.outlets or []:
            if isinstance(outlet, Asset) and outlet.uri in extras:
                events[outlet].extra = extras[outlet.uri]
            elif isinstance(outlet, AssetAlias):
                for uri, extra in extras.items():
                    events[outlet].add(Asset(uri=uri, name=uri), extra=extra)
