"""The Apache Iceberg target: per (batch, table) one Iceberg commit, the watermark in the same commit.

``IcebergTarget`` implements ``targets.base.Target`` like the Delta target (``delta/target.py``): the shared runner
plans each batch and hands it the plan with the batch's Spark frames; the target collects each table's net changes
(mirror) or published changes (changelog) as Arrow on the driver and commits them with pyiceberg — Spark does the
reading, filtering, projection and compaction, except for a mirror's table-batch the direct path covers, whose net
rows are read from its staged files in this process (``lake/direct.py``; a run of only such batches starts no
JVM). Below ``apply_batch`` everything is Arrow (``apply_net``, ``truncate``, ``append_changes``), so it runs (and
is tested) without Spark.

One commit per table and batch is one pyiceberg ``Transaction``: its snapshots (the data files a batch removes,
the files it adds), its schema changes and the table property ``pglogical.watermark.<slot>`` = the batch's end
LSN reach the catalog as ONE metadata update (the catalog's compare-and-swap of the table's metadata pointer), so
the watermark cannot be separated from the data it describes. Each snapshot's summary also records
``pglogical.slot``/``pglogical.start-lsn``/``pglogical.end-lsn`` for readers of the table's history.

Mirror commits are copy-on-write (``mirror.py`` decides the rows): the data files holding a replaced or deleted
key are removed and their other rows written again with the batch's rows, so the table has no delete files and
every reader (DuckDB, Trino, Spark, Snowflake, Athena, BigQuery) reads it as plain Parquet (docs/iceberg.md).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.apply.schema_changes import ADD, WIDEN, ColumnChange
from airflow_provider_pglogical.apply.targets.base import (
    BatchChanges,
    BatchResult,
    PlannedBatch,
    PlannedSnapshot,
    PlannedTable,
    PlannedTruncate,
    TargetTable,
)
from airflow_provider_pglogical.apply.targets.delta import changelog
from airflow_provider_pglogical.apply.targets.delta import mirror as merge_rules
from airflow_provider_pglogical.apply.targets.delta.types import Lake, convert_array
from airflow_provider_pglogical.apply.targets.iceberg import mirror
from airflow_provider_pglogical.apply.targets.iceberg.catalog import (
    IcebergLocation,
    lsn_property,
    open_table,
    sync_key,
    watermark_key,
)
from airflow_provider_pglogical.apply.targets.iceberg.types import (
    ICEBERG,
    documented,
    iceberg_schema,
    source_type,
    to_iceberg,
    unwrap,
)
from airflow_provider_pglogical.apply.targets.lake import net as lake_net
from airflow_provider_pglogical.apply.targets.lake import stream
from airflow_provider_pglogical.apply.transforms import FROM, LSN
from airflow_provider_pglogical.exceptions import ApplyError, SchemaChangeError, format_lsn

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import FileScanTask, Table, Transaction

log = logging.getLogger(__name__)

MODES = ("mirror", "changelog")
# Where a test may stop the apply (``on_checkpoint(name, target)``): right before the table's transaction is
# committed to the catalog (its data and manifest files are written), and right after the commit.
CHECKPOINTS = ("before_commit", "committed")
# pyiceberg retries a commit that lost a race by re-basing its snapshots on the winner's; for a batch that would
# apply it on top of a racing apply of the same batch. Tables this target creates fail the commit instead.
TABLE_PROPERTIES = {"commit.retry.num-retries": "0"}
# Iceberg types → the PostgreSQL type a column without a recorded source type is judged as (another tool's table).
_CANONICAL = {"int": "integer", "long": "bigint", "float": "real", "double": "double precision", "boolean": "boolean",
              "string": "text", "binary": "bytea", "date": "date", "time": "time without time zone",
              "timestamp": "timestamp without time zone", "timestamptz": "timestamp with time zone", "uuid": "uuid"}


def _noop(name: str, target: str) -> None:
    return None


def _column_type(doc: str | None, iceberg_type: str) -> str:
    recorded = source_type(doc)
    if recorded:
        return recorded
    if iceberg_type.startswith("decimal("):
        return "numeric" + iceberg_type.removeprefix("decimal").replace(" ", "")
    return _CANONICAL.get(iceberg_type, iceberg_type)


@dataclass
class TableOutcome:
    """What one table's commit did: counts, rejects, whether it replayed the batch in order."""

    committed: bool
    rows: dict[str, int] = field(default_factory=dict)
    rejects: list[merge_rules.Reject] = field(default_factory=list)
    replayed: bool = False


class IcebergTarget:
    """Iceberg tables of one slot in ``location``'s catalog, in ``mode`` (``mirror`` or ``changelog``).

    Idempotent under replay: every commit sets the table property ``pglogical.watermark.<slot>`` = the batch's
    end LSN together with the data; a batch at or below it is skipped, so re-running any batches changes nothing
    and a crash between the tables of one batch resumes with the tables not yet committed.
    """

    lake: Lake = ICEBERG  # the typed errors of values Iceberg cannot hold (``types.py``)

    def __init__(self, location: IcebergLocation, slot: str, *, mode: str = "mirror",
                 partition_by: Mapping[str, Sequence[str]] | None = None,
                 on_checkpoint: Callable[[str, str], None] | None = None,
                 chunk_rows: int | None = stream.DEFAULT_CHUNK_ROWS) -> None:
        if mode not in MODES:
            raise ApplyError(f"Iceberg target mode must be one of {', '.join(MODES)}, got {mode!r}")
        # Mirror net changes are streamed from Spark in key-hash buckets of about this many (``lake/stream.py``);
        # None: collected whole. Either way a table-batch the direct path covers is read from the staged files
        # instead (``lake/direct.py``); the reference is Spark's collected frame (``PGLOGICAL_APPLY_DIRECT=0``).
        self.chunk_rows = chunk_rows
        self.location, self.slot, self.mode = location, slot, mode
        self.partition_by = {t: tuple(c) for t, c in (partition_by or {}).items()}
        self.checkpoint = on_checkpoint or _noop
        self._catalog: Catalog | None = None
        self._creating: dict[str, dict[str, str]] = {}  # tables create_table announced, made on first write

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = self.location.connect()
        return self._catalog

    def open(self, target: str) -> Table | None:
        """The table as the catalog holds it now (a fresh load), or None."""
        return open_table(self.catalog, self.location, target)

    # -- the Target protocol (targets/base.py) ---------------------------------------------

    @contextmanager
    def session(self, slot: str) -> Iterator[None]:
        """Nothing to lock: one apply per slot at a time is the scheduler's (``max_active_runs=1``); a racing
        second commit of a table fails the catalog's compare-and-swap (no retries: ``TABLE_PROPERTIES``)."""
        if slot != self.slot:
            raise ApplyError(f"this Iceberg target writes slot {self.slot}, not {slot}")
        yield

    def watermarks(self, slot: str, tables: Collection[str] = ()) -> dict[str, int]:
        """``tables`` → their watermarks of ``slot`` (each table is loaded from the catalog)."""
        return {t: w for t in sorted(tables) if (w := self.watermark(t, slot)) is not None}

    def foreign_keys(self) -> list[tuple[str, str]]:
        """None: a source TRUNCATE … CASCADE names every table it emptied, which planning follows."""
        return []

    def describe(self, table: str) -> TargetTable | None:
        """Columns with their source types (each field's doc), no key and nothing required (Iceberg has neither)."""
        if table in self._creating:
            return TargetTable(table, dict(self._creating[table]), ())
        tbl = self.open(table)
        if tbl is None:
            return None
        return TargetTable(table, {f.name: _column_type(f.doc, str(f.field_type)) for f in tbl.schema().fields}, ())

    def create_table(self, table: str, columns: Sequence[tuple[str, str]], key: Sequence[str]) -> None:
        """Announced only: the Iceberg table is created by its first commit, typed from the staged Arrow data."""
        if self.open(table) is None:
            self._creating[table] = dict(columns)

    def apply_batch(self, plan: PlannedBatch, changes: BatchChanges) -> BatchResult:
        """Each table's part of the batch in one commit of its own, with its watermark (see the module docstring)."""
        where = f"batch {plan.start_lsn:X}-{plan.end_lsn:X}"
        seconds = {"stage": 0.0, "apply": 0.0}
        outcomes: dict[str, TableOutcome] = {}
        for table in plan.tables:
            if table.conflict == "strict":
                raise ApplyError(f"{table.target}: conflict 'strict' is not supported by the Iceberg target "
                                 "(it has no unique keys)")
        if plan.leaf_truncates:  # a delete by a PostgreSQL partition constraint, which Iceberg cannot evaluate
            leaf = plan.leaf_truncates[0]
            raise ApplyError(f"{where}: TRUNCATE of leaf partition {leaf.source} routed to {leaf.target} is not "
                             "supported by the Iceberg target (leaves: route_to_root is for PostgreSQL targets)")
        truncates: dict[str, list[PlannedTruncate]] = {}
        for t in plan.truncates:
            truncates.setdefault(t.target, []).append(t)
        for table in plan.tables:
            if self._at(table.target, plan.end_lsn, plan.slot):
                continue  # committed by an earlier (crashed or racing) run
            if self.mode == "mirror":
                outcomes[table.target] = self._mirror(table, plan, changes, seconds)
                continue
            started = time.monotonic()
            changelog.check_names(table.target, table.columns)
            rows = unwrap(stream.arrow(changes.published(table).transform(changelog.to_changelog(table.columns))),
                          f"{where}: {table.target}", changelog.LSN)
            rows = changelog.with_truncates(rows, truncates.get(table.target, []))
            seconds["stage"] += time.monotonic() - started
            started = time.monotonic()
            outcomes[table.target] = self.append_changes(
                table.target, plan.start_lsn, plan.end_lsn, rows, type_names=table.type_names())
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

    def _mirror(self, table: PlannedTable, plan: PlannedBatch, changes: BatchChanges,
                seconds: dict[str, float]) -> TableOutcome:
        """One table's net changes in one commit: streamed bucket by bucket from Spark (``lake/stream.py``) when
        ``chunk_rows`` is set, the table-batch staged more changes than that (or does not say how many) and no change
        needs the whole table's changes (``apply_net_stream``), else collected whole (the reference). A table-batch
        the direct path covers and that would be collected whole is read from its staged files instead
        (``lake/direct.py``: no Spark); one it nets in this process and that would not be collected whole (or is
        netted in key partitions) is streamed into the same commit from its spill files instead of Spark's buckets
        (``lake/parts.py``; several schema versions in their union), unless it has no published change."""
        def streamed(net: stream.NetChunks, summary: stream.NetSummary) -> TableOutcome:
            where = f"batch {plan.start_lsn:X}-{plan.end_lsn:X}"
            chunks = net.pieces(self.chunk_rows or summary.rows)
            try:
                started = time.monotonic()
                first = lake_net.prepared(table, next(chunks), where, self.lake)
                seconds["stage"] += time.monotonic() - started
                started = time.monotonic()
                self.follow_schema(table, first, where)
                outcome = self.apply_net_stream(
                    table.target, plan.start_lsn, plan.end_lsn, first,
                    (lake_net.prepared(table, c, where, self.lake) for c in chunks), rows=summary.rows,
                    kept=summary.kept, key=table.key, columns=table.columns, type_names=table.type_names(),
                    truncated=table.truncated_at is not None)
                seconds["apply"] += time.monotonic() - started
                return outcome
            finally:
                chunks.close()

        return lake_net.apply_mirror(self, table, plan, changes, seconds, (self.chunk_rows,), streamed, direct=True)

    # -- snapshots (``targets/base.SnapshotTarget``) -----------------------------------------

    def sync_marks(self, slot: str, tables: Collection[str] = ()) -> dict[str, int]:
        """``tables`` → the sync LSN of the snapshot each holds (table property ``pglogical.sync.<slot>``)."""
        out = {}
        for name in sorted(tables):
            tbl = self.open(name)
            mark = None if tbl is None else lsn_property(tbl.properties, sync_key(slot))
            if mark is not None:
                out[name] = mark
        return out

    def apply_snapshot(self, plan: PlannedSnapshot, changes: Any) -> BatchResult:
        """Each table's snapshot rows replace its rows in one commit that also sets its watermark *to* the sync LSN
        (backwards too: a resync) and records the sync LSN (``pglogical.sync.<slot>``).

        Like a batch, each table is atomic on its own, and a table whose sync mark is at ``plan.lsn`` already is
        skipped, so a re-run after a crash between tables loads the others and nothing twice.
        """
        where = f"snapshot at {format_lsn(plan.lsn)}"
        if self.mode != "mirror":
            raise ApplyError(f"{where} of {', '.join(t.target for t in plan.tables)}: an Iceberg change feed "
                             "(mode changelog) does not load snapshots; use mode mirror")
        result = BatchResult(applied=False)
        seconds = {"stage": 0.0, "apply": 0.0}
        for table in plan.tables:
            current = self.open(table.target)
            if current is not None and (lsn_property(current.properties, sync_key(plan.slot)) or -1) >= plan.lsn:
                continue  # loaded by an earlier (crashed or racing) run
            started = time.monotonic()
            rows = unwrap(stream.arrow(changes.rows(table)), f"{where}: {table.target}")
            seconds["stage"] += time.monotonic() - started
            started = time.monotonic()
            types = table.type_names()
            schema = iceberg_schema(rows.select(list(table.columns)).schema, types)
            converted = to_iceberg(rows.select(list(table.columns)), schema, f"{where}: {table.target}", types)
            tbl = self._table(table.target, schema, where, types)
            props = _summary(plan.slot, plan.lsn, plan.lsn, [])
            props["pglogical.snapshot"] = "true"
            tx = tbl.transaction()
            if tbl.current_snapshot() is not None:
                _delete_all(tx, props)
            if converted.num_rows:
                tx.append(_as_table(converted, tbl), snapshot_properties=props)
            tx.set_properties({watermark_key(plan.slot): str(plan.lsn), sync_key(plan.slot): str(plan.lsn)})
            self._commit(tx, table.target)
            seconds["apply"] += time.monotonic() - started
            result.applied = True
            result.rows[table.target] = {"snapshot_rows": converted.num_rows}
        result.seconds = {k: round(v, 3) for k, v in seconds.items()}
        return result

    # -- schema ------------------------------------------------------------------------------

    def follow_schema(self, table: PlannedTable, data: pa.Table, where: str) -> None:
        """The planned source schema changes (``apply/schema_changes.py``) on the Iceberg table, before its data.

        Iceberg evolves a schema in place: a new column is added (nullable, typed like the staged values, its source
        type as the field's doc); a lossless widening Iceberg can promote (``integer`` → ``bigint``, ``real`` →
        ``double precision``, ``numeric(10,2)`` → ``numeric(12,2)``) changes the column's type, one the Iceberg
        type already holds (``varchar(5)`` → ``text``) only its doc; a widening Iceberg cannot promote (a decimal's
        scale) stops with ``SchemaChangeError``. In mirror mode the rows already in the table get the source's
        ``ADD COLUMN … DEFAULT`` (integer, float, numeric, text, boolean, ISO date), as in the Delta target. Each is a
        commit of its own without a watermark, before the batch's commit: a re-run finds it done.
        """
        changes = [c for c in table.column_changes if c.kind in (ADD, WIDEN)]
        tbl = self.open(table.target) if changes else None
        if tbl is None:
            return
        have = {f.name for f in tbl.schema().fields}
        types = table.type_names()
        for ch in changes:
            wanted = iceberg_schema(data.select([ch.column]).schema, types).field(0)
            fld = documented(pa.schema([wanted]), {ch.column: ch.new_type}).field(0)
            added = ch.kind == ADD and ch.column not in have
            if not added and ch.column in have and _changes_scale(tbl.schema().find_field(ch.column).field_type,
                                                                   wanted.type):
                raise _cannot_widen(table.target, ch, str(tbl.schema().find_field(ch.column).field_type),
                                    f"decimal({wanted.type.precision}, {wanted.type.scale})")
            if added:
                log.info("%s: adding column %s (%s) to Iceberg table %s", where, ch.column, ch.new_type, table.target)
            try:
                with tbl.update_schema() as update:
                    update.union_by_name(pa.schema([fld]))
            except ApplyError:
                raise
            except Exception as exc:  # pyiceberg's ValidationError/ResolveError: a promotion Iceberg does not allow
                raise _cannot_widen(table.target, ch, str(tbl.schema().find_field(ch.column).field_type),
                                    str(wanted.type)) from exc
            tbl = self.open(table.target) or tbl
            fill = _default_array(wanted.type, ch.default) if added and self.mode == "mirror" else None
            if fill is not None and tbl.current_snapshot() is not None:
                # Rows older than the source's ADD COLUMN … DEFAULT read the default there: so do they here.
                rows = tbl.scan().to_arrow()
                if rows.num_rows:
                    i = rows.schema.get_field_index(ch.column)
                    value = pa.repeat(fill[0], rows.num_rows).cast(rows.schema.field(i).type)
                    rows = rows.set_column(i, rows.schema.field(i), value)
                    tx = tbl.transaction()
                    _delete_all(tx, {})
                    tx.append(rows)
                    tx.commit_transaction()

    # -- Arrow level -----------------------------------------------------------------------

    def watermark(self, target: str, slot: str | None = None) -> int | None:
        tbl = self.open(target)
        return None if tbl is None else lsn_property(tbl.properties, watermark_key(slot or self.slot))

    def _at(self, target: str, end_lsn: int, slot: str | None = None) -> bool:
        mark = self.watermark(target, slot)
        return mark is not None and mark >= end_lsn

    def _table(self, target: str, schema: pa.Schema, where: str,
               type_names: Mapping[str, str | None] | None = None) -> Table:
        """The target table, created (with its partition spec) when missing; a replicated column it lacks is an
        error (a column the source added was added by ``follow_schema`` already)."""
        tbl = self.open(target)
        if tbl is None:
            tbl = self._create(target, documented(schema, type_names or {}), where)
        missing = sorted(set(schema.names) - {f.name for f in tbl.schema().fields})
        if missing:
            raise ApplyError(f"Iceberg table {target} is missing replicated column(s) {', '.join(missing)}")
        return tbl

    def _create(self, target: str, schema: pa.Schema, where: str) -> Table:
        from pyiceberg.catalog import Catalog
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.schema import assign_fresh_schema_ids
        from pyiceberg.transforms import IdentityTransform

        parts = list(self.partition_by.get(target, ()))
        unknown = sorted(set(parts) - set(schema.names))
        if unknown:
            raise ApplyError(f"partition column(s) {', '.join(unknown)} of {target} are not replicated columns")
        log.info("%s: creating Iceberg table %s (%s)", where, target, self.mode)
        # pyiceberg converts Arrow schemas; its conversion is a static helper of the catalog.
        fresh = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))
        spec = PartitionSpec(*[PartitionField(source_id=fresh.find_field(c).field_id, field_id=1000 + i,
                                              transform=IdentityTransform(), name=c) for i, c in enumerate(parts)])
        identifier = self.location.identifier(target)
        self.catalog.create_namespace_if_not_exists(identifier[:-1])
        properties = {**TABLE_PROPERTIES, **self.location.table_properties,
                      "comment": f"pglogical {self.mode} of slot {self.slot}"}
        tbl = self.catalog.create_table_if_not_exists(identifier, schema=fresh, partition_spec=spec,
                                                      properties=properties)
        self._creating.pop(target, None)
        return tbl

    def _convert(self, table: pa.Table, columns: Sequence[str], key: Sequence[str], where: str,
                 type_names: Mapping[str, str | None]) -> tuple[pa.Table, pa.Schema]:
        schema = iceberg_schema(table.select(list(columns)).schema, type_names)
        out = to_iceberg(table, schema, where, type_names, lsn_column=LSN)
        if FROM in out.column_names and key:  # the old key, typed like the key columns (replay compares them)
            from_type = pa.struct([schema.field(k) for k in key])
            col = out.column(FROM)
            out = out.set_column(out.column_names.index(FROM), FROM, pa.chunked_array(
                [convert_array(c, from_type, FROM, where, lake=ICEBERG) for c in col.chunks], type=from_type))
        return out, schema

    def _commit(self, tx: Transaction, target: str) -> None:
        """The one catalog commit of a table's batch, between the two crash points."""
        self.checkpoint("before_commit", target)
        try:
            tx.commit_transaction()
        except Exception as exc:
            from pyiceberg.exceptions import CommitFailedException

            if isinstance(exc, CommitFailedException):
                raise ApplyError(f"{target}: the Iceberg commit lost a race with another writer (another apply of "
                                 "this slot?); nothing of this batch was committed to it — run again") from exc
            raise
        self.checkpoint("committed", target)

    def apply_net(self, target: str, start_lsn: int, end_lsn: int, net: pa.Table, *, key: Sequence[str],
                  columns: Sequence[str], type_names: Mapping[str, str | None], truncated: bool,
                  unchanged_toast: str = "fail", ordered: Callable[[], pa.Table] | None = None,
                  null_safe_key: bool = False) -> TableOutcome:
        """Mirror mode: the batch's net changes of ``target`` (and a truncate before them) in one commit.

        ``null_safe_key`` is the Delta target's (``lake/net.py``): keys here always match NULL to NULL
        (``mirror.key_mask``), so REPLICA IDENTITY FULL keys need nothing more."""
        where = f"batch {start_lsn:X}-{end_lsn:X}"
        converted, schema = self._convert(net, columns, key, f"{where}: {target}", type_names)
        tbl = self._table(target, schema, where, type_names)
        if (lsn_property(tbl.properties, watermark_key(self.slot)) or -1) >= end_lsn:
            return TableOutcome(committed=False)
        if not key:  # keyless (insert-only): its INSERTs appended, nothing to match
            props = _summary(self.slot, start_lsn, end_lsn, [])
            tx = tbl.transaction()
            if truncated and tbl.current_snapshot() is not None:
                _delete_all(tx, props)
            rows = converted.select(list(columns))
            if rows.num_rows:
                tx.append(_as_table(rows, tbl), snapshot_properties=props)
            tx.set_properties({watermark_key(self.slot): str(end_lsn)})
            self._commit(tx, target)
            return TableOutcome(committed=True, rows={"inserted": rows.num_rows})
        touched = set(merge_rules.key_tuples(converted, key))
        replayed = False
        changes = None
        if merge_rules.needs_replay(converted):
            if ordered is None:
                raise ApplyError(f"{where}: {target} needs its ordered changes to place moved unchanged-TOAST values")
            changes, _ = self._convert(ordered(), columns, key, f"{where}: {target}", type_names)
            touched |= set(merge_rules.key_tuples(changes, key))
            touched |= {f for f in merge_rules.from_tuples(changes, key) if f}
        files = [] if truncated else list(_files_holding(tbl, key, touched))  # read again for the rewrite below
        table_columns = [f.name for f in tbl.schema().fields]
        empty = tbl.schema().as_arrow().empty_table()
        base = _rows_at(files, key, touched, empty)
        if changes is not None:
            written = base.select(list(columns)).cast(converted.select(list(columns)).schema)
            converted, rejects = merge_rules.replay_net(changes, written, key, columns, where=where, target=target,
                                                        unchanged_toast=unchanged_toast)
            replayed = True
        plan = mirror.plan_net(converted, base, key, columns, table_columns, where=where, target=target,
                               unchanged_toast=unchanged_toast)
        rejects = plan.rejects if changes is None else rejects + plan.rejects
        props = _summary(self.slot, start_lsn, end_lsn, rejects)
        tx = tbl.transaction()
        if truncated and tbl.current_snapshot() is not None:
            _delete_all(tx, props)
        survivors = _drop_replaced(tx, files, key, plan.replaced, props) if plan.replaced else []
        rows = pa.concat_tables([*survivors, plan.rows]) if survivors else plan.rows
        if rows.num_rows:
            tx.append(rows, snapshot_properties=props)
        tx.set_properties({watermark_key(self.slot): str(end_lsn)})
        self._commit(tx, target)
        return TableOutcome(committed=True, rows=plan.counts, rejects=rejects, replayed=replayed)

    def apply_net_stream(self, target: str, start_lsn: int, end_lsn: int, first: pa.Table, rest: Iterator[pa.Table],
                         *, rows: int, kept: Sequence[str], key: Sequence[str], columns: Sequence[str],
                         type_names: Mapping[str, str | None], truncated: bool) -> TableOutcome:
        """``apply_net`` of net changes arriving in chunks (``first``, then ``rest``; each shaped as ``apply_net``'s
        ``net``, disjoint by key, ``rows`` in all), still in ONE commit: each chunk is converted, planned against
        the target rows at its keys (the data files that may hold them, read per chunk) and its rows added to the
        transaction; the files holding a replaced key are rewritten once, at the end. Only for net changes that need
        neither the batch order nor a kept value of an inserted row (``stream.NetSummary``); ``kept`` is the
        summary's, for the signature Delta's has (a kept value here is the base row's, per chunk). Commits nothing
        when a chunk fails to convert or the chunks hold another count than ``rows``."""
        where = f"batch {start_lsn:X}-{end_lsn:X}"
        label = f"{where}: {target}"
        converted, schema = self._convert(first, columns, key, label, type_names)
        tbl = self._table(target, schema, where, type_names)
        if (lsn_property(tbl.properties, watermark_key(self.slot)) or -1) >= end_lsn:
            return TableOutcome(committed=False)
        table_columns = [f.name for f in tbl.schema().fields]
        empty = tbl.schema().as_arrow().empty_table()
        props = _summary(self.slot, start_lsn, end_lsn, [])
        tx = tbl.transaction()
        if truncated and tbl.current_snapshot() is not None:
            _delete_all(tx, props)
        replaced: set[merge_rules.Key] = set()
        counts: dict[str, int] = {}
        seen = 0
        for chunk in itertools.chain([converted], (self._convert(c, columns, key, label, type_names)[0] for c in rest)):
            seen += chunk.num_rows
            touched = set(merge_rules.key_tuples(chunk, key))
            base = _rows_at([] if truncated else _files_holding(tbl, key, touched), key, touched, empty)
            planned = mirror.plan_net(chunk, base, key, columns, table_columns, where=where, target=target,
                                      unchanged_toast="fail")
            replaced |= planned.replaced
            for name, n in planned.counts.items():
                counts[name] = counts.get(name, 0) + n
            if planned.rows.num_rows:
                tx.append(planned.rows, snapshot_properties=props)
        if seen != rows:  # before the commit: nothing of the batch reaches the table
            raise ApplyError(f"{label}: {seen} net change(s) reached the commit, {rows} were planned")
        if replaced:
            survivors = _drop_replaced(tx, _files_holding(tbl, key, replaced), key, replaced, props)  # pre-batch files
            kept_rows = pa.concat_tables(survivors) if survivors else empty
            if kept_rows.num_rows:
                tx.append(kept_rows, snapshot_properties=props)
        tx.set_properties({watermark_key(self.slot): str(end_lsn)})
        self._commit(tx, target)
        return TableOutcome(committed=True, rows=counts)

    def truncate(self, target: str, start_lsn: int, end_lsn: int) -> TableOutcome:
        """A batch that only truncates ``target`` (mirror mode): every data file removed, with the watermark."""
        tbl = self.open(target)
        if tbl is None or (lsn_property(tbl.properties, watermark_key(self.slot)) or -1) >= end_lsn:
            return TableOutcome(committed=False)  # never created: nothing to empty, nothing to remember
        props = _summary(self.slot, start_lsn, end_lsn, [])
        snapshot = tbl.current_snapshot()
        deleted = int(snapshot.summary.get("total-records", 0) or 0) if snapshot and snapshot.summary else 0
        tx = tbl.transaction()
        if snapshot is not None:
            _delete_all(tx, props)
        tx.set_properties({watermark_key(self.slot): str(end_lsn)})
        self._commit(tx, target)
        return TableOutcome(committed=True, rows={"deleted_rows": deleted})

    def _append_truncates_only(self, name: str, start_lsn: int, end_lsn: int,
                               truncates: Sequence[PlannedTruncate]) -> TableOutcome:
        tbl = self.open(name)
        if tbl is None:
            return TableOutcome(committed=False)  # no feed yet: a truncate of nothing has no reader
        rows = changelog.with_truncates(tbl.schema().as_arrow().empty_table(), truncates)
        return self.append_changes(name, start_lsn, end_lsn, rows, type_names={})

    def append_changes(self, target: str, start_lsn: int, end_lsn: int, rows: pa.Table, *,
                       type_names: Mapping[str, str | None]) -> TableOutcome:
        """Changelog mode: the batch's published changes (and truncates) of ``target`` appended in one commit; the
        feed's schema follows the rows' (new columns, fields of ``_old``, promotions) in that same commit."""
        where = f"batch {start_lsn:X}-{end_lsn:X}"
        schema = iceberg_schema(rows.schema, type_names)
        converted = to_iceberg(rows, schema, f"{where}: {target}", type_names, lsn_column=changelog.LSN)
        tbl = self._table(target, schema.remove_metadata(), where, type_names) if self.open(target) is None \
            else self.open(target)
        assert tbl is not None
        if (lsn_property(tbl.properties, watermark_key(self.slot)) or -1) >= end_lsn:
            return TableOutcome(committed=False)
        props = _summary(self.slot, start_lsn, end_lsn, [])
        tx = tbl.transaction()
        with tx.update_schema() as update:
            update.union_by_name(documented(converted.schema, type_names))
        if converted.num_rows:
            tx.append(converted, snapshot_properties=props)
        tx.set_properties({watermark_key(self.slot): str(end_lsn)})
        self._commit(tx, target)
        return TableOutcome(committed=True, rows={"appended": converted.num_rows})


def _summary(slot: str, start_lsn: int, end_lsn: int, rejects: list[merge_rules.Reject]) -> dict[str, str]:
    """Snapshot summary properties of a batch's commit (its history; the watermark is the table property)."""
    meta = {"pglogical.slot": slot, "pglogical.start-lsn": str(start_lsn), "pglogical.end-lsn": str(end_lsn)}
    if rejects:
        meta["pglogical.rejects"] = json.dumps(rejects, default=str, sort_keys=True)
    return meta


def _delete_all(tx: Transaction, props: dict[str, str]) -> None:
    """Every data file removed (no rewrite: the filter matches whole files)."""
    from pyiceberg.expressions import AlwaysTrue

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "did not match any records" on an empty table
        tx.delete(AlwaysTrue(), snapshot_properties=props)


def _as_table(rows: pa.Table, tbl: Table) -> pa.Table:
    """``rows`` with the table's columns it lacks as NULLs (a column the batch does not write)."""
    schema = tbl.schema().as_arrow()
    missing = [f for f in schema if f.name not in rows.column_names]
    for f in missing:
        rows = rows.append_column(f.name, pa.nulls(rows.num_rows, f.type))
    return rows


def _range_filter(values: pa.Array, column: str) -> BooleanExpression:
    """A cheap filter that prunes data files by their min/max statistics: the key's range (Iceberg binds each
    literal of an ``IN`` filter in Python, which costs seconds per 100k keys; a range is two literals)."""
    from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThanOrEqual, Reference

    if values.null_count or not (pa.types.is_integer(values.type) or pa.types.is_string(values.type)
                                 or pa.types.is_decimal(values.type) or pa.types.is_date(values.type)):
        return AlwaysTrue()
    bounds = pc.min_max(values)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return And(GreaterThanOrEqual(term=Reference(column), value=low), LessThanOrEqual(term=Reference(column), value=high))


def _rows_at(files: Iterable[tuple[FileScanTask, pa.Table]], key: Sequence[str], keys: set[merge_rules.Key],
             empty: pa.Table) -> pa.Table:
    """The rows of ``files`` at ``keys`` (only those are kept of each file as it is read)."""
    return pa.concat_tables([data.filter(mirror.key_mask(data, key, keys)) for _, data in files] or [empty])


def _drop_replaced(tx: Transaction, files: Iterable[tuple[FileScanTask, pa.Table]], key: Sequence[str],
                   replaced: set[merge_rules.Key], props: dict[str, str]) -> list[pa.Table]:
    """Delete from ``tx`` the data files holding a key in ``replaced``; returns their other rows, which the caller
    appends again (copy-on-write)."""
    rewritten, survivors = [], []
    for task, data in files:
        gone = mirror.key_mask(data, key, replaced)
        if pc.any(gone).as_py():
            rewritten.append(task)
            survivors.append(data.filter(pc.invert(gone)))
    with tx.update_snapshot(snapshot_properties=props).overwrite() as overwrite:
        for task in rewritten:
            overwrite.delete_data_file(task.file)
    return survivors


def _files_holding(tbl: Table, key: Sequence[str], keys: set[merge_rules.Key]) -> Iterator[tuple[FileScanTask, pa.Table]]:
    """The current data files that may hold one of ``keys`` (pruned by the first key column's range), each read
    whole (positional deletes applied) and projected onto the current schema."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    if not keys or tbl.current_snapshot() is None:
        return
    first = pa.array([k[0] for k in keys])
    tasks = list(tbl.scan(row_filter=_range_filter(first, key[0])).plan_files())
    scan = ArrowScan(tbl.metadata, tbl.io, tbl.schema(), AlwaysTrue())
    for task in tasks:
        yield task, scan.to_table([task])


_BOOLEAN_TEXT = ("t", "f", "true", "false")


def _default_array(dtype: pa.DataType, text: str | None) -> pa.Array | None:
    """The source's ADD COLUMN default (its ``attmissingval`` text) as a one-value array of ``dtype``; None when there
    is none or the type does not convert exactly from PostgreSQL's text (the rows stay NULL, as in the Delta target:
    integers, floats, numeric, text, boolean, ISO dates)."""
    if text is None:
        return None
    if pa.types.is_boolean(dtype):
        return pa.array([text.lower() in ("t", "true")]) if text.lower() in _BOOLEAN_TEXT else None
    if pa.types.is_decimal(dtype) and text.lower() == "nan":
        return None
    if not (pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype)
            or pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_date32(dtype)):
        return None
    try:
        return pc.cast(pa.array([text]), dtype, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _changes_scale(have: object, want: pa.DataType) -> bool:
    """Whether ``want`` would change a decimal column's scale: the Iceberg spec promotes a decimal's precision only
    (pyiceberg's schema update lets a scale change through, which turns the values of existing files into others)."""
    from pyiceberg.types import DecimalType

    return isinstance(have, DecimalType) and pa.types.is_decimal(want) and want.scale != have.scale


def _cannot_widen(target: str, ch: ColumnChange, have: str, wanted: str) -> SchemaChangeError:
    lsn = ch.lsn if ch.lsn is not None else 0
    return SchemaChangeError(
        f"column {ch.column} of Iceberg table {target} widened on the source from {ch.old_type} to {ch.new_type} at "
        f"LSN {format_lsn(lsn)}: Iceberg cannot promote its type {have} to {wanted} (it promotes int → long, float → "
        "double and a decimal's precision only). Write the table anew with the wider type: read its rows with "
        "pyiceberg, drop it, create it with the cast schema and the same table properties (they hold the "
        "watermark), append the rows; then run again (docs/iceberg.md, Source schema changes)",
        table=target, column=ch.column, old_type=ch.old_type, new_type=ch.new_type, lsn=lsn)
