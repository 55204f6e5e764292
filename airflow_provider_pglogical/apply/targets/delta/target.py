"""The Delta Lake target: per (batch, table) one commit into ``<uri>/<schema>/<table>``, watermark in the same commit
(with ``target.max_merge_rows``, a large mirror table-batch in one commit per key-hash bucket, the watermark in the last).

``DeltaTarget`` implements ``targets.base.Target``: the shared runner plans each batch and hands it the
plan with the batch's Spark frames; the target brings each table's net changes (mirror) or published
changes (changelog) to the driver as Arrow — delta-rs writes from one process; Spark does the reading,
filtering, projection and compaction — and commits them with one delta-rs commit per table. A mirror's
net changes stream into the MERGE bucket by bucket (``lake/stream.py``); the collected path is the reference.
Below ``apply_batch`` everything is Arrow (``apply_net``, ``apply_net_stream``, ``truncate``,
``append_changes``), so it runs (and is tested) without Spark.

Tables are created on first use from the staged columns (types: ``types.py``), partitioned by the
configured columns; each column records its source type (``pglogical.type`` field metadata), which
is what ``describe`` reports and source schema changes are judged against (``apply/schema_changes.py``).
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake import Field as DeltaField
from deltalake import Schema as DeltaSchema

from airflow_provider_pglogical.apply.schema_changes import ADD, WIDEN, ColumnChange
from airflow_provider_pglogical.apply.targets.base import (
    BatchChanges,
    BatchResult,
    PlannedBatch,
    PlannedSnapshot,
    PlannedTable,
    PlannedTruncate,
    StagedTypesSource,
    TargetTable,
)
from airflow_provider_pglogical.apply.targets.delta import changelog, mirror
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation, app_id, sync_app_id
from airflow_provider_pglogical.apply.targets.delta.names import check_case_distinct
from airflow_provider_pglogical.apply.targets.delta.types import (
    DELTA,
    Lake,
    convert_array,
    delta_schema,
    delta_type,
    to_delta,
    unwrap_notes,
)
from airflow_provider_pglogical.apply.targets.lake import net as lake_net
from airflow_provider_pglogical.apply.targets.lake import stream
from airflow_provider_pglogical.apply.transforms import FROM, LSN
from airflow_provider_pglogical.exceptions import ApplyError, SchemaChangeError, format_lsn

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

MODES = ("mirror", "changelog")
# Where a test may stop the apply (``on_checkpoint(name, target)``): right before deltalake commits the
# table's batch (its data files may already be written), and right after the commit.
CHECKPOINTS = ("before_commit", "committed")
# With ``max_merge_rows``: right after each bucket's commit but the last (which is ``committed``, with the watermark).
BUCKET_COMMITTED = "bucket_committed"
TYPE_KEY = "pglogical.type"  # field metadata: the source column's PostgreSQL type (format_type text)
# Delta types → the PostgreSQL type a column without TYPE_KEY is judged as (tables written by other tools).
_CANONICAL = {"byte": "smallint", "short": "smallint", "integer": "integer", "long": "bigint", "float": "real",
              "double": "double precision", "boolean": "boolean", "string": "text", "binary": "bytea",
              "date": "date", "timestamp": "timestamp with time zone", "timestamp_ntz": "timestamp without time zone"}


def _noop(name: str, target: str) -> None:
    return None


def _nothing() -> None:
    return None


def _column_type(f: DeltaField) -> str:
    recorded = (f.metadata or {}).get(TYPE_KEY)
    if recorded:
        return str(recorded)
    text = getattr(f.type, "type", None)
    if isinstance(text, str):
        if text.startswith("decimal("):
            return "numeric" + text.removeprefix("decimal").replace(" ", "")
        return _CANONICAL.get(text, text)
    return str(f.type)


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

    lake: Lake = DELTA  # the typed errors of values Delta cannot hold (``types.py``)

    def __init__(self, location: DeltaLocation, slot: str, *, mode: str = "mirror",
                 partition_by: Mapping[str, Sequence[str]] | None = None,
                 on_checkpoint: Callable[[str, str], None] | None = None,
                 chunk_rows: int | None = stream.DEFAULT_CHUNK_ROWS, max_merge_rows: int | None = None) -> None:
        if mode not in MODES:
            raise ApplyError(f"Delta target mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.location, self.slot, self.mode = location, slot, mode
        self.partition_by = {t: tuple(c) for t, c in (partition_by or {}).items()}
        self.checkpoint = on_checkpoint or _noop
        # Mirror MERGE sources are streamed from Spark in buckets of about this many net changes; None: collected
        # whole (the reference path, ``lake/stream.py``).
        self.chunk_rows = chunk_rows
        # A table-batch of more net changes than this is merged in one commit per key-hash bucket of about this many
        # (``apply_net_buckets``): driver memory bounded, the batch visible partly applied between commits. None: one
        # commit per table-batch whatever its size (docs/delta.md, "Driver memory").
        if max_merge_rows is not None and max_merge_rows < 1:
            raise ApplyError(f"max_merge_rows must be at least 1, got {max_merge_rows}")
        self.max_merge_rows = max_merge_rows
        self._creating: dict[str, dict[str, str]] = {}  # tables create_table announced, made on first write

    # -- the Target protocol (targets/base.py) ---------------------------------------------

    @contextmanager
    def session(self, slot: str) -> Iterator[None]:
        """Nothing to open: every commit is its own. One apply per slot at a time is the scheduler's
        (``max_active_runs=1``); a racing second apply of a batch is refused by its app transaction."""
        if slot != self.slot:
            raise ApplyError(f"this Delta target writes slot {self.slot}, not {slot}")
        yield

    def watermarks(self, slot: str, tables: Collection[str] = ()) -> dict[str, int]:
        """``tables`` → their watermarks of ``slot`` (a Delta location is not listed: each table is opened)."""
        return {t: w for t in sorted(tables) if (w := self.watermark(t, slot)) is not None}

    def foreign_keys(self) -> list[tuple[str, str]]:
        """None: a source TRUNCATE … CASCADE names every table it emptied, which planning follows."""
        return []

    def describe(self, table: str) -> TargetTable | None:
        """Columns with their source types (``TYPE_KEY``), no key and nothing required (Delta has neither)."""
        if table in self._creating:
            return TargetTable(table, dict(self._creating[table]), ())
        dt = self.location.open(table)
        if dt is None:
            return None
        return TargetTable(table, {f.name: _column_type(f) for f in dt.schema().fields}, ())

    def create_table(self, table: str, columns: Sequence[tuple[str, str]], key: Sequence[str]) -> None:
        """Announced only: the Delta table is created by its first commit, typed from the staged Arrow data
        (``types.delta_type``), which the PostgreSQL type text alone does not determine (composites, enums)."""
        if self.location.open(table) is None:
            self._creating[table] = dict(columns)

    def apply_batch(self, plan: PlannedBatch, changes: BatchChanges) -> BatchResult:
        """Each table's part of the batch in one commit of its own, with its watermark (see the module docstring)."""
        where = f"batch {plan.start_lsn:X}-{plan.end_lsn:X}"
        seconds = {"stage": 0.0, "apply": 0.0}
        outcomes: dict[str, TableOutcome] = {}
        for table in plan.tables:  # every refusal before the first table commits: the watermarks stay unmoved
            if self.mode != "mirror":
                changelog.check_names(table.target, table.columns)
            own = changelog.LEADING + table.columns + changelog.TRAILING if self.mode != "mirror" else table.columns
            self._check_case_distinct(where, table.target, own, table, changes)
            if table.conflict == "strict":
                raise ApplyError(f"{table.target}: conflict 'strict' is not supported by the Delta target "
                                 "(it has no unique keys)")
        if plan.leaf_truncates:  # a delete by a PostgreSQL partition constraint, which Delta cannot evaluate
            leaf = plan.leaf_truncates[0]
            raise ApplyError(f"{where}: TRUNCATE of leaf partition {leaf.source} routed to {leaf.target} is not "
                             "supported by the Delta target (leaves: route_to_root is for PostgreSQL targets)")
        truncates: dict[str, list[PlannedTruncate]] = {}
        for t in plan.truncates:
            truncates.setdefault(t.target, []).append(t)
        for table in plan.tables:
            if self._at(table.target, plan.end_lsn, plan.slot):
                continue  # committed by an earlier (crashed or racing) run
            if self.mode == "mirror":
                outcomes[table.target] = self._mirror(table, plan, changes, where, seconds)
                continue
            started = time.monotonic()
            rows = unwrap_notes(stream.arrow(changes.published(table).transform(changelog.to_changelog(table.columns))),
                                f"{where}: {table.target}", changelog.LSN)
            rows = changelog.with_truncates(rows, truncates.get(table.target, []))
            seconds["stage"] += time.monotonic() - started
            started = time.monotonic()
            self.follow_schema(table, rows, where)
            outcomes[table.target] = self.append_changes(
                table.target, plan.start_lsn, plan.end_lsn, rows, columns=table.columns,
                type_names=table.type_names())
            seconds["apply"] += time.monotonic() - started
        started = time.monotonic()
        for name in plan.truncate:  # tables the batch only empties
            if name in outcomes or any(t.target == name for t in plan.tables):
                continue
            if self.mode == "mirror":
                outcomes[name] = self.truncate(name, plan.start_lsn, plan.end_lsn)
            else:
                outcomes[name] = self._append_truncates_only(name, plan.start_lsn, plan.end_lsn,
                                                             truncates.get(name, []))
        seconds["apply"] += time.monotonic() - started
        return BatchResult(applied=any(o.committed for o in outcomes.values()),
                           rows={t: o.rows for t, o in outcomes.items() if o.committed},
                           ordered=any(o.replayed for o in outcomes.values()),
                           seconds={k: round(v, 3) for k, v in seconds.items()})

    def _mirror(self, table: PlannedTable, plan: PlannedBatch, changes: BatchChanges, where: str,
                seconds: dict[str, float]) -> TableOutcome:
        """One table's net changes in one MERGE commit: streamed bucket by bucket from Spark (``lake/stream.py``) when
        ``chunk_rows`` is set, the table-batch staged more changes than that (or does not say how many) and no change
        needs the whole table's changes, else collected whole (the reference). With ``max_merge_rows`` set, a
        table-batch of more net changes than that is merged in one commit per bucket (``apply_net_buckets``). A
        table-batch the direct path covers and that would be collected whole is read from its staged files instead
        (``lake/direct.py``: no Spark); one it nets in this process and that would not be collected whole (or is
        netted in key partitions) is streamed into the same commit from its spill files instead of Spark's buckets
        (``lake/parts.py``; several schema versions in their union), unless it has no published change."""
        def streamed(chunks: stream.NetChunks, summary: stream.NetSummary) -> TableOutcome:
            per_commit = self.max_merge_rows is not None and summary.rows > self.max_merge_rows
            return self._mirror_streamed(table, plan, chunks, summary, where, seconds, per_commit=per_commit)

        return lake_net.apply_mirror(self, table, plan, changes, seconds, (self.chunk_rows, self.max_merge_rows),
                                     streamed, direct=True)

    def _mirror_streamed(self, table: PlannedTable, plan: PlannedBatch, net: stream.NetChunks,
                         summary: stream.NetSummary, where: str, seconds: dict[str, float], *,
                         per_commit: bool) -> TableOutcome:
        bucket_rows = self.max_merge_rows if per_commit else self.chunk_rows
        count = stream.buckets(summary.rows, bucket_rows or summary.rows)
        chunks = net.buckets(count) if per_commit else net.pieces(bucket_rows or summary.rows)

        def prepared(chunk: pa.Table) -> pa.Table:
            return lake_net.prepared(table, chunk, where, self.lake)

        try:
            started = time.monotonic()
            first = prepared(next(chunks))
            seconds["stage"] += time.monotonic() - started
            started = time.monotonic()
            self.follow_schema(table, first, where)
            rest = (prepared(c) for c in chunks)
            common: dict[str, Any] = {
                "rows": summary.rows, "kept": summary.kept, "key": table.key, "columns": table.columns,
                "type_names": table.type_names(), "truncated": table.truncated_at is not None,
                "null_safe_key": lake_net.null_safe_key(table)}
            if per_commit:
                outcome = self.apply_net_buckets(table.target, plan.start_lsn, plan.end_lsn,
                                                 itertools.chain([first], rest), count=count, **common)
            else:
                outcome = self.apply_net_stream(table.target, plan.start_lsn, plan.end_lsn, first, rest, **common)
            seconds["apply"] += time.monotonic() - started
            return outcome
        finally:
            chunks.close()

    # -- snapshots (``targets/base.SnapshotTarget``) -----------------------------------------

    def sync_marks(self, slot: str, tables: Collection[str] = ()) -> dict[str, int]:
        """``tables`` → the sync LSN of the snapshot each holds: the app transaction ``sync_app_id`` of its log."""
        out = {}
        for name in sorted(tables):
            table = self.location.open(name)
            mark = None if table is None else table.transaction_version(sync_app_id(slot, name))
            if mark is not None:
                out[name] = mark
        return out

    def apply_snapshot(self, plan: PlannedSnapshot, changes: Any) -> BatchResult:
        """Each table's snapshot rows replace its rows in one overwrite commit that also sets its watermark *to*
        the sync LSN (backwards too: a resync) and records the sync LSN (``sync_app_id``).

        Delta has no multi-table transactions: like a batch, each table is atomic on its own, and a table
        whose sync mark is at ``plan.lsn`` already is skipped, so a re-run after a crash between tables
        loads the others and nothing twice. A crash before a commit leaves only unreferenced files.
        """
        where = f"snapshot at {format_lsn(plan.lsn)}"
        if self.mode != "mirror":
            raise ApplyError(f"{where} of {', '.join(t.target for t in plan.tables)}: a Delta change feed "
                             "(mode changelog) does not load snapshots; use mode mirror")
        for table in plan.tables:
            self._check_case_distinct(where, table.target, table.columns, table, changes)
        result = BatchResult(applied=False)
        seconds = {"stage": 0.0, "apply": 0.0}
        for table in plan.tables:
            current = self.location.open(table.target)
            if current is not None and (current.transaction_version(sync_app_id(plan.slot, table.target))
                                        or -1) >= plan.lsn:
                continue  # loaded by an earlier (crashed or racing) run
            started = time.monotonic()
            rows = unwrap_notes(stream.arrow(changes.rows(table)), f"{where}: {table.target}")
            seconds["stage"] += time.monotonic() - started
            started = time.monotonic()
            types = table.type_names()
            converted, schema = self._convert(rows, table.columns, (), f"{where}: {table.target}", types)
            dt = self._table(table.target, schema, where, types)
            props = CommitProperties(
                app_transactions=[Transaction(app_id(plan.slot, table.target), plan.lsn),
                                  Transaction(sync_app_id(plan.slot, table.target), plan.lsn)],
                custom_metadata={**mirror.metadata(plan.slot, plan.lsn, plan.lsn, []), "pglogical.snapshot": "true"})
            self.checkpoint("before_commit", table.target)
            write_deltalake(dt, converted.select(list(table.columns)), mode="overwrite", commit_properties=props)
            self.checkpoint("committed", table.target)
            seconds["apply"] += time.monotonic() - started
            result.applied = True
            result.rows[table.target] = {"snapshot_rows": converted.num_rows}
        result.seconds = {k: round(v, 3) for k, v in seconds.items()}
        return result

    def _at(self, target: str, end_lsn: int, slot: str | None = None) -> bool:
        mark = self.watermark(target, slot)
        return mark is not None and mark >= end_lsn

    def follow_schema(self, table: PlannedTable, data: pa.Table, where: str) -> None:
        """The planned source schema changes (``apply/schema_changes.py``) on the Delta table, before its data.

        A new column is added (typed like the staged values, nullable); a widening the Delta type already
        holds (``varchar(n)`` → ``text``, ``timestamp(3)`` → ``timestamp``) only records the new source
        type; a widening that changes the Delta type (``integer`` → ``bigint``, ``numeric(10,2)`` →
        ``numeric(12,2)``) stops with ``SchemaChangeError``: delta-rs cannot change a column's type in
        place. Each is a commit of its own without a watermark, so a re-run finds it done. A dropped source
        column is simply no longer written (Delta columns are nullable). A table not created yet is created
        with the new shape by its first commit.
        """
        changes = [c for c in table.column_changes if c.kind in (ADD, WIDEN)]
        dt = self.location.open(table.target) if changes else None
        if dt is None:
            return
        current = {f.name: f for f in dt.schema().fields}
        types = table.type_names()
        for ch in changes:
            wanted = delta_type(data.schema.field(ch.column).type, types.get(ch.column))
            if ch.kind == ADD and ch.column not in current:
                log.info("%s: adding column %s (%s) to Delta table %s", where, ch.column, ch.new_type, table.target)
                dt.alter.add_columns([_delta_field(ch.column, wanted, ch.new_type)])
                fill = _default_sql(wanted, ch.default) if self.mode == "mirror" else None
                if fill is not None:
                    # Rows older than the source's ADD COLUMN … DEFAULT read the default there: so do they here.
                    # (A change feed keeps its history as it happened.)
                    dt.update(updates={ch.column: fill})
            elif ch.kind == WIDEN:
                have = current[ch.column]
                if delta_type(_arrow_type(have)) != wanted:
                    raise _cannot_widen(table.target, ch, _arrow_type(have), wanted)
                dt.alter.set_column_metadata(ch.column, {TYPE_KEY: str(ch.new_type)})

    def _append_truncates_only(self, name: str, start_lsn: int, end_lsn: int,
                               truncates: Sequence[PlannedTruncate]) -> TableOutcome:
        table = self.location.open(name)
        if table is None:
            return TableOutcome(committed=False)  # no feed yet: a truncate of nothing has no reader
        schema = pa.schema(table.schema().to_arrow())
        rows = changelog.with_truncates(schema.empty_table(), truncates)
        columns = [c for c in schema.names if c not in changelog.LEADING + changelog.TRAILING]
        return self.append_changes(name, start_lsn, end_lsn, rows, columns=columns, type_names={})

    # -- Arrow level -----------------------------------------------------------------------

    def watermark(self, target: str, slot: str | None = None) -> int | None:
        table = self.location.open(target)
        return None if table is None else table.transaction_version(app_id(slot or self.slot, target))

    def _check_case_distinct(self, where: str, target: str, columns: Sequence[str], table: PlannedTable,
                             changes: BatchChanges | None) -> None:
        """``check_case_distinct`` of the columns written together with those the Delta table has already: a column
        the source dropped stays in the table, and a later one differing from it only by case would clash there;
        and of the struct fields of the written columns' staged types (composites), from the staged files' footers,
        joined with the fields the table's own structs hold (a composite's attribute renamed only by case)."""
        dt = self.location.open(target)
        existing = pa.schema(dt.schema().to_arrow()) if dt is not None else pa.schema([])
        types = changes.staged_types(table) if isinstance(changes, StagedTypesSource) else None
        check_case_distinct(where, target, list(dict.fromkeys([*columns, *existing.names])), types,
                            {f.name: f.type for f in existing})

    def _table(self, target: str, schema: pa.Schema, where: str,
               type_names: Mapping[str, str | None] | None = None) -> DeltaTable:
        table = self.location.open(target)
        if table is None:
            parts = list(self.partition_by.get(target, ()))
            unknown = sorted(set(parts) - set(schema.names))
            if unknown:
                raise ApplyError(f"partition column(s) {', '.join(unknown)} of {target} are not replicated columns")
            log.info("%s: creating Delta table %s (%s)", where, target, self.mode)
            names = type_names or {}
            typed = pa.schema([f.with_metadata({TYPE_KEY: names[f.name]}) if names.get(f.name) else f
                               for f in schema])
            table = DeltaTable.create(self.location.table_uri(target), schema=typed, partition_by=parts or None,
                                      mode="ignore", storage_options=self.location.options,
                                      name=target, description=f"pglogical {self.mode} of slot {self.slot}")
            self._creating.pop(target, None)
        missing = sorted(set(schema.names) - {f.name for f in table.schema().fields})
        if missing:
            raise ApplyError(f"Delta table {target} is missing replicated column(s) {', '.join(missing)}")
        return table

    def _convert(self, table: pa.Table, columns: Sequence[str], key: Sequence[str], where: str,
                 type_names: Mapping[str, str | None]) -> tuple[pa.Table, pa.Schema]:
        schema = delta_schema(table.select(list(columns)).schema, type_names)
        out = to_delta(table, schema, where, type_names, lsn_column=LSN)
        if FROM in out.column_names and key:  # the old key, typed like the key columns (replay compares them)
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
        converted, schema = self._convert(net, columns, key, f"{where}: {target}", type_names)
        dt = self._table(target, schema, where, type_names)
        app = app_id(self.slot, target)
        if (dt.transaction_version(app) or -1) >= end_lsn:
            return TableOutcome(committed=False)
        if not key:
            return self._append_rows(dt, target, start_lsn, end_lsn, converted.select(list(columns)), truncated)
        replayed = False
        if mirror.needs_replay(converted):
            if ordered is None:
                raise ApplyError(f"{where}: {target} needs its ordered changes to place moved unchanged-TOAST values")
            changes, _ = self._convert(ordered(), columns, key, f"{where}: {target}", type_names)
            keys = set(mirror.key_tuples(changes, key)) | {f for f in mirror.from_tuples(changes, key) if f}
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
        if converted.num_rows and mirror.appends() and mirror.keys_absent(dt, converted, key, truncated=truncated):
            rows = mirror.append_inserts(dt, converted, columns, props=props,
                                         before_commit=lambda: self.checkpoint("before_commit", target))
        elif converted.num_rows:
            rows = mirror.merge_net(dt, converted, key, columns, truncated=truncated, props=props,
                                    before_commit=lambda: self.checkpoint("before_commit", target), null_safe=null_safe_key)
        else:
            self.checkpoint("before_commit", target)
            rows = self._delete_all(dt, props) if truncated else {}
        self._finish(dt, version, props, target)
        return TableOutcome(committed=True, rows=_counts(rows), rejects=rejects, replayed=replayed)

    def apply_net_stream(self, target: str, start_lsn: int, end_lsn: int, first: pa.Table, rest: Iterator[pa.Table],
                         *, rows: int, kept: Sequence[str], key: Sequence[str], columns: Sequence[str],
                         type_names: Mapping[str, str | None], truncated: bool,
                         null_safe_key: bool = False) -> TableOutcome:
        """``apply_net`` of net changes arriving in chunks (``first``, then ``rest``; each shaped as ``apply_net``'s
        ``net``, disjoint by key, ``rows`` in all), each converted on its own and streamed into the one MERGE;
        ``kept``: the columns some change keeps. Only for net changes that need neither the target's rows nor
        the batch order (``stream.NetSummary``). Raises what converting a chunk raised (``DeltaValueError``), and
        commits nothing then."""
        where = f"batch {start_lsn:X}-{end_lsn:X}"
        label = f"{where}: {target}"
        converted, schema = self._convert(first, columns, key, label, type_names)
        dt = self._table(target, schema, where, type_names)
        app = app_id(self.slot, target)
        if (dt.transaction_version(app) or -1) >= end_lsn:
            return TableOutcome(committed=False)

        def source(net: pa.Table) -> pa.Table:
            return mirror.merge_source(net, key, columns, kept=kept)[0]

        source_stream = stream.SourceStream(
            (source(self._convert(c, columns, key, label, type_names)[0]) for c in rest), source(converted), rows=rows,
            where=label)
        props = mirror.commit_properties(app, end_lsn, mirror.metadata(self.slot, start_lsn, end_lsn, []))
        version = dt.version()
        if rows:
            try:
                metrics = mirror.merge(dt, source_stream.reader(), mirror.merge_updates(
                    [c for c in columns if c not in key], kept), key, columns, truncated=truncated, props=props,
                    before_commit=lambda: self.checkpoint("before_commit", target), null_safe=null_safe_key)
            except Exception as exc:
                if source_stream.error is not None:  # delta-rs reports it as its own text: raise the original
                    raise source_stream.error from exc
                raise
        else:
            self.checkpoint("before_commit", target)
            metrics = self._delete_all(dt, props) if truncated else {}
        self._finish(dt, version, props, target)
        return TableOutcome(committed=True, rows=_counts(metrics))

    def apply_net_buckets(self, target: str, start_lsn: int, end_lsn: int, buckets: Iterator[pa.Table], *,
                          count: int, rows: int, kept: Sequence[str], key: Sequence[str], columns: Sequence[str],
                          type_names: Mapping[str, str | None], truncated: bool,
                          null_safe_key: bool = False) -> TableOutcome:
        """``apply_net_stream`` of net changes arriving in ``count`` key-disjoint ``buckets``, each merged in a commit
        of its own; only the last commit carries the watermark.

        Net changes are idempotent per key (the final image upserted, or a delete; a kept column takes the target's
        value, which an earlier run of the same change left as it was), so a run stopped between two commits
        leaves the watermark at the previous batch and the re-run merges every bucket again to the same table. A
        TRUNCATE before the changes is the first commit's (rows no bucket re-inserts go there); the later buckets'
        keys match no remaining row. Readers may see the batch partly applied between the commits."""
        where = f"batch {start_lsn:X}-{end_lsn:X}"
        label = f"{where}: {target}"
        existing = self.location.open(target)
        if existing is not None and (existing.transaction_version(app_id(self.slot, target)) or -1) >= end_lsn:
            return TableOutcome(committed=False)
        if count == 1 or rows == 0:  # one commit anyway (a TRUNCATE alone deletes every row): apply_net_stream's
            first = next(buckets, None)
            if first is None:
                raise ApplyError(f"{label}: no bucket of the {count} planned")
            return self.apply_net_stream(target, start_lsn, end_lsn, first, itertools.islice(buckets, count - 1),
                                         rows=rows, kept=kept, key=key, columns=columns, type_names=type_names,
                                         truncated=truncated, null_safe_key=null_safe_key)
        totals: dict[str, int] = {}
        merged = 0
        for index, bucket in enumerate(itertools.islice(buckets, count)):
            merged += bucket.num_rows
            if index == count - 1:
                if merged != rows:  # before the last commit: the watermark stays where it was
                    raise ApplyError(f"{label}: {merged} net change(s) reached the MERGE commits, {rows} were planned")
                outcome = self.apply_net_stream(target, start_lsn, end_lsn, bucket, iter(()), rows=bucket.num_rows,
                                                kept=kept, key=key, columns=columns, type_names=type_names,
                                                truncated=truncated and index == 0, null_safe_key=null_safe_key)
                for name, n in outcome.rows.items():
                    totals[name] = totals.get(name, 0) + n
                return TableOutcome(committed=outcome.committed, rows=totals)
            counts = self._merge_bucket(target, where, bucket, f"{index + 1}/{count}", kept=kept, key=key,
                                        columns=columns, type_names=type_names, truncated=truncated and index == 0,
                                        null_safe_key=null_safe_key,
                                        metadata=mirror.metadata(self.slot, start_lsn, end_lsn, []))
            for name, n in counts.items():
                totals[name] = totals.get(name, 0) + n
        raise ApplyError(f"{label}: {merged} net change(s) in fewer buckets than the {count} planned")

    def _merge_bucket(self, target: str, where: str, bucket: pa.Table, position: str, *, kept: Sequence[str],
                      key: Sequence[str], columns: Sequence[str], type_names: Mapping[str, str | None],
                      truncated: bool, null_safe_key: bool, metadata: dict[str, str]) -> dict[str, int]:
        """One bucket of ``apply_net_buckets`` but the last: its MERGE commit without the watermark."""
        converted, schema = self._convert(bucket, columns, key, f"{where}: {target}", type_names)
        dt = self._table(target, schema, where, type_names)
        commit = CommitProperties(custom_metadata={**metadata, "pglogical.bucket": position})
        if not converted.num_rows and not truncated:
            return {}  # nothing to merge: no commit
        # An empty first bucket after a TRUNCATE still merges: its "not matched by source" deletes every row, counted
        # as the one-commit MERGE counts them.
        source, _ = mirror.merge_source(converted, key, columns, kept=kept)
        metrics = mirror.merge(dt, source, mirror.merge_updates([c for c in columns if c not in key], kept), key,
                               columns, truncated=truncated, props=commit, before_commit=_nothing,
                               null_safe=null_safe_key)
        self.checkpoint(BUCKET_COMMITTED, target)
        return _counts(metrics)

    def _append_rows(self, dt: DeltaTable, target: str, start_lsn: int, end_lsn: int, rows: pa.Table,
                     truncated: bool) -> TableOutcome:
        """A keyless (insert-only) table: its INSERTs appended — after a truncate, replacing every row — in one
        commit with the watermark (nothing to match: the source table has no replica identity)."""
        props = mirror.commit_properties(app_id(self.slot, target), end_lsn,
                                         mirror.metadata(self.slot, start_lsn, end_lsn, []))
        self.checkpoint("before_commit", target)
        write_deltalake(dt, rows, mode="overwrite" if truncated else "append", commit_properties=props)
        self.checkpoint("committed", target)
        return TableOutcome(committed=True, rows={"inserted": rows.num_rows})

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
        converted = to_delta(rows, schema, f"{where}: {target}", type_names, lsn_column=changelog.LSN)
        dt = self._table(target, schema, where, type_names)
        app = app_id(self.slot, target)
        if (dt.transaction_version(app) or -1) >= end_lsn:
            return TableOutcome(committed=False)
        props = mirror.commit_properties(app, end_lsn, mirror.metadata(self.slot, start_lsn, end_lsn, []))
        self.checkpoint("before_commit", target)
        # ``merge``: the old image ``_old`` is a struct of the relation's columns, which gains (or loses)
        # fields as the source schema changes; top-level columns were added by ``follow_schema`` already.
        write_deltalake(dt, converted, mode="append", schema_mode="merge", commit_properties=props)
        self.checkpoint("committed", target)
        return TableOutcome(committed=True, rows={"appended": converted.num_rows})


def _counts(metrics: Mapping[str, object]) -> dict[str, int]:
    keep = ("num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted", "num_deleted_rows")
    return {k.removeprefix("num_target_rows_").removeprefix("num_"): int(v)  # type: ignore[call-overload]
            for k, v in metrics.items() if k in keep}


def _arrow_type(f: DeltaField) -> pa.DataType:
    return pa.schema(DeltaSchema([f]).to_arrow()).field(0).type


_SQL_TYPES = {pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INT", pa.int64(): "BIGINT",
              pa.float32(): "REAL", pa.float64(): "DOUBLE", pa.string(): "VARCHAR", pa.large_string(): "VARCHAR",
              pa.bool_(): "BOOLEAN", pa.date32(): "DATE"}


def _default_sql(dtype: pa.DataType, text: str | None) -> str | None:
    """A SQL expression of the source's ADD COLUMN default (its ``attmissingval`` text) as the Delta column's type;
    None when there is none or the type does not cast exactly from PostgreSQL's text (the rows stay null, as
    in the PostgreSQL target's in-batch rule: integers, floats, numeric, text, boolean, ISO dates)."""
    if text is None:
        return None
    if pa.types.is_decimal(dtype):
        if text.lower() == "nan":
            return None
        sql_type = f"DECIMAL({dtype.precision},{dtype.scale})"
    elif pa.types.is_date32(dtype):
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            return None
        sql_type = "DATE"
    else:
        found = _SQL_TYPES.get(dtype)
        if found is None:
            return None
        sql_type = found
    literal = "'" + text.replace("'", "''") + "'"
    return literal if sql_type == "VARCHAR" else f"CAST({literal} AS {sql_type})"


def _delta_field(name: str, dtype: pa.DataType, source_type: str | None) -> DeltaField:
    arrow = pa.field(name, dtype, nullable=True, metadata={TYPE_KEY: source_type} if source_type else None)
    return DeltaField.from_arrow(arrow)


def _cannot_widen(target: str, ch: ColumnChange, have: pa.DataType, wanted: pa.DataType) -> SchemaChangeError:
    lsn = ch.lsn if ch.lsn is not None else 0
    return SchemaChangeError(
        f"column {ch.column} of Delta table {target} widened on the source from {ch.old_type} to {ch.new_type} at "
        f"LSN {format_lsn(lsn)}: its Delta type {have} cannot hold the new values ({wanted}) and delta-rs cannot "
        "change a column's type in place. Rewrite the table with the wider type (e.g. read it, cast the column, "
        f"overwrite with schema_mode='overwrite', keeping field metadata {TYPE_KEY}={ch.new_type!r}), then run "
        "again (docs/delta.md, Schema changes)",
        table=target, column=ch.column, old_type=ch.old_type, new_type=ch.new_type, lsn=lsn)
