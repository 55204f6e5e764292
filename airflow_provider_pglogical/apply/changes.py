"""What a target receives for a batch or a snapshot group: its changes as Spark frames built on demand.

``published_changes`` → ``net_changes`` / ``ordered_changes`` chain the shared pure transforms
(``transforms.py``, ``filters.py``, ``notes.py``) over one table's staged changes; ``SparkBatchChanges``
(a staged batch) and ``SnapshotChanges`` (a snapshot group: INSERT-only frames) are the ``BatchChanges`` of
``targets/base.py`` built from them, and hand over staged files where the direct path's rule
(``direct.py``) allows. Nothing here knows a target or reads more than the staged files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import reduce

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply import direct, planning
from airflow_provider_pglogical.apply.batches import (
    CHANGE_META_COLUMNS,
    META,
    NOTES_COLUMNS,
    Batch,
    has_unchanged_toast,
    has_value_notes,
    image_type,
    keys_never_repeat,
    read_changes,
    read_local_parquet,
    staged_image_types,
)
from airflow_provider_pglogical.apply.config import ACTIONS, TableApplyConfig
from airflow_provider_pglogical.apply.filters import apply_row_filter
from airflow_provider_pglogical.apply.notes import fold_notes, inherit_toast_notes
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.sparkenv import quoted_all
from airflow_provider_pglogical.apply.targets.base import (
    COMMIT,
    ORDER,
    DirectNet,
    DirectRows,
    PlannedTable,
    from_column,
)
from airflow_provider_pglogical.apply.transforms import (
    FROM,
    KEEP,
    KIND,
    LSN,
    SEQ,
    TOUCHED,
    compact,
    filter_actions,
    first_update_or_delete,
    no_unchanged_toast,
    project_columns,
    resolve_toast_from_old,
    single_event_net,
    to_appends,
    to_key_events,
    to_ordered_changes,
    void_before,
)
from airflow_provider_pglogical.exceptions import ApplyError
from airflow_provider_pglogical.staging.layout import resolve_filesystem
from airflow_provider_pglogical.staging.reader import RelationInfo


def published_changes(df: DataFrame, rel: RelationInfo, cfg: TableApplyConfig, shape: planning.TableShape,
                      notes: bool = True, toast: bool = True) -> DataFrame:
    """Staged changes of one table as the publication sends them: actions, TOAST refill, row filter, column list.

    ``notes=False`` (the batch has no exactness notes for this table) leaves out carrying them;
    ``toast=False`` (no staged image lists an unchanged-TOAST column) the TOAST refill, which then
    changes nothing. A column list of every column in image order projects nothing either (when no
    image carries notes). Both steps rebuild the images as structs that every later step's expression
    would repeat.
    """
    all_columns = image_type(df, "new").fieldNames()
    df = df.transform(filter_actions(cfg.actions))
    if notes:
        df = df.transform(inherit_toast_notes)
    if toast:
        df = df.transform(resolve_toast_from_old(all_columns, rel.identity_columns))
    else:
        df = df.transform(no_unchanged_toast)
    df = df.transform(apply_row_filter(cfg.row_filter, all_columns))
    if notes:
        df = df.transform(fold_notes)  # after the filter, which needs the typed values
    if not notes and list(shape.columns) == all_columns:
        return df  # images carrying notes keep the projection's rebuilt structs, the shape the targets collect
    return df.transform(project_columns(shape.columns))


def net_changes(df: DataFrame, rel: RelationInfo, cfg: TableApplyConfig, shape: planning.TableShape,
                truncated_at: tuple[int, int] | None, notes: bool = True, unique_keys: bool = False,
                toast: bool = True) -> DataFrame:
    """Staged changes of one table → one net change per key (the whole pure pipeline).

    ``unique_keys``: no key occurs in two staged changes (``keys_never_repeat``), so every event is
    already its key's net change and ``single_event_net`` replaces the shuffle of ``compact``.
    """
    net = single_event_net if unique_keys else compact
    if not shape.key:  # keyless (insert-only): every INSERT is its own row
        return published_changes(df, rel, cfg, shape, notes, toast).transform(to_appends(shape.columns)) \
            .transform(void_before(truncated_at))
    return (published_changes(df, rel, cfg, shape, notes, toast)
            .transform(to_key_events(shape.key, shape.columns))
            .transform(void_before(truncated_at))
            .transform(net(shape.key, shape.columns)))


def ordered_changes(df: DataFrame, rel: RelationInfo, cfg: TableApplyConfig, shape: planning.TableShape,
                    truncated_at: tuple[int, int] | None, notes: bool = True, toast: bool = True) -> DataFrame:
    """Staged changes of one table → every change after the last truncate, un-netted, for the ordered replay."""
    if not shape.key:
        return net_changes(df, rel, cfg, shape, truncated_at, notes, toast=toast)
    return (published_changes(df, rel, cfg, shape, notes, toast)
            .transform(to_ordered_changes(shape.key, shape.columns))
            .transform(void_before(truncated_at)))


class SparkBatchChanges:
    """``BatchChanges`` of one staged batch: frames built from the shared pure transforms on demand.

    ``sync``: source table → sync LSN of the snapshot its target holds. A batch starting before it
    keeps only the table's changes with ``commit_lsn >= sync LSN`` (worker.c
    ``should_apply_changes_for_rel``: applied when the sync LSN ≤ the transaction's final LSN, the
    start of its commit record, which is the staged ``commit_lsn``); earlier ones are in the snapshot.
    A session on demand (``spark_on_demand.py``) starts when the first frame is built: ``direct_net`` needs none.
    """

    def __init__(self, spark: SparkSession | SparkOnDemand, batch: Batch,
                 sync: Mapping[str, int] | None = None) -> None:
        self.on_demand = SparkOnDemand.of(spark)
        self.batch = batch
        self.sync = dict(sync or {})

    @property
    def spark(self) -> SparkSession:
        return self.on_demand.session()

    def _staged(self, table: PlannedTable) -> tuple[DataFrame, bool, list[Column]]:
        changes = read_changes(self.spark, self.batch, table.source)
        sync_lsn = self.sync.get(table.source)
        if sync_lsn is not None and self.batch.start_lsn < sync_lsn:
            changes = changes.where(F.col(META + "commit_lsn") >= F.lit(sync_lsn))
        notes = has_value_notes(self.batch, table.source)
        from_key = [F.col(FROM).getField(k).alias(from_column(i)) for i, k in enumerate(table.key)]
        return changes, notes, from_key

    def _toast(self, table: PlannedTable) -> bool:
        """Whether the table's staged changes list unchanged-TOAST columns (else no TOAST refill is planned). Images
        carrying exactness notes keep the refill's rebuilt structs, which is the shape the targets collect them in."""
        return has_value_notes(self.batch, table.source) or has_unchanged_toast(self.batch, table.source)

    def staged_types(self, table: PlannedTable) -> dict[str, pa.DataType]:
        """Each column's staged Arrow type (``StagedTypesSource``): the footers of the table's sources' files."""
        return staged_image_types(self.on_demand, self.batch, table.sources)

    def staged_rows(self, table: PlannedTable) -> int:
        """Changes the manifest records for the table's sources (``StagedRowsSource``): no row is read."""
        return sum(int(self.batch.manifest.tables.get(source, {}).get("rows", 0)) for source in table.sources)

    def net(self, table: PlannedTable) -> DataFrame:
        """Net changes; first, an UPDATE/DELETE the table cannot apply stops the batch (``check_updates_deletes``).
        The ordered replay follows only a set-based attempt, so ``ordered`` needs no check of its own.

        A table of several sources (``table.parts``: routed leaf partitions) unions their key events by
        column name, each part voided by its own truncates, and nets them together in LSN order."""
        if table.parts:
            events = []
            for part in table.parts:
                changes, notes, _ = self._staged(part)
                shape = planning.TableShape(part.source, part.target, part.key, part.columns, part.update_delete_problem)
                if shape.update_delete_problem:
                    check_updates_deletes(changes, part.relation, part.config, shape, self.batch)
                published = published_changes(changes, part.relation, part.config, shape, notes, self._toast(part))
                events.append(published.transform(to_appends(part.columns) if not part.key
                                                  else to_key_events(part.key, part.columns))
                              .transform(void_before(part.truncated_at)))
            union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), events)
            if table.key:
                union = union.transform(compact(table.key, table.columns))
            from_key = [F.col(FROM).getField(k).alias(from_column(i)) for i, k in enumerate(table.key)]
            return union.select(KIND, KEEP, LSN, *from_key, TOUCHED, *quoted_all(table.columns))
        changes, notes, from_key = self._staged(table)
        shape = planning.TableShape(table.source, table.target, table.key, table.columns, table.update_delete_problem)
        if shape.update_delete_problem:
            check_updates_deletes(changes, table.relation, table.config, shape, self.batch)
        # Decided here, not in a target: every target's net frame skips compaction's shuffle then.
        unique = bool(table.key) and keys_never_repeat(self.batch, table.source, table.key,
                                                       full_identity=table.relation.replica_identity == "f")
        return (net_changes(changes, table.relation, table.config, shape, table.truncated_at, notes, unique,
                            self._toast(table))
                .select(KIND, KEEP, LSN, *from_key, TOUCHED, *quoted_all(table.columns)))

    def direct_net(self, table: PlannedTable) -> DirectNet | None:
        """The table-batch's staged files when its net changes need none of the shared transforms
        (``direct.batch_files``): a target may print them itself; None means ``net``."""
        return direct.batch_files(table, self.batch, self.sync.get(table.source))

    def published(self, table: PlannedTable) -> DataFrame:
        if table.parts:  # routed leaves: unioned by name (images' fields too)
            return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True),
                          [self.published(part) for part in table.parts])
        changes, notes, _ = self._staged(table)
        shape = planning.TableShape(table.source, table.target, table.key, table.columns)
        return published_changes(changes, table.relation, table.config, shape, notes, self._toast(table))

    def ordered(self, table: PlannedTable) -> DataFrame:
        if table.parts:  # routed leaves: every part's changes, unioned by column name (merged by position later)
            frames = [self.ordered(replace(part, columns=tuple(c for c in table.columns if c in part.columns)))
                      for part in table.parts]
            union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
            return union.select(KIND, KEEP, LSN, COMMIT, ORDER, *[from_column(i) for i in range(len(table.key))],
                                *quoted_all(table.columns))
        changes, notes, from_key = self._staged(table)
        shape = planning.TableShape(table.source, table.target, table.key, table.columns)
        return (ordered_changes(changes, table.relation, table.config, shape, table.truncated_at, notes,
                                self._toast(table))
                .select(KIND, KEEP, LSN, F.col(SEQ).getField("c").alias(COMMIT),
                        F.col(SEQ).getField("o").alias(ORDER), *from_key, *quoted_all(table.columns)))


def check_updates_deletes(changes: DataFrame, rel: RelationInfo, cfg: TableApplyConfig, shape: planning.TableShape,
                          batch: Batch) -> None:
    """Stop the batch, naming table and LSN, when an UPDATE/DELETE arrives that the table cannot apply.

    Judged on published actions (an unpublished UPDATE never arrives natively either); insert-only
    traffic passes. ``RowFilterError`` for the filter rule, ``ReplicaIdentityError`` otherwise.
    """
    count, lsn = first_update_or_delete(changes.transform(filter_actions(cfg.actions)))
    if count:
        raise planning.update_delete_error(rel, shape.source, shape.update_delete_problem or "", count, lsn,
                                           batch.start_lsn, batch.end_lsn)


def read_snapshot(spark: SparkSession, uri: str, files: Sequence[str]) -> DataFrame:
    """A snapshot's rows with the columns of ``batches.read_changes`` (they have the row-change schema)."""
    df = read_local_parquet(spark, uri, files)
    return df.select(*[df[c].alias(META + c) for c in CHANGE_META_COLUMNS],
                     *[df[c].alias(META + c) for c in NOTES_COLUMNS])


@dataclass(frozen=True)
class SnapshotFiles:
    """One table's published snapshot as the apply reads it."""

    uri: str  # the snapshot directory as a URI Spark reads
    files: tuple[str, ...]  # chunk files, relative to ``uri``
    row_filter: str | None = None  # the filter the source evaluated (manifest ``row_filter``)
    has_notes: bool = True  # whether any value carries an exactness note (then values are folded)
    # The staging area's filesystem and the directory's path in it (``SnapshotLayout``: the credentials resolved
    # once), for this process's own reads (``direct.snapshot_files``); None: the URI's own.
    filesystem: pafs.FileSystem | None = dataclasses.field(default=None, compare=False, repr=False)
    path: str | None = None

    def staged_in(self) -> tuple[pafs.FileSystem, str] | None:
        """The staging area's filesystem and the directory's path in it; None when not given."""
        return (self.filesystem, self.path) if self.filesystem and self.path else None

    def located(self) -> tuple[pafs.FileSystem, str]:
        """The filesystem and path this process reads the files through: the staging area's, else the URI's."""
        return self.staged_in() or resolve_filesystem(self.uri)


class SnapshotChanges:
    """``BatchChanges`` of a snapshot group: the shared pure transforms over INSERT-only frames, and
    ``rows``, the plain rows a target loads into an emptied table. A session on demand starts when the first
    frame is built: ``direct_rows`` needs none."""

    def __init__(self, spark: SparkSession | SparkOnDemand,
                 uris: Mapping[str, SnapshotFiles | tuple[str, tuple[str, ...]]]) -> None:
        self.on_demand = SparkOnDemand.of(spark)
        self.uris = {t: u if isinstance(u, SnapshotFiles) else SnapshotFiles(u[0], tuple(u[1]))
                     for t, u in uris.items()}  # source table → its snapshot files

    @property
    def spark(self) -> SparkSession:
        return self.on_demand.session()

    def rows(self, table: PlannedTable) -> DataFrame:
        """The snapshot's rows with exactly ``table.columns`` (staged types), one per target row.

        Snapshot rows are INSERTs already filtered and column-listed on the source, without old image
        or unchanged-TOAST marks, and a primary-key / replica-identity key occurs once: when no value
        carries an exactness note and the source evaluated the table's configured row filter, they are
        the ``new`` images as they are — no transform, no shuffle. Otherwise they are the columns of
        ``net`` (the shared transforms: notes folded, the filter evaluated again, repeating keys netted).
        """
        if table.parts:  # a routed partitioned table: every leaf's rows, unioned by column name
            frames = [self.rows(part) for part in table.parts]
            union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
            return union.select(*quoted_all(table.columns))
        snap = self.uris[table.source]
        if not self._plain(table, snap):
            return self.net(table).select(*quoted_all(table.columns))
        df = read_local_parquet(self.spark, snap.uri, snap.files)
        return df.select(*[df["new"].getField(c).alias(c) for c in table.columns])

    def staged_types(self, table: PlannedTable) -> dict[str, pa.DataType]:
        """Each column's staged Arrow type (``StagedTypesSource``): the footer of each source's first chunk file (a
        snapshot's chunks share one schema)."""
        out: dict[str, pa.DataType] = {}
        for source in table.sources:
            snap = self.uris[source]
            if not snap.files:
                continue
            fs, root = snap.located()
            for field in pq.read_schema(f"{root}/{snap.files[0]}", filesystem=fs).field("new").type:
                out.setdefault(field.name, field.type)
        return out

    @staticmethod
    def _plain(table: PlannedTable, snap: SnapshotFiles) -> bool:
        """Whether the table's snapshot rows are its ``new`` images as they are (``direct.plain_snapshot``)."""
        return direct.plain_snapshot(table, has_notes=snap.has_notes, row_filter=snap.row_filter)

    def direct_rows(self, table: PlannedTable) -> DirectRows | None:
        """The table's snapshot files when ``rows`` would be their ``new`` images as they are and this process reads
        them, so a target may print them itself (``direct.snapshot_files``); None means ``rows``."""
        if table.parts:
            return None
        snap = self.uris[table.source]
        return direct.snapshot_files(table, snap.uri, snap.files, has_notes=snap.has_notes, row_filter=snap.row_filter,
                                     local_master=self.on_demand.local_master,
                                     staged_in=snap.staged_in())

    def net(self, table: PlannedTable) -> DataFrame:
        uri, files = self.uris[table.source].uri, self.uris[table.source].files
        df = read_snapshot(self.spark, uri, files)
        # A table sync copies whatever the publication's actions are (native copy_data does too).
        cfg = dataclasses.replace(table.config, actions=ACTIONS)
        shape = planning.TableShape(table.source, table.target, table.key, table.columns)
        from_key = [F.lit(None).alias(from_column(i)) for i, _k in enumerate(table.key)]
        unique = direct.unique_in_snapshot(table)
        return (net_changes(df, table.relation, cfg, shape, None, notes=True, unique_keys=unique)
                .select(KIND, KEEP, LSN, *from_key, TOUCHED, *quoted_all(table.columns)))

    def ordered(self, table: PlannedTable) -> DataFrame:
        raise ApplyError(f"snapshot of {table.source}: a snapshot is loaded set-based only")
