"""The Delta Lake target: per (batch, table) one commit into ``<uri>/<schema>/<table>``, watermark in the same commit.

Tables are created on first use from the staged columns (types: ``types.py``), partitioned by the
configured columns. ``DeltaTarget`` is what the apply runner talks to; it never sees Spark, only
Arrow tables, so it runs (and is tested) without a Spark session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from airflow_provider_pglogical.apply.targets.delta import mirror
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation, app_id
from airflow_provider_pglogical.apply.targets.delta.types import convert_array, delta_schema, to_delta
from airflow_provider_pglogical.apply.transforms import FROM
from airflow_provider_pglogical.exceptions import ApplyError

log = logging.getLogger(__name__)

MODES = ("mirror", "changelog")
# Where a test may stop the apply (``on_checkpoint(name, target)``): right before deltalake commits the
# table's batch (its data files may already be written), and right after the commit.
CHECKPOINTS = ("before_commit", "committed")


def _noop(name: str, target: str) -> None:
    return None


@dataclass
class TableOutcome:
    """What one table's commit did: deltalake's metrics (or counts), rejects, whether it replayed."""

    committed: bool
    rows: dict[str, int] = field(default_factory=dict)
    rejects: list[mirror.Reject] = field(default_factory=list)
    replayed: bool = False


class DeltaTarget:
    """Delta tables of one slot under ``location`` in ``mode`` (``mirror`` or ``changelog``).

    Idempotent under replay: every commit carries the app transaction ``pglogical/<slot>/<table>`` =
    the batch's end LSN; a batch at or below it is skipped, so re-running any batches changes nothing
    and a crash between the tables of one batch resumes with the tables not yet committed.
    """

    def __init__(self, location: DeltaLocation, slot: str, *, mode: str = "mirror",
                 partition_by: Mapping[str, Sequence[str]] | None = None,
                 on_checkpoint: Callable[[str, str], None] | None = None) -> None:
        if mode not in MODES:
            raise ApplyError(f"Delta target mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.location, self.slot, self.mode = location, slot, mode
        self.partition_by = {t: tuple(c) for t, c in (partition_by or {}).items()}
        self.checkpoint = on_checkpoint or _noop

    def watermark(self, target: str) -> int | None:
        table = self.location.open(target)
        return None if table is None else table.transaction_version(app_id(self.slot, target))

    def watermarks(self, targets: Sequence[str]) -> dict[str, int]:
        return {t: w for t in targets if (w := self.watermark(t)) is not None}

    def _table(self, target: str, schema: pa.Schema, where: str) -> DeltaTable:
        table = self.location.open(target)
        if table is None:
            parts = list(self.partition_by.get(target, ()))
            unknown = sorted(set(parts) - set(schema.names))
            if unknown:
                raise ApplyError(f"partition column(s) {', '.join(unknown)} of {target} are not replicated columns")
            log.info("%s: creating Delta table %s (%s)", where, target, self.mode)
            table = DeltaTable.create(self.location.table_uri(target), schema=schema, partition_by=parts or None,
                                      mode="ignore", storage_options=self.location.options,
                                      name=target, description=f"pglogical {self.mode} of slot {self.slot}")
        missing = sorted(set(schema.names) - {f.name for f in table.schema().fields})
        if missing:
            raise ApplyError(f"Delta table {target} is missing replicated column(s) {', '.join(missing)}")
        return table

    def _convert(self, table: pa.Table, columns: Sequence[str], key: Sequence[str], where: str,
                 type_names: Mapping[str, str | None]) -> tuple[pa.Table, pa.Schema]:
        schema = delta_schema(table.select(list(columns)).schema, type_names)
        out = to_delta(table, schema, where, type_names)
        if FROM in out.column_names:  # the old key, typed like the key columns (replay compares them)
            from_type = pa.struct([schema.field(k) for k in key])
            col = out.column(FROM)
            out = out.set_column(out.column_names.index(FROM), FROM, pa.chunked_array(
                [convert_array(c, from_type, FROM, where) for c in col.chunks], type=from_type))
        return out, schema

    def _finish(self, dt: DeltaTable, version: int, props: CommitProperties, target: str) -> None:
        """Record the watermark alone when the batch's statement committed nothing (it had no effect)."""
        if dt.version() == version:
            mirror.commit_watermark_only(dt, props)
        self.checkpoint("committed", target)

    def apply_net(self, target: str, start_lsn: int, end_lsn: int, net: pa.Table, *, key: Sequence[str],
                  columns: Sequence[str], type_names: Mapping[str, str | None], truncated: bool,
                  unchanged_toast: str = "fail", ordered: Callable[[], pa.Table] | None = None,
                  null_safe_key: bool = False) -> TableOutcome:
        """Mirror mode: the batch's net changes of ``target`` (and a truncate before them) in one MERGE commit."""
        where = f"batch {start_lsn:X}-{end_lsn:X}"
        converted, schema = self._convert(net, columns, key, where, type_names)
        dt = self._table(target, schema, where)
        app = app_id(self.slot, target)
        if (dt.transaction_version(app) or -1) >= end_lsn:
            return TableOutcome(committed=False)
        replayed = False
        if mirror.needs_replay(converted):
            if ordered is None:
                raise ApplyError(f"{where}: {target} needs its ordered changes to place moved unchanged-TOAST values")
            changes, _ = self._convert(ordered(), columns, key, where, type_names)
            keys = set(mirror._key_tuples(changes, key)) | {f for f in mirror._from_tuples(changes, key) if f}
            base = mirror.target_rows(dt, set() if truncated else keys, key, columns)
            converted, rejects = mirror.replay_net(changes, base.cast(schema.remove_metadata()) if base.num_rows
                                                   else base, key, columns, where=where, target=target,
                                                   unchanged_toast=unchanged_toast)
            replayed = True
        else:
            converted, rejects = mirror.resolve_keeps(dt, converted, key, columns, truncated=truncated, where=where,
                                                      target=target, unchanged_toast=unchanged_toast)
        props = mirror.commit_properties(app, end_lsn, mirror.metadata(self.slot, start_lsn, end_lsn, rejects))
        version = dt.version()
        if converted.num_rows:
            rows = mirror.merge_net(dt, converted, key, columns, truncated=truncated, props=props,
                                    before_commit=lambda: self.checkpoint("before_commit", target), null_safe=null_safe_key)
        else:
            self.checkpoint("before_commit", target)
            rows = self._delete_all(dt, props) if truncated else {}
        self._finish(dt, version, props, target)
        return TableOutcome(committed=True, rows=_counts(rows), rejects=rejects, replayed=replayed)

    def truncate(self, target: str, start_lsn: int, end_lsn: int) -> TableOutcome:
        """A batch that only truncates ``target`` (mirror mode): delete every row, with the watermark."""
        dt = self.location.open(target)
        app = app_id(self.slot, target)
        if dt is None or (dt.transaction_version(app) or -1) >= end_lsn:
            return TableOutcome(committed=False)  # never created: nothing to empty, nothing to remember
        props = mirror.commit_properties(app, end_lsn, mirror.metadata(self.slot, start_lsn, end_lsn, []))
        version = dt.version()
        self.checkpoint("before_commit", target)
        rows = self._delete_all(dt, props)
        self._finish(dt, version, props, target)
        return TableOutcome(committed=True, rows=_counts(rows))

    @staticmethod
    def _delete_all(dt: DeltaTable, props: CommitProperties) -> dict[str, int]:
        return dict(dt.delete(commit_properties=props))

    def append_changes(self, target: str, start_lsn: int, end_lsn: int, rows: pa.Table, *,
                       columns: Sequence[str], type_names: Mapping[str, str | None]) -> TableOutcome:
        """Changelog mode: the batch's published changes (and truncates) of ``target`` appended in one commit."""
        where = f"batch {start_lsn:X}-{end_lsn:X}"
        schema = delta_schema(rows.schema, type_names)
        converted = to_delta(rows, schema, where, type_names)
        dt = self._table(target, schema, where)
        app = app_id(self.slot, target)
        if (dt.transaction_version(app) or -1) >= end_lsn:
            return TableOutcome(committed=False)
        props = mirror.commit_properties(app, end_lsn, mirror.metadata(self.slot, start_lsn, end_lsn, []))
        self.checkpoint("before_commit", target)
        write_deltalake(dt, converted, mode="append", commit_properties=props)
        self.checkpoint("committed", target)
        return TableOutcome(committed=True, rows={"appended": converted.num_rows})


def _counts(metrics: Mapping[str, object]) -> dict[str, int]:
    keep = ("num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted", "num_deleted_rows")
    return {k.removeprefix("num_target_rows_").removeprefix("num_"): int(v)  # type: ignore[call-overload]
            for k, v in metrics.items() if k in keep}
