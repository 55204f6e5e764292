"""The target boundary: what the runner hands a target for one batch, and what a target must guarantee.

The runner (``apply/runner.py``) reads staged batches, plans each one without I/O
(``apply/planning.py``: which tables are pending against the target's watermarks, their keys and
columns, where truncates fall and in which order tables go) and hands the plan plus lazily built
Spark frames to a ``Target``. Everything about *how* a batch becomes durable is the target's:
PostgreSQL stages the frames with COPY and runs one transaction (falling back to an ordered
replay of its own); another target (Delta, Iceberg) commits by its own means. The pure transforms
(``apply/transforms.py``, ``filters.py``, ``notes.py``) are shared and know no target.

Contract of every target
------------------------
* **Watermarks.** ``watermarks(slot, tables)`` answers, per target table, the ``end_lsn`` of the last batch
  whose changes are durably in that table ({} before the first apply). The runner skips a table
  whose watermark is at or beyond a batch's ``end_lsn``.
  It may answer for more tables than ``tables`` (those the caller is about to plan), never for
  fewer of those that hold one (a target that cannot list its tables cheaply opens just these).
* **Atomic batch.** ``apply_batch`` makes a batch's truncates, net changes and the new watermarks
  of ``plan.watermark_tables`` durable together, or none of them. A crash before that point leaves
  the target as it was (staging leftovers are the target's to clean up on the next run); a crash
  after it makes the next run skip the batch. A target without multi-table transactions (Delta:
  one log per table) makes each table's part durable together with *that table's* watermark
  instead: the runner plans per table (``planning.pending_tables``), so a re-run after a crash
  between tables applies the batch to the tables not yet committed and to no other.
* **Idempotent under replay.** The same batch may be handed over again (a crash after commit,
  two runs racing, a retried Airflow task): the target re-reads its watermarks inside its
  commit protocol and returns ``BatchResult(applied=False)`` when every table of
  ``plan.watermark_tables`` is already at ``plan.end_lsn``. It never writes a batch twice and
  never moves a watermark backwards.
* **One writer per slot.** ``session(slot)`` holds whatever lock makes concurrent applies of the
  same slot into the same target fail fast (``ApplyError``) rather than interleave.
* **Errors.** Failures raise ``ApplyError`` (or a subclass) naming tables, LSNs and constraint
  names, never row values; nothing is committed then.
* **Snapshots** (optional, ``SnapshotTarget``). ``apply_snapshot`` loads a ``PlannedSnapshot`` (the tables
  snapshotted at one LSN, ``apply/snapshots.py``) atomically: empty the tables, insert the rows, set each
  table's watermark *to* the snapshot LSN (also backwards: a resync replaces a table whose changes were
  applied further) and record it as the table's sync LSN; tables whose sync LSN is already at or past it
  are skipped (idempotent under replay).
* **Direct path** (optional). Changes that can hand a table's staged files over (``DirectNetSource``,
  ``DirectRowsSource``; the rule in ``apply/direct.py``) let a target read them itself instead of the
  Spark frames; it must then produce exactly the rows ``net`` / ``rows`` would.

What a target receives is built in ``apply/changes.py`` (``SparkBatchChanges``, ``SnapshotChanges``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow.fs as pafs

from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.schema_changes import ADD, RELAX, WIDEN, ColumnChange
from airflow_provider_pglogical.apply.versions import SchemaUnion
from airflow_provider_pglogical.staging.reader import RelationInfo

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

# Columns of the frames a target receives (besides the written columns, named as in the target):
# see ``BatchChanges``. The change kind, unchanged-TOAST keep list and LSN come from transforms.
COMMIT, ORDER = "_pgl_c", "_pgl_o"  # ordered frames: commit_lsn, order in transaction


def from_column(i: int) -> str:
    """Name of the i-th column of the key a change moved away from (the old key of a key change)."""
    return f"_pgl_from_{i}"


@dataclass(frozen=True)
class TargetTable:
    """A target table as the target describes it: columns (name → the target's own type text, in
    table order), primary key, and the columns every INSERT must set (NOT NULL without a default,
    outside the primary key: a column the source dropped is relaxed so inserts keep succeeding)."""

    qualified: str
    columns: dict[str, str]
    primary_key: tuple[str, ...]
    required: tuple[str, ...] = ()

    def after(self, changes: Sequence[ColumnChange]) -> TargetTable:
        """The table as it will be once ``changes`` ran (staging and COPY text use these types)."""
        columns = dict(self.columns)
        for ch in changes:
            if ch.kind in (ADD, WIDEN) and ch.new_type is not None:
                columns[ch.column] = ch.new_type
        relaxed = {ch.column for ch in changes if ch.kind == RELAX}
        return TargetTable(self.qualified, columns, self.primary_key,
                           tuple(c for c in self.required if c not in relaxed))


@dataclass(frozen=True)
class PlannedTable:
    """One target table with row changes in a batch: what is written and how."""

    source: str  # staged schema.table
    target: str  # target schema.table
    key: tuple[str, ...]  # compacts and matches rows
    columns: tuple[str, ...]  # target columns written (key included), relation order
    relation: RelationInfo
    config: TableApplyConfig
    truncated_at: tuple[int, int] | None = None  # last truncate (commit_lsn, tx_order) in the batch
    # Source schema changes the target follows (``apply/schema_changes.py``), in the batch's
    # transaction before its truncates and rows; each target renders them in its own dialect.
    column_changes: tuple[ColumnChange, ...] = ()
    # Why an arriving UPDATE/DELETE must stop the batch (no replica identity, a row filter outside
    # it); None: they apply. Checked on the changes themselves, not up front (PostgreSQL's rule).
    update_delete_problem: str | None = None
    # Several sources into this one target (leaf partitions routed to their root's target): each part is
    # one source with its own relation, config and ``truncated_at`` (its own TRUNCATEs void only its own
    # earlier changes); their changes are unioned by column name and netted together in LSN order.
    # Empty: the table's only source is the one above.
    parts: tuple[PlannedTable, ...] = ()
    # Every staged schema version of the source in the batch, LSN order (``relation`` is the last; empty:
    # only ``relation``). ``columns`` holds the columns of all of them: a change of a version without one
    # of them leaves it alone (UPDATE) or NULL (INSERT), as a native subscriber does.
    versions: tuple[RelationInfo, ...] = ()

    def type_names(self) -> dict[str, str | None]:
        """Each written column's staged PostgreSQL type: from the last schema version that has it."""
        return {c.name: c.type_name for rel in self.versions or (self.relation,) for c in rel.columns}

    @property
    def sources(self) -> list[str]:
        """The staged tables written into this one: each part's, else its own ``source``."""
        return [part.source for part in self.parts] or [self.source]

    @property
    def conflict(self) -> str:
        return self.config.conflict

    @property
    def unchanged_toast(self) -> str:
        return self.config.unchanged_toast


@dataclass(frozen=True)
class PlannedTruncate:
    """One TRUNCATE that empties ``target`` (listed, or cascaded by the source), at its place in the batch,
    with its record's position for targets that show truncates as changes (a change feed)."""

    target: str
    commit_lsn: int
    tx_order: int
    lsn: int | None = None
    xid: int | None = None
    commit_time: datetime | None = None


@dataclass(frozen=True)
class PlannedLeafTruncate:
    """A TRUNCATE of a leaf partition routed into ``target``, which holds its siblings' rows too: it empties
    only the rows that satisfy the leaf's partition ``constraint`` (a PostgreSQL boolean expression over the
    column names, from the source's ``pg_get_partition_constraintdef``). Keys include the partition key, so
    only the leaf's own changes touch those rows; its changes up to the truncate are void (its part's
    ``truncated_at``), and the delete runs with the batch's truncates, before any row change."""

    target: str
    source: str
    constraint: str
    commit_lsn: int
    tx_order: int
    lsn: int | None = None


@dataclass(frozen=True)
class PlannedBatch:
    """Everything a target needs to apply one batch, decided without I/O."""

    slot: str
    start_lsn: int
    end_lsn: int
    tables: tuple[PlannedTable, ...]  # parents before children (FKs)
    truncate: tuple[str, ...] = ()  # target tables emptied by the batch, parents first
    restart_identity: tuple[str, ...] = ()  # subset of ``truncate`` whose owned sequences restart
    watermark_tables: tuple[str, ...] = ()  # every target table whose watermark moves to end_lsn
    # Every truncate emptying a table of ``truncate`` (not only its last), in (commit_lsn, tx_order) order.
    truncates: tuple[PlannedTruncate, ...] = ()
    # Leaf partitions' TRUNCATEs in a shared target (each a delete by partition constraint), in LSN order.
    leaf_truncates: tuple[PlannedLeafTruncate, ...] = ()


@dataclass(frozen=True)
class PlannedSnapshot:
    """Tables snapshotted at one LSN, to be loaded together (parents first, FKs among them fine)."""

    slot: str
    lsn: int
    tables: tuple[PlannedTable, ...]


@dataclass
class BatchResult:
    applied: bool  # False: nothing was pending (already applied, e.g. by a concurrent run)
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # target -> counters
    ordered: bool = False  # applied change by change in commit order rather than set-based
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> wall time


@dataclass
class BatchReport:
    """What the runner reports per batch (or snapshot group) it handed to a target."""

    start_lsn: int
    end_lsn: int
    applied: bool
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    # "stage" (Spark + COPY), "apply" (transaction); after a fallback also "stage_ordered", "apply_ordered"
    seconds: dict[str, float] = field(default_factory=dict)
    ordered: bool = False  # applied change by change in commit order (the set-based apply could not)


class BatchChanges(Protocol):
    """A batch's changes as Spark frames, built only when a target asks (planning reads no rows).

    ``net(table)``: one net change per key — ``KIND`` (I, U, D, R), ``KEEP`` (columns whose value must
    come from the target: unchanged TOAST, and columns an UPDATE's schema version lacks), ``LSN``, ``from_column(i)`` for the moved-from key,
    ``TOUCHED``, then ``table.columns``. ``ordered(table)``: every change after the last truncate,
    un-netted — ``KIND``, ``KEEP``, ``LSN``, ``COMMIT``, ``ORDER``, ``from_column(i)``, then
    ``table.columns`` — for targets that must replay in commit order. ``published(table)``: every
    change as the publication sends it (actions, row filter with its UPDATE→INSERT/DELETE transforms,
    column list), *before* any truncate too and not netted — the staged columns prefixed with
    ``meta.META`` (``_pgl_op`` I/U/D, ``_pgl_commit_lsn``, ``_pgl_tx_order``, ``_pgl_lsn``,
    ``_pgl_xid``, ``_pgl_commit_time``, ``_pgl_old``, ``_pgl_old_key_only``, ``_pgl_new`` with only
    ``table.columns``, ``_pgl_new_unchanged_toast``) — for targets that keep every change (a change feed).

    Values with exactness notes (``apply/notes.py``) arrive folded as ``struct<_pgl_value, _pgl_note…>``
    in every frame; a target that cannot hold a note refuses it (naming table, column and LSN).
    """

    def net(self, table: PlannedTable) -> DataFrame: ...

    def ordered(self, table: PlannedTable) -> DataFrame: ...

    def published(self, table: PlannedTable) -> DataFrame: ...


class Target(Protocol):
    """A place staged changes are applied to (see the module docstring for the contract)."""

    def session(self, slot: str) -> AbstractContextManager[None]:
        """Open the target for a run over ``slot``: lock it against concurrent applies, create bookkeeping."""
        ...

    def watermarks(self, slot: str, tables: Collection[str]) -> dict[str, int]:
        """Target table → end LSN of the last batch durably applied to it, for (at least) ``tables``."""
        ...

    def foreign_keys(self) -> list[tuple[str, str]]:
        """(child, parent) pairs between target tables, for truncate cascades and apply order ([] if none)."""
        ...

    def describe(self, table: str) -> TargetTable | None:
        """The table's columns and key, or None when it does not exist."""
        ...

    def create_table(self, table: str, columns: Sequence[tuple[str, str]], key: Sequence[str]) -> None:
        """Create ``table`` (if missing) with ``columns`` as (name, PostgreSQL type text of the source)."""
        ...

    def apply_batch(self, plan: PlannedBatch, changes: BatchChanges) -> BatchResult:
        """Truncates, net changes and watermarks of one batch, atomically and idempotently."""
        ...


@runtime_checkable
class SnapshotTarget(Protocol):
    """What a target adds to ``Target`` to load snapshots (see the module docstring)."""

    def sync_marks(self, slot: str, tables: Collection[str] = ()) -> dict[str, int]:
        """Target table → sync LSN of the snapshot it holds, for (at least) ``tables`` ({} when none was
        loaded; a target that cannot list its tables cheaply opens just these)."""
        ...

    def apply_snapshot(self, plan: PlannedSnapshot, changes: Any) -> BatchResult:
        """Empty the tables, insert the rows, watermark := sync LSN := ``plan.lsn``, atomically."""
        ...


@dataclass(frozen=True)
class Cut:
    """Where a table-batch's changes start for its target: the staged changes at or before ``truncated_at``, the
    table's last truncate in the batch as (commit LSN, order in transaction), are void (``transforms.void_before``),
    and those committed before ``sync_lsn``, the sync LSN of the snapshot the target holds, are in the snapshot
    (``SparkBatchChanges``); None: no such bound. ``direct.after_cut`` keeps the rest."""

    truncated_at: tuple[int, int] | None = None
    sync_lsn: int | None = None


@dataclass(frozen=True)
class DirectNet:
    """One table-batch's staged files (absolute local paths) whose rows map one-to-one to net changes
    (``apply/direct.py``); ``columns`` are the written columns (``PlannedTable.columns``), ``key`` its key.
    ``compacted``: the rows are netted together in one piece instead (``direct.compacted_rows``: repeated keys,
    unchanged TOAST, a row filter or an action left out), ``identity`` the source's replica identity columns that
    refill needs, ``row_filter`` and ``actions`` the publication's (evaluated in process, ``apply/published.py``),
    ``partitions`` how many key partitions it is netted in (``direct.compacted_batches``), ``cut`` the changes
    that count (``Cut``: after the table's last truncate in the batch and its snapshot's sync LSN)."""

    source: str
    target: str
    files: tuple[str, ...]
    key: tuple[str, ...]
    columns: tuple[str, ...]
    compacted: bool = False
    identity: tuple[str, ...] = ()
    # A compacted table-batch's publication, applied per change before netting (``apply/published.py``).
    row_filter: str | None = None
    actions: tuple[str, ...] = ("insert", "update", "delete")
    # The staging area's filesystem ``files`` are paths of (an object store's, with its credentials); None: local.
    filesystem: pafs.FileSystem | None = field(default=None, compare=False, repr=False)
    # A compacted table-batch above the in-memory bounds is netted in this many key partitions spilled to disk
    # (``apply/partitioned.py``); 1: in one piece.
    partitions: int = 1
    # The changes before it are left out as they are read (a truncate or a snapshot inside the batch); None: all.
    cut: Cut | None = None
    # A compacted table-batch staged under several schema versions: their union (``apply/versions.py``), each file
    # put in its layout as it is read; None: one schema version.
    union: SchemaUnion | None = None


@dataclass(frozen=True)
class DirectRows:
    """A snapshot table's staged files whose rows are their ``new`` images as they are (``DirectRowsSource``):
    ``files`` are paths of ``filesystem`` (the staging area's; None: local paths)."""

    files: tuple[str, ...]
    filesystem: pafs.FileSystem | None = field(default=None, compare=False, repr=False)


@runtime_checkable
class DirectNetSource(Protocol):
    """``BatchChanges`` that can hand a table-batch's staged files to a target (``direct_net``)."""

    def direct_net(self, table: PlannedTable) -> DirectNet | None: ...


@runtime_checkable
class StagedRowsSource(Protocol):
    """``BatchChanges`` that know, from the manifest and without reading a row, how many changes a table-batch
    staged (``staged_rows``: an upper bound of its net changes)."""

    def staged_rows(self, table: PlannedTable) -> int: ...


@runtime_checkable
class StagedTypesSource(Protocol):
    """Changes that know each written column's staged Arrow type from the staged files' footers, reading no row
    (``staged_types``): what a target checks before its first commit of a batch or snapshot."""

    def staged_types(self, table: PlannedTable) -> dict[str, pa.DataType]: ...


@runtime_checkable
class DirectRowsSource(Protocol):
    """Snapshot changes that can hand a table's staged snapshot files to a target (``direct_rows``): their
    rows are the ``new`` images as they are (``SnapshotChanges.rows``' plain case)."""

    def direct_rows(self, table: PlannedTable) -> DirectRows | None: ...
