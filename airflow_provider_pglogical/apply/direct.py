"""The direct path's rule: when staged files already are a table's net changes (or snapshot rows), so a target may
read them itself instead of the Spark transforms.

``transforms.py`` turns staged changes into one net change per key through Spark. For the common table-batch —
every action published, no row filter, no exactness notes, no routed parts, no unchanged-TOAST value, one schema
version holding every written column (``same_schema``; several versions are netted in process, below), and no key
in two changes (``keys_never_repeat``) — that pipeline reduces to a per-row rewrite (``to_key_events`` then
``single_event_net``):

* an INSERT is an ``I`` of its new image;
* an UPDATE that keeps its key is a ``U`` of its new image (old and new key are equal);
* an UPDATE that changes its key is a ``D`` of the old key plus an ``I`` of the new image moved from the old key;
* a DELETE is a ``D`` of its old key;

nothing kept from the target, nothing touched (``net_rows`` is that rewrite, in pyarrow).

A truncate of the table inside the batch, or the sync LSN of the snapshot its target holds falling after the
batch's start, is a ``Cut`` (``batch_cut``): only the staged changes after it count — those with ``commit_lsn`` at
or after the sync LSN and (commit LSN, order in transaction) strictly after the last truncate's, exactly the rows
``SparkBatchChanges`` and ``transforms.void_before`` keep (``after_cut``). They are left out as the rows are read,
before the publication and the netting (per change: a change's events carry its position), on every route: the
per-row rewrite's files and row groups (``plain_net_rows``), ``compacted_rows``, each chunk ``compacted_batches``
routes to key partitions, and ``publishable``'s judgement. The target performs the truncate itself (CASCADE,
RESTART IDENTITY, the tables a truncate names together) as for Spark's frame — PostgreSQL in the batch's transaction
before the net rows load, Delta and Iceberg in the commit that loads the table's rows: the plan, not the rows,
carries it. Judged on the whole batch, the other conditions (repeated keys, unchanged TOAST, notes, schema versions)
stay conservative for the changes after the cut.

A table-batch whose only obstacles are keys in several changes, unchanged-TOAST values, a row filter and/or actions
left out of the publication is netted in this process instead (``in_process``; ``PGLOGICAL_APPLY_INPROCESS_ROWS=0``
switches it off): in one piece when it holds at most ``PGLOGICAL_APPLY_INPROCESS_ROWS`` staged changes by its
manifest (2,000,000 unless set) and at most ``PGLOGICAL_APPLY_INPROCESS_BYTES`` uncompressed staged bytes by its
files' Parquet metadata (128 MiB unless set; 0 lifts the byte bound), else in key partitions that fit them on
average (hash partitions; a key change counts in two), spilled to disk (``apply/partitioned.py``,
``compacted_batches``), with no string or binary column of 1 GiB per partition (``in_process``,
``partitioned.partition_count``): the publication is
applied per change first (``published.publish``: actions dropped, the filter evaluated by ``filter_columns`` on old
and new images, UPDATEs turned into INSERTs or DELETEs; a filter or value outside ``filter_eval``'s subset leaves
the batch to Spark, judged before anything is written: ``publishable``), then ``kernels.compact_changes`` runs
the TOAST refill, the key events and ``compact`` with Arrow and numpy kernels and gives the same net rows, kept
columns, moved-from keys and touched flags (``compacted_rows``; ``DirectNet.compacted``), which the target loads
as it loads Spark's net frame. Its keys must group by Arrow equality as Spark groups them (``kernels.groupable``:
no floating-point key). A row filter outside that subset, exactness notes, several routed leaves writing one target
in a batch (``PlannedTable.parts``, a leaf's truncate among them; a lone routed leaf's truncate is a cut like any
other) still go to Spark.

A table-batch staged under several schema versions of its table (``same_schema`` false) is netted in this process
too, always by the kernels (``schema_union``, ``DirectNet.union``): each staged file is put in the versions' union
as it is read (``versions.conform``: by column name, the widest type, the source's fast default in the new and
full old images of rows staged before an ``ADD COLUMN … DEFAULT``, and the columns a change's version lacks, which
an UPDATE leaves alone), exactly the frame ``batches.read_changes`` gives Spark. A row filter and actions left out
of the publication are applied to the changes in that layout (``published.publish``, judged by ``publishable`` as
for one version), as Spark applies them to its union: the filter sees each change's images as its version staged
them, a column the version lacks NULL but where the union fills the source's fast default (both images alike, as
the source reads the row, so a DELETE staged before the ``ADD COLUMN`` is judged as the source judges it), and an
UPDATE the filter turns into an INSERT writes NULL for the other columns its version lacks (only a published
UPDATE leaves them alone). It stays with
Spark when a column's type changed between versions other than by widening integers, floats or decimals (of at
most 38 digits; Spark unions the others as text) and when the union lacks a written column. Delta and Iceberg
mirrors take the same net rows in the union's columns and types (``lake/direct.net_table``, ``lake/parts.py``), as
they take Spark's net frame of the union, so they follow the schema change as they follow it from Spark.

A keyless table (no replica identity: insert-only, ``PlannedTable.key`` empty) has nothing to net: Spark's
``transforms.to_appends`` makes every published INSERT after the cut its own row, two identical INSERTs two rows.
``keyless_files`` hands such a table-batch over under the conditions above but the key's (several schema versions
too, by ``schema_union``'s rule, filtered or not): with no row filter, every action published and one schema
version, its rows are the per-row rewrite's; else the publication is applied per change and each INSERT it keeps
is appended (``appended_rows``, a staged row group at a time, whatever the batch's size).
A published UPDATE or DELETE among its staged changes stops the batch here with the typed error Spark's path
raises (``refuse_updates_deletes``), as the publisher refuses it.

Staged files on an object store (``s3://``, ``gs://``, ``abfs://``) are read by this process, through the staging
area's own pyarrow filesystem and credentials, when Spark's master is local (``batches.readable_here``: the driver
would be this machine anyway); on any other master the executors read them and the driver does not, so such a
table-batch (or snapshot table) goes to Spark. Every read here goes through ``DirectNet.filesystem`` /
``DirectRows.filesystem``, never a local path. A snapshot table's
rows are its ``new`` images as they are when no value carries a note, the source evaluated the configured row
filter and the key cannot repeat (``plain_snapshot``).

Everything that decides eligibility is here: ``batch_files`` (a table-batch → ``DirectNet`` or None) and
``snapshot_files`` (a snapshot table → its files or None); ``apply/changes.py`` only asks. A target that can print
and load those rows without Spark's Parquet read, struct handling and Arrow conversion asks
``DirectNetSource.direct_net`` / ``DirectRowsSource.direct_rows`` (``targets/base.py``) and gets the files (or None:
then ``BatchChanges.net`` / ``rows`` as always). ``PGLOGICAL_APPLY_DIRECT=0`` switches it off (the general path),
which the semantic suites use to run both paths; ``tests/unit/apply/test_direct.py`` compares both on random
batches.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import replace
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_provider_pglogical.apply import filter_eval, kernels, partitioned, planning, published, versions
from airflow_provider_pglogical.apply.batches import (
    Batch,
    has_value_notes,
    is_local,
    keys_never_repeat,
    read_relation_versions,
    readable_here,
)
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.targets.base import Cut, DirectNet, DirectRows, PlannedTable
from airflow_provider_pglogical.environ import whole_number
from airflow_provider_pglogical.exceptions import ApplyError, RowFilterError
from airflow_provider_pglogical.row_filter import canonical
from airflow_provider_pglogical.staging.layout import resolve_filesystem

ENV_SWITCH = "PGLOGICAL_APPLY_DIRECT"
ROWS_SWITCH = "PGLOGICAL_APPLY_INPROCESS_ROWS"
# Staged changes up to which a table-batch with repeated keys, unchanged TOAST, a row filter or unpublished actions
# is netted in this process in one piece (its events sorted in memory); a larger one in key partitions of at most
# this many on average (``partitioned.partition_count``). Measured faster than Spark at every size
# tried (375k and 1.875M changes of the filtered workload); the process's peak RSS rose from 396 MiB to 981 MiB
# netting its 1M-change batch (five narrow columns): a wide table needs more, which the byte bound below limits.
INPROCESS_ROWS = 2_000_000
BYTES_SWITCH = "PGLOGICAL_APPLY_INPROCESS_BYTES"
# Uncompressed staged bytes (Parquet metadata, the columns the netting reads) up to which a table-batch is netted
# in one piece, and of a key partition above it: the row bound says nothing of width. At 1.875M changes the filtered workload stages two
# table-batches of five narrow columns (``benchmarks/apply.py --workload filtered --skip-apply`` prints
# ``staged_per_batch``): 1M inserts, 83 MiB, and 875k UPDATEs (full old images) and DELETEs, 107 MiB. Netting
# both in process raised the peak RSS from 392 to 1,030 MiB (``--inprocess-rows``): ~6 bytes of memory per staged
# byte of the larger. 128 MiB covers both and bounds the peak near 1.2 GiB whatever the rows' width (per piece:
# a partition's share is an average, and ``partitioned.ROUTE_BYTES`` bounds the chunks routed on the way).
INPROCESS_BYTES = 128 * 2**20
# Arrow's string and binary arrays address at most 2 GiB with 32-bit offsets, and the kernels concatenate each
# column into one array; Parquet's uncompressed size of a dictionary-encoded column can understate its Arrow size,
# so a column of half that stays with Spark.
COLUMN_BYTES = 2**30


def enabled() -> bool:
    """Whether the direct path may be used (``PGLOGICAL_APPLY_DIRECT=0`` forces the Spark transforms)."""
    return os.environ.get(ENV_SWITCH, "1") != "0"


def inprocess_rows() -> int:
    """Most staged changes netted in this process in one piece (``PGLOGICAL_APPLY_INPROCESS_ROWS``): a whole
    table-batch, or on average a key partition of a larger one; 0: none netted here."""
    return whole_number(ROWS_SWITCH, INPROCESS_ROWS, "staged changes", "0 switches the in-process netting off",
                        ApplyError)


def inprocess_bytes() -> int:
    """Most uncompressed staged bytes netted in this process in one piece (``PGLOGICAL_APPLY_INPROCESS_BYTES``): a
    whole table-batch, or on average a key partition of a larger one; 0: no byte bound."""
    return whole_number(BYTES_SWITCH, INPROCESS_BYTES, "bytes", "0 switches the byte bound off", ApplyError)


def staged_bytes(paths: Sequence[str], fs: pafs.FileSystem | None = None) -> tuple[int, int]:
    """The uncompressed bytes, by the files' Parquet metadata, of the columns the in-process netting reads
    (``kernels.STAGED_COLUMNS``), in all and of the largest string or binary leaf column."""
    total = 0
    per_column: dict[str, int] = {}
    for path in paths:
        if fs is None:
            metadata = pq.ParquetFile(path).metadata
        else:
            with fs.open_input_file(path) as f:
                metadata = pq.ParquetFile(f).metadata
        read = {i: metadata.schema.column(i) for i in range(metadata.num_columns)
                if metadata.schema.column(i).path.split(".")[0] in kernels.STAGED_COLUMNS}
        for r in range(metadata.num_row_groups):
            group = metadata.row_group(r)
            for i, leaf in read.items():
                size = group.column(i).total_uncompressed_size
                total += size
                if leaf.physical_type in ("BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"):
                    per_column[leaf.path] = per_column.get(leaf.path, 0) + size
    return total, max(per_column.values(), default=0)


def plain_config(cfg: TableApplyConfig) -> bool:
    """The parts of the decision a table's configuration settles: no row filter, or one whose constructs this
    process evaluates (``filter_eval.covers``; its columns' types are judged per batch). Actions left out are
    dropped per change in this process (``published.publish``)."""
    return not cfg.row_filter or filter_eval.covers(cfg.row_filter)


def publishes_all(cfg: TableApplyConfig) -> bool:
    """Whether every staged change is sent as it is: no row filter, every action published (else only the
    in-process netting, which applies the publication per change first, covers the table-batch)."""
    return not published.transforms(cfg.row_filter, cfg.actions)


def plain_table(table: PlannedTable, *, keyed: bool = True) -> bool:
    """The parts of the decision that need no file: a single-source table, keyed (nothing refused for
    UPDATE/DELETE) or keyless (``keyless_files`` raises a refused change's error itself), a row filter (if any) of
    the covered constructs (a truncate inside the batch is a ``Cut``)."""
    return (enabled() and not table.parts and bool(table.key) == keyed
            and (not keyed or table.update_delete_problem is None) and plain_config(table.config))


def _staged_paths(table: PlannedTable, batch: Batch) -> tuple[str, ...]:
    """The table-batch's staged files as paths of the staging area's own filesystem (``batch.reader.layout.fs``:
    local, or the object store's with its credentials); none when this process does not read the batch
    (``batch.here``)."""
    if not batch.here:
        return ()
    return tuple(f"{batch.ref.path}/{rel}" for rel in batch.table_files.get(table.source, ()))


def batch_cut(table: PlannedTable, batch: Batch, sync_lsn: int | None) -> Cut | None:
    """The table-batch's ``Cut``: its last truncate in the batch, and ``sync_lsn`` when the batch starts before it
    (``SparkBatchChanges``' rule); None when every staged change counts."""
    synced = sync_lsn if sync_lsn is not None and batch.start_lsn < sync_lsn else None
    return Cut(table.truncated_at, synced) if table.truncated_at is not None or synced is not None else None


# The staged columns a cut compares (``after_cut``).
CUT_COLUMNS = ("commit_lsn", "tx_order")
# What the per-row rewrite (``net_rows``) reads.
PLAIN_COLUMNS = ("op", "lsn", "old", "new")


def _plain_columns(cut: Cut | None) -> list[str]:
    """The staged columns the per-row rewrite reads: ``PLAIN_COLUMNS``, and ``CUT_COLUMNS`` for ``after_cut``."""
    return [*PLAIN_COLUMNS, *CUT_COLUMNS] if cut is not None else list(PLAIN_COLUMNS)


def plain_net_rows(parquet: pq.ParquetFile, group: int | None, key: Sequence[str], columns: Sequence[str],
                   cut: Cut | None) -> list[pa.RecordBatch]:
    """The per-row route's net rows of one staged file (``group`` None) or of one of its row groups: the columns
    the rewrite reads, the changes before ``cut`` left out (``after_cut``), then ``net_rows``. The one reader of
    that route, for every target (and the one the property tests compare with Spark)."""
    names = _plain_columns(cut)
    staged = parquet.read(columns=names) if group is None else parquet.read_row_group(group, columns=names)
    return net_rows(after_cut(staged, cut), key, columns)


def after_cut(staged: pa.Table, cut: Cut | None) -> pa.Table:
    """The staged changes Spark's transforms keep for the target: committed at or after the cut's sync LSN
    (``commit_lsn >= sync_lsn``, as ``SparkBatchChanges`` reads them) and after its truncate in (commit LSN, order in
    transaction) order, strictly (``transforms.void_before``: a change of the truncate's own position is void, a
    later one of its transaction is not). Per change, so it may run before the publication and the netting, as a
    change's events all carry its position."""
    if cut is None:
        return staged
    commit = staged.column("commit_lsn")
    kept = []
    if cut.sync_lsn is not None:
        kept.append(pc.greater_equal(commit, pa.scalar(cut.sync_lsn, commit.type)))
    if cut.truncated_at is not None:
        c, o = cut.truncated_at
        order = staged.column("tx_order")
        kept.append(pc.or_(pc.greater(commit, pa.scalar(c, commit.type)),
                           pc.and_(pc.equal(commit, pa.scalar(c, commit.type)),
                                   pc.greater(order, pa.scalar(o, order.type)))))
    return staged.filter(kept[0] if len(kept) == 1 else pc.and_(*kept))


def may_cover(config: ApplyConfig, local_master: bool = False) -> bool:
    """Whether the direct path may cover a whole run of ``config`` (``local_master``: whether Spark's master is on
    this machine, ``sparkenv.session_is_local``), judged before anything is
    staged: staging this process reads (``batches.readable_here``: local, or any with a local master) and every
    configured table (selections too) plain by its configuration, none routing leaf partitions to its root. False
    means Spark will surely be needed; True only that it may not be (a batch's files decide)."""
    return (enabled() and readable_here(config.staging_root, local_master)
            and all(plain_config(cfg) and cfg.leaves == "own" for cfg in config.tables.values()))


def batch_files(table: PlannedTable, batch: Batch, sync_lsn: int | None) -> DirectNet | None:
    """The table-batch's staged files when its net changes are the per-row rewrite of the module docstring, else
    None. ``sync_lsn``: the sync LSN of the snapshot the table's target holds (a batch starting before it drops
    the changes the snapshot has: a cut-off the files do not show)."""
    if not table.key:
        return keyless_files(table, batch, sync_lsn)
    paths = _staged_paths(table, batch)
    if not paths or not plain_table(table) or has_value_notes(batch, table.source):
        return None
    fs = batch.reader.layout.fs
    union = None
    if not same_schema(paths, table.columns, fs):
        union = schema_union(table, batch, paths, fs)
        if union is None:
            return None
    net = DirectNet(table.source, table.target, paths, tuple(table.key), tuple(table.columns), filesystem=fs,
                    cut=batch_cut(table, batch, sync_lsn), union=union)
    plain = publishes_all(table.config)
    if union is None and plain and no_unchanged_toast(paths, fs) and keys_never_repeat(
            batch, table.source, table.key, full_identity=table.relation.replica_identity == "f"):
        return net
    return netted_here(net, table, batch, judge_filter=not plain)


def keyless_files(table: PlannedTable, batch: Batch, sync_lsn: int | None) -> DirectNet | None:
    """A keyless (insert-only) table-batch's staged files when this process gives Spark's rows for it
    (``transforms.to_appends``: every published INSERT after the cut its own row, duplicates too), else None.

    Nothing is netted, so repeated values do not matter. Without a row filter and with every action published the
    rows are the per-row rewrite (``net_rows``: an INSERT is an ``I`` of its new image), read a row group at a time;
    otherwise, or when the table-batch spans several schema versions (``schema_union``), the publication is applied
    per change first (``compacted`` with the empty key:
    ``compacted_batches`` appends what ``published.publish`` keeps, a row group at a time, ``appended_rows``), as
    for the in-process netting (``in_process``: its switch and bounds, which here only decide whether the filter is
    judged whole or a row group at a time, ``publishable``). A published UPDATE or DELETE staged for the table
    stops the batch here with Spark's typed error (``refuse_updates_deletes``)."""
    paths = _staged_paths(table, batch)
    if not paths or not enabled() or table.parts:
        return None
    fs = batch.reader.layout.fs
    cut = batch_cut(table, batch, sync_lsn)
    refuse_updates_deletes(table, batch, paths, cut, fs)
    if not plain_table(table, keyed=False) or has_value_notes(batch, table.source):
        return None
    union = None
    if not same_schema(paths, table.columns, fs):
        union = schema_union(table, batch, paths, fs)
        if union is None:
            return None
    net = DirectNet(table.source, table.target, paths, (), tuple(table.columns), filesystem=fs, cut=cut,
                    union=union)
    plain = publishes_all(table.config)
    return net if plain and union is None else netted_here(net, table, batch, judge_filter=not plain)


def netted_here(net: DirectNet, table: PlannedTable, batch: Batch, *, judge_filter: bool) -> DirectNet | None:
    """``net`` as a compacted table-batch (the publication applied per change in this process, in ``in_process``'s
    key partitions), or None when Spark takes it: ``in_process`` says no, or (``judge_filter``) the row filter is
    not evaluated here over every staged change (``publishable``)."""
    partitions = in_process(table, batch, net.files, net.filesystem, net.union)
    if not partitions:
        return None
    net = replace(net, compacted=True, identity=tuple(table.relation.identity_columns),
                  row_filter=table.config.row_filter, actions=tuple(table.config.actions), partitions=partitions)
    return None if judge_filter and not publishable(net) else net


def refuse_updates_deletes(table: PlannedTable, batch: Batch, paths: Sequence[str], cut: Cut | None,
                           filesystem: pafs.FileSystem | None = None) -> None:
    """Stop the batch with ``changes.check_updates_deletes``' error (``planning.update_delete_error``) when a
    staged change of ``paths`` is an UPDATE or DELETE the table cannot apply, counted as Spark counts them: of a
    published action, committed at or after the cut's sync LSN (read from ``op``, ``lsn`` and ``commit_lsn``). A
    truncate of the batch does not spare it: Spark checks before ``transforms.void_before``."""
    letters = [letter for action, letter in (("update", "U"), ("delete", "D")) if action in table.config.actions]
    if table.update_delete_problem is None or not letters:
        return
    synced = Cut(None, cut.sync_lsn) if cut is not None and cut.sync_lsn is not None else None
    count, first = 0, None
    for path in paths:
        staged = after_cut(pq.read_table(path, columns=["op", "lsn", *CUT_COLUMNS], filesystem=filesystem), synced)
        refused = staged.filter(pc.is_in(staged.column("op"), pa.array(letters, staged.column("op").type)))
        if refused.num_rows:
            count += refused.num_rows
            low = pc.min(refused.column("lsn")).as_py()
            first = low if first is None else min(first, low)
    if count:
        raise planning.update_delete_error(table.relation, table.source, table.update_delete_problem, count, first,
                                           batch.start_lsn, batch.end_lsn)


def appended_rows(staged: pa.Table, columns: Sequence[str]) -> kernels.Net:
    """``transforms.to_appends`` of published staged changes: each INSERT its own ``I`` row of its new image, in
    staged order, nothing kept, not touched (a keyless table has no key to net by)."""
    inserts = staged.filter(pc.equal(staged.column("op"), "I"))
    n = inserts.num_rows
    new = inserts.column("new").combine_chunks()
    values = kernels.fields(new, columns)
    return kernels.Net(kind=pa.repeat(pa.scalar("I", pa.string()), n),
                       keep=pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string())),
                       lsn=inserts.column("lsn").combine_chunks().cast(pa.int64()), from_key=[],
                       touched=pa.repeat(pa.scalar(False), n), columns=[values[c] for c in columns])


def schema_union(table: PlannedTable, batch: Batch, paths: Sequence[str], filesystem: pafs.FileSystem | None = None
                 ) -> versions.SchemaUnion | None:
    """The union of a table-batch's files of several schema versions (``versions.union_of``) when this process nets
    it as Spark would: the union holding every written column; else None (Spark's path). A row filter and the
    publication's actions are applied to the changes in the union's layout (``versions.conform``), as Spark applies
    them to ``batches.read_changes``' union: a filter column a change's version lacks reads NULL in both images, or
    the source's fast default in its new image."""
    union = versions.union_of([pq.read_schema(p, filesystem=filesystem) for p in paths],
                              read_relation_versions(batch).get(table.source, []))
    if union is None or not set(table.columns) <= set(union.columns):
        return None
    return union


def publishable(net: DirectNet) -> bool:
    """Whether this process evaluates the compacted table-batch's row filter over every one of its staged changes
    (``filter_eval``: its columns' types, and values such as an integer result out of range, may leave the batch to
    Spark). Judged here, before a target writes anything; ``compacted_batches`` evaluates it again as it nets. A
    batch netted in one piece is published here concatenated, as it will be: a column beyond Arrow's 2 GiB offsets
    leaves it to Spark, which reads it in parts. One netted in key partitions is published a row group at a time,
    as ``partitioned.netted`` routes it (an overflow there is its ``ApplyError``)."""
    try:
        if net.partitions <= 1:
            published.publish(after_cut(staged_changes(net.files, net.filesystem, net.union), net.cut),
                              row_filter=net.row_filter, actions=net.actions, identity=net.identity)
        else:
            for chunk in staged_chunks(net.files, net.filesystem):
                published.publish(after_cut(_conformed(chunk, net.union), net.cut), row_filter=net.row_filter,
                                  actions=net.actions, identity=net.identity)
    except filter_eval.NotCovered:
        return False
    except pa.ArrowInvalid:  # a column beyond Arrow's 2 GiB offsets as it is concatenated: Spark reads it in parts
        return False
    return True


def staged_changes(paths: Sequence[str], filesystem: pafs.FileSystem | None = None,
                   union: versions.SchemaUnion | None = None) -> pa.Table:
    """The staged columns the in-process netting reads (``kernels.STAGED_COLUMNS``) of a table-batch's files
    (paths of ``filesystem``; None: local), each put in ``union``'s layout first when the files are of several
    schema versions (``versions.conform``)."""
    return pa.concat_tables([_conformed(pq.read_table(p, columns=list(kernels.STAGED_COLUMNS),
                                                      filesystem=filesystem), union) for p in paths])


def _conformed(staged: pa.Table, union: versions.SchemaUnion | None) -> pa.Table:
    return staged if union is None else versions.conform(staged, union)


def staged_chunks(paths: Sequence[str], filesystem: pafs.FileSystem | None = None) -> Iterator[pa.Table]:
    """``staged_changes`` a row group at a time (a table-batch larger than memory is read once, in pieces)."""
    for path in paths:
        parquet = pq.ParquetFile(path, filesystem=filesystem)
        for group in range(parquet.metadata.num_row_groups):
            yield staged_group(parquet, group)


def staged_group(parquet: pq.ParquetFile, group: int) -> pa.Table:
    """One row group of a staged file, the columns the in-process netting reads (``kernels.STAGED_COLUMNS``)."""
    return parquet.read_row_group(group, columns=list(kernels.STAGED_COLUMNS))


def in_process(table: PlannedTable, batch: Batch, paths: Sequence[str], filesystem: pafs.FileSystem | None = None,
               union: versions.SchemaUnion | None = None) -> int:
    """In how many key partitions ``kernels.compact_changes`` nets the table-batch here (0: not here, Spark does):
    enough that each holds on average at most ``inprocess_rows()`` staged changes by the manifest and
    ``inprocess_bytes()`` by the files' metadata (``partitioned.partition_count``; 1: whole, in memory; hash
    partitions are as even as the keys' hashes, a key change counts in two), with no string or binary column
    of ``COLUMN_BYTES`` or more per partition; keys that group as Spark groups them, and old images of the new
    images' types for every written column they hold (an unchanged-TOAST value is taken from the old image as it
    is; ``union``: of several schema versions, judged on its types). ``PGLOGICAL_APPLY_INPROCESS_ROWS=0`` leaves every
    such table-batch to Spark."""
    rows_bound = inprocess_rows()
    if not rows_bound:
        return 0
    rows = int(batch.manifest.tables.get(table.source, {}).get("rows", 0))
    total, widest = staged_bytes(paths, filesystem)
    partitions = partitioned.partition_count(rows, total, rows_bound, inprocess_bytes())
    if widest // partitions >= COLUMN_BYTES:
        return 0
    schema = pq.read_schema(paths[0], filesystem=filesystem)
    if union is not None:
        schema = union.staged_schema(schema)
    old, new = schema.field("old").type, schema.field("new").type
    if not isinstance(old, pa.StructType) or not isinstance(new, pa.StructType):
        return 0
    new_types, old_types = kernels.field_types(new), kernels.field_types(old)
    fits = (all(k in old_types and kernels.groupable(new_types[k]) for k in table.key)
            and all(old_types.get(c, new_types[c]) == new_types[c] for c in table.columns)
            and all(c in schema.names for c in kernels.STAGED_COLUMNS))
    return partitions if fits else 0


def compacted_rows(staged: pa.Table, net: DirectNet) -> pa.RecordBatch:
    """A compacted ``DirectNet``'s staged changes (all of the table-batch, ``kernels.STAGED_COLUMNS``) as one
    batch of net rows in ``net_rows``' layout, the keep column a list of column names: the changes before its cut
    left out (``after_cut``), the publication's actions and row filter applied per change (``published.publish``),
    as Spark applies them before netting."""
    staged = published.publish(after_cut(staged, net.cut), row_filter=net.row_filter, actions=net.actions,
                               identity=net.identity)
    if not net.key:  # keyless: appended, not netted
        return _net_batch(appended_rows(staged, net.columns), net)
    return _net_batch(kernels.compact_changes(staged, net.key, net.columns, net.identity), net)


def compacted_batches(chunks: Iterable[pa.Table], net: DirectNet) -> Generator[pa.RecordBatch, None, None]:
    """A compacted ``DirectNet``'s net rows from its staged row groups (``chunks``, ``kernels.STAGED_COLUMNS``):
    ``compacted_rows`` of them all when ``net.partitions`` is 1, else one batch per key partition
    (``partitioned.netted``: spilled to disk, netted one partition at a time), the same rows in all. The chunks
    of a table-batch of several schema versions are put in their union's layout first (``versions.conform``). A
    keyless table-batch's rows are its chunks' own (``appended_rows``): one batch per chunk, nothing held or
    spilled."""
    if net.union is not None:
        union = net.union
        chunks = (versions.conform(chunk, union) for chunk in chunks)
    if not net.key:
        for chunk in chunks:
            yield compacted_rows(chunk, net)
        return
    if net.partitions <= 1:
        groups: list[pa.Table] = []
        try:  # a chunk put in the union's layout (``versions.conform``) is concatenated and cast as it is read
            groups.extend(chunks)
            rows = compacted_rows(pa.concat_tables(groups), net) if groups else None
        except (pa.ArrowInvalid, pa.ArrowCapacityError):  # past ``publishable``'s judgement: typed, the way out named
            raise partitioned.overflow_error(net.source or net.target, "netting it in one piece "
                                             f"({sum(g.num_rows for g in groups)} staged changes)") from None
        if rows is not None:
            yield rows
        return
    parts = partitioned.netted((after_cut(chunk, net.cut) for chunk in chunks), source=net.source or net.target,
                               key=net.key, columns=net.columns, identity=net.identity, row_filter=net.row_filter,
                               actions=net.actions, partitions=net.partitions)
    with contextlib.closing(parts):  # closing these batches removes the spill files now
        for rows in parts:
            yield _net_batch(rows, net)


def _net_batch(rows: kernels.Net, net: DirectNet) -> pa.RecordBatch:
    names = [*net_row_names(net.key), *[f"c{i}" for i in range(len(net.columns))]]
    return pa.RecordBatch.from_arrays([rows.kind, rows.keep, rows.lsn, *rows.from_key, rows.touched, *rows.columns],
                                      names=names)


def plain_snapshot(table: PlannedTable, *, has_notes: bool, row_filter: str | None) -> bool:
    """Whether a snapshot table's rows are its ``new`` images as they are: no value carries an exactness note,
    the source evaluated the configured row filter (``row_filter``: the manifest's) and no key repeats."""
    return (not has_notes and unique_in_snapshot(table)
            and filtered_on_source(row_filter, table.config.row_filter))


def snapshot_files(table: PlannedTable, uri: str, files: Sequence[str], *, has_notes: bool,
                   row_filter: str | None, local_master: bool = False,
                   staged_in: tuple[pafs.FileSystem, str] | None = None) -> DirectRows | None:
    """A snapshot table's files (under ``uri``) when its rows are their ``new`` images as they are
    (``plain_snapshot``) and this process reads them (``batches.readable_here``: ``local_master`` tells whether
    Spark's master is on this machine), so a target
    may print them itself: local paths, or paths of the staging area's filesystem; None otherwise. ``staged_in``:
    that filesystem and the directory's path in it, as the snapshot's layout resolved them (else from ``uri``)."""
    if table.parts or not enabled() or not files or not readable_here(uri, local_master):
        return None
    if not plain_snapshot(table, has_notes=has_notes, row_filter=row_filter):
        return None
    if not is_local(uri):
        # the staging area's credentials (registered, or the environment's)
        fs, root = staged_in if staged_in is not None else resolve_filesystem(uri)
        return DirectRows(tuple(f"{root}/{f}" for f in files), fs)
    root = urlparse(uri).path if uri.startswith("file://") else uri
    return DirectRows(tuple(f"{root}/{f}" for f in files))


def unique_in_snapshot(table: PlannedTable) -> bool:
    """Whether no key occurs twice in the table's snapshot, so netting needs no shuffle (``single_event_net``).

    True when the key is the source's primary key or replica identity index: one consistent snapshot
    holds each of its values once (filters and column lists only drop rows and other columns). Other
    keys (REPLICA IDENTITY FULL, a configured key) may repeat and are netted by ``compact``.
    """
    rel = table.relation
    return (rel.replica_identity in ("d", "i") and bool(table.key)
            and tuple(table.key) == tuple(rel.identity_columns))


def filtered_on_source(source_filter: str | None, configured: str | None) -> bool:
    """Whether the source already evaluated the table's configured row filter when it read the snapshot.

    The snapshot's filter is ``(<publication filter>) AND (<spec filter>)`` as composed by
    ``snapshot/source.describe_tables``, each deparsed from its parse tree; ``configured`` is compared in
    that form. A spec whose filter changed since must evaluate its own again.
    """
    if not configured:
        return True
    if not source_filter:
        return False
    try:
        configured = canonical(configured)
    except RowFilterError:
        return False  # not a filter the snapshot could have evaluated
    return source_filter == f"({configured})" or source_filter.endswith(f") AND ({configured})")


def no_unchanged_toast(paths: Sequence[str], filesystem: pafs.FileSystem | None = None) -> bool:
    """Whether no staged change in ``paths`` lists an unchanged-TOAST column (read from that list column only)."""
    for path in paths:
        column = pq.read_table(path, columns=["new_unchanged_toast"], filesystem=filesystem).column(0)
        if len(column) and (pc.max(pc.list_value_length(column)).as_py() or 0) > 0:
            return False
    return True


def same_schema(paths: Sequence[str], columns: Sequence[str], filesystem: pafs.FileSystem | None = None) -> bool:
    """Whether every file has one Arrow schema whose images hold every written column (one schema version with
    all the batch's columns: nothing to union, no defaults to fill, no column a change's version lacks, which
    a change must leave alone — ``batches.ABSENT``)."""
    schemas = [pq.read_schema(p, filesystem=filesystem) for p in paths]
    if not all(s.equals(schemas[0]) for s in schemas[1:]):
        return False
    image = schemas[0].field("new").type
    return isinstance(image, pa.StructType) and set(columns) <= {image.field(i).name for i in range(image.num_fields)}


def net_row_names(key: Sequence[str]) -> list[str]:
    """The columns of ``net_rows``' batches before the written ones: op, keep, lsn, the moved-from key, touched
    (the order of a target's net frame, ``BatchChanges.net``)."""
    return ["op", "keep", "lsn", *[f"from{i}" for i in range(len(key))], "touched"]


def net_rows(table: pa.Table, key: Sequence[str], columns: Sequence[str]) -> list[pa.RecordBatch]:
    """The net rows of staged changes (``op``, ``lsn``, ``old``, ``new``) whose keys never repeat: the per-row
    rewrite of the module docstring, columns ``net_row_names(key)`` then ``c0``, ``c1``… for ``columns``.

    INSERTs and UPDATEs give one row of their new image (``I``, or ``U`` when the key stays; an UPDATE that
    moves its key is an ``I`` remembering the old key); DELETEs and the old half of a key change give a
    ``D`` of the old key with no values.
    """
    names = [*net_row_names(key), *[f"c{i}" for i in range(len(columns))]]
    # Whole arrays, also of no rows (every change before a cut): the result keeps the staged types either way.
    op, lsn = table.column("op").combine_chunks(), table.column("lsn").combine_chunks()
    old, new = table.column("old").combine_chunks(), table.column("new").combine_chunks()
    is_update = pc.equal(op, "U")
    moved = pc.and_(is_update, old.is_valid())
    differs = None
    for k in key:
        d = pc.fill_null(pc.not_equal(old.field(k), new.field(k)), False)
        differs = d if differs is None else pc.or_(differs, d)
    moved = pc.and_(moved, differs) if differs is not None else pa.repeat(False, len(op))
    main = pc.or_(pc.equal(op, "I"), is_update)
    gone = pc.or_(pc.equal(op, "D"), moved)
    batches: list[pa.RecordBatch] = []
    m = pc.sum(main.cast(pa.int64())).as_py() or 0
    g = pc.sum(gone.cast(pa.int64())).as_py() or 0
    if m or not g:  # no row at all: one empty batch of the net rows' types
        kind = pc.if_else(pc.or_(pc.equal(op, "I"), moved), "I", "U")
        arrays = [pc.filter(kind, main), pa.repeat("{}", m), pc.filter(lsn, main)]
        arrays += [pc.filter(pc.if_else(moved, old.field(k), pa.nulls(len(op), old.field(k).type)), main)
                   for k in key]
        arrays.append(pa.repeat(False, m))
        arrays += [pc.filter(new.field(c), main) for c in columns]
        batches.append(pa.RecordBatch.from_arrays(arrays, names=names))
    if g:
        arrays = [pa.repeat("D", g), pa.repeat("{}", g), pc.filter(lsn, gone)]
        arrays += [pa.nulls(g, old.field(k).type) for k in key]
        arrays.append(pa.repeat(False, g))
        arrays += [pc.filter(old.field(c), gone) if c in key else pa.nulls(g, new.field(c).type)
                   for c in columns]
        batches.append(pa.RecordBatch.from_arrays(arrays, names=names))
    return batches
