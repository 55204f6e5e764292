"""Mirror mode: one batch's net changes of one table → ONE Delta commit (MERGE) carrying the batch's watermark.

Input is the shared transforms' output (``transforms.compact``) as Arrow: ``_pgl_kind`` (D, I, U, R),
``_pgl_keep`` (columns whose value the target keeps: unchanged TOAST), ``_pgl_lsn``, ``_pgl_from``
(old key of a row that arrived by a key change), ``_pgl_touched``, then the table's columns. The MERGE:

* matched ``D`` → delete; matched ``I``/``U``/``R`` → update, each column ``CASE WHEN keep THEN
  target ELSE source END`` so an unchanged TOAST value is never assigned (never NULL);
* not matched ``I``/``R`` → insert; not matched ``U``/``D`` → nothing (native skips a missing row);
* a TRUNCATE before the changes (``truncated``): every target row the batch does not re-insert is
  deleted (``not matched by source``), matched non-inserts are deleted — in the same commit.

When no key of the batch can be at a row of the table (``keys_absent``: no data file yet, or a single integer/date
key whose batch values all lie below, or all above, the range the files' statistics span), the MERGE could only insert: the ``I``/``R`` rows are appended instead
(``append_inserts``), in the same one commit with the watermark.

A row that arrived by a key change and needs an unchanged TOAST value takes it from where it was:
that needs the order of the batch, so the table's un-netted changes are replayed on the driver
(``replay_net``) from the target rows they reference, and the result merged the same way.

Exactly once: the commit carries the app transaction ``pglogical/<slot>/<target>`` = batch end LSN,
atomically with the data (Delta's log entry is one object written with put-if-absent). A batch at or
below that version is skipped, so a crash before the commit leaves nothing visible (only unreferenced
Parquet files, removed by VACUUM) and a crash after it makes the re-run skip the table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from airflow_provider_pglogical.apply.targets.base import (  # ordered changes: commit LSN, order
    COMMIT,
    ORDER,
    from_column,
)
from airflow_provider_pglogical.apply.transforms import FROM, KEEP, KIND, LSN
from airflow_provider_pglogical.exceptions import ApplyError, UnresolvableToastError

KEEP_FLAG = "_pgl_keep_"  # + column index: per-row "target keeps this column" for the MERGE

# A primary-key value as a tuple of the key columns' Python values (from ``to_pylist``).
Key = tuple[object, ...]


class Reject(TypedDict):
    """A change whose unchanged TOAST value exists nowhere (policy ``reject``), recorded in the commit."""

    table: str
    lsn: int
    columns: list[str]
    key: dict[str, object]


@dataclass
class MirrorResult:
    rows: dict[str, int] = field(default_factory=dict)
    rejects: list[Reject] = field(default_factory=list)
    replayed: bool = False


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def commit_properties(app: str, end_lsn: int, metadata: dict[str, str]) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app, end_lsn)], custom_metadata=metadata)


def _kinds(net: pa.Table) -> pa.ChunkedArray:
    return net.column(KIND)


def _has_keep(net: pa.Table) -> pa.Array:
    return pc.fill_null(pc.greater(pc.list_value_length(net.column(KEEP)), 0), False)


def key_tuples(table: pa.Table, key: Sequence[str]) -> list[Key]:
    """Each row's key as a tuple of the key columns' Python values (shared with the Iceberg mirror)."""
    return list(zip(*[table.column(k).to_pylist() for k in key], strict=True))


def from_tuples(changes: pa.Table, key: Sequence[str]) -> list[Key | None]:
    """The moved-from key of each change (``_pgl_from``), None where the change did not move a row."""
    return [None if v is None else tuple(v[k] for k in key) for v in changes.column(FROM).to_pylist()]


def target_rows(dt: DeltaTable, keys: set[Key], key: Sequence[str], columns: Sequence[str]) -> pa.Table:
    """The target's current rows at ``keys`` (pushed down as ``IN`` per key column, then matched exactly)."""
    if not keys:
        return dt.to_pyarrow_dataset().head(0, columns=list(columns))
    expr = None
    for i, k in enumerate(key):
        e = ds.field(k).isin(list({t[i] for t in keys}))
        expr = e if expr is None else expr & e
    found = dt.to_pyarrow_dataset().to_table(filter=expr, columns=list(columns))
    if len(key) > 1 and found.num_rows:
        mask = [t in keys for t in key_tuples(found, key)]
        found = found.filter(pa.array(mask, pa.bool_()))
    return found


def reject(where: str, target: str, policy: str, key: Key, key_cols: Sequence[str], lsn: int,
            missing: Sequence[str], rejects: list[Reject]) -> None:
    if policy == "fail":
        raise UnresolvableToastError(
            f"{where}: {target}: unchanged TOAST value of column(s) {', '.join(sorted(missing))} of the change at "
            f"LSN {lsn:X} exists neither in the batch nor in the target")
    rejects.append({"table": target, "lsn": lsn, "columns": sorted(missing),
                    "key": dict(zip(key_cols, key, strict=True))})


def replay_net(ordered: pa.Table, base: pa.Table, key: Sequence[str], columns: Sequence[str], *, where: str,
               target: str, unchanged_toast: str) -> tuple[pa.Table, list[Reject]]:
    """Replay un-netted changes in (commit LSN, order) from ``base`` (the target rows they reference) →
    net rows ``R`` (final row, nothing kept) / ``D`` per key they touched, like the native apply worker:
    INSERT onto an existing key updates it; UPDATE matched by its old key moves the row, unchanged
    TOAST values travel with it; UPDATE/DELETE of a missing row are skipped.

    Rows are tracked as cell references into ``base`` + ``ordered`` (never converted to Python values).
    """
    ordered = ordered.sort_by([(COMMIT, "ascending"), (ORDER, "ascending"), (LSN, "ascending")])
    values = pa.concat_tables([base.select(list(columns)),
                               ordered.select(list(columns)).cast(base.select(list(columns)).schema)])
    nb, ncol = base.num_rows, len(columns)
    col_index = {c: i for i, c in enumerate(columns)}
    state: dict[Key, list[int]] = {k: [i] * ncol for i, k in enumerate(key_tuples(base, key))}
    touched: dict[Key, None] = {}
    rejects: list[Reject] = []
    kinds = ordered.column(KIND).to_pylist()
    keeps = ordered.column(KEEP).to_pylist()
    lsns = ordered.column(LSN).to_pylist()
    froms = from_tuples(ordered, key)
    news = key_tuples(ordered, key)
    for j, (kind, keep, lsn, frm, new) in enumerate(zip(kinds, keeps, lsns, froms, news, strict=True)):
        row = nb + j
        kept = [col_index[c] for c in keep or () if c in col_index]
        if kind == "D":
            if frm is not None and frm in state:
                del state[frm]
                touched[frm] = None
            continue
        if kind == "U":
            current = state.get(frm if frm is not None else new)
            if current is None:
                continue  # native: "did not find row to be updated"
            del state[frm if frm is not None else new]
            touched[frm if frm is not None else new] = None
        else:  # I: an existing row at the key is updated (upsert), leaving kept columns alone
            current = state.get(new)
            if current is None and kept:
                reject(where, target, unchanged_toast, new, key, lsn, [columns[i] for i in kept], rejects)
                continue
        cells = [row] * ncol
        if current is not None:  # None only for an insert at a new key, which then keeps nothing
            for i in kept:
                cells[i] = current[i]
        state[new] = cells
        touched[new] = None
    final = [k for k in touched if k in state]
    gone = [k for k in touched if k not in state]
    idx = [pa.array([state[k][i] for k in final], pa.int64()) for i in range(ncol)]
    live = pa.table({c: values.column(c).take(idx[i]) for i, c in enumerate(columns)})
    dead = pa.table({c: (pa.array([k[key.index(c)] for k in gone], values.schema.field(c).type) if c in key
                         else pa.nulls(len(gone), values.schema.field(c).type)) for c in columns})
    out = pa.concat_tables([live, dead])
    kinds_out = pa.array(["R"] * len(final) + ["D"] * len(gone), pa.string())
    empty = pa.array([[]] * out.num_rows, pa.list_(pa.string()))
    return (out.append_column(KIND, kinds_out).append_column(KEEP, empty)
            .append_column(LSN, pa.array([0] * out.num_rows, pa.int64()))), rejects


def resolve_keeps(dt: DeltaTable, net: pa.Table, key: Sequence[str], columns: Sequence[str], *, truncated: bool,
                  where: str, target: str, unchanged_toast: str) -> tuple[pa.Table, list[Reject]]:
    """Drop (or fail on) rows whose kept values exist nowhere: ``R`` rows (their row was deleted in the
    batch), and ``I`` rows with no target row at their key (or after a truncate)."""
    kinds = _kinds(net)
    candidates = pc.and_(_has_keep(net), pc.is_in(kinds, pa.array(["I", "R"])))
    if not pc.any(candidates).as_py():
        return net, []
    idx = np.flatnonzero(candidates.to_numpy(zero_copy_only=False))
    sub = net.take(pa.array(idx))
    keys = key_tuples(sub, key)
    present: set[Key] = set()
    if not truncated:
        present = set(key_tuples(target_rows(dt, {k for k, kind in zip(keys, sub.column(KIND).to_pylist(),
                                                                      strict=True) if kind == "I"}, key, key), key))
    rejects: list[Reject] = []
    drop = np.zeros(net.num_rows, dtype=bool)
    for i, k, kind, keep, lsn in zip(idx, keys, sub.column(KIND).to_pylist(), sub.column(KEEP).to_pylist(),
                                     sub.column(LSN).to_pylist(), strict=True):
        if kind == "R" or k not in present:
            reject(where, target, unchanged_toast, k, key, lsn, keep, rejects)
            drop[i] = True
    return (net.filter(pa.array(~drop)) if drop.any() else net), rejects


def needs_replay(net: pa.Table) -> bool:
    """A row that arrived by a key change keeps a column: its value is where the row was, in batch order."""
    moved = pc.and_(pc.is_valid(net.column(FROM)), pc.is_in(_kinds(net), pa.array(["I", "R"])))
    return bool(pc.any(pc.and_(moved, _has_keep(net))).as_py())


def merge_source(net: pa.Table, key: Sequence[str], columns: Sequence[str],
                 kept: Sequence[str] | None = None) -> tuple[pa.Table, dict[str, str]]:
    """The MERGE source (kind, keep flags, columns) and the update assignments per column.

    ``kept``: the columns that carry a keep flag, whether or not a row of ``net`` keeps them (every chunk of a
    streamed source has one schema: ``lake/stream.py``); None: the columns some row of ``net`` keeps. A flag that is
    false everywhere assigns the source value, as no flag does.
    """
    values = [c for c in columns if c not in key]
    keep = net.column(KEEP).combine_chunks() if net.num_rows else pa.array([], pa.list_(pa.string()))
    flat, parents = pc.list_flatten(keep), pc.list_parent_indices(keep)
    source = net.select([KIND, *columns])
    flagged: list[str] = []
    for i, c in enumerate(values):
        rows = parents.filter(pc.equal(flat, c)).to_numpy(zero_copy_only=False)
        if kept is not None and len(rows) and c not in kept:
            raise ApplyError(f"column {c}: {len(rows)} change(s) keep it, but the MERGE source was planned without it")
        if len(rows) or (kept is not None and c in kept):
            flags = np.zeros(net.num_rows, dtype=bool)
            flags[rows] = True
            source = source.append_column(f"{KEEP_FLAG}{i}", pa.array(flags))
            flagged.append(c)
    return source, merge_updates(values, flagged)


def merge_updates(values: Sequence[str], flagged: Collection[str]) -> dict[str, str]:
    """Each value column's update: the target's value where the source row's keep flag is set, else the source's."""
    updates: dict[str, str] = {}
    for i, c in enumerate(values):
        if c in flagged:
            updates[quote_ident(c)] = (f"CASE WHEN s.{KEEP_FLAG}{i} THEN t.{quote_ident(c)} "
                                       f"ELSE s.{quote_ident(c)} END")
        else:
            updates[quote_ident(c)] = f"s.{quote_ident(c)}"
    return updates


def merge_net(dt: DeltaTable, net: pa.Table, key: Sequence[str], columns: Sequence[str], *, truncated: bool,
              props: CommitProperties, before_commit: Callable[[], None], null_safe: bool = False) -> dict[str, int]:
    """The one MERGE of the batch (see the module docstring); returns deltalake's metrics.

    ``null_safe``: the key may hold NULLs (REPLICA IDENTITY FULL keyed by all columns), so rows match
    with ``IS NOT DISTINCT FROM`` (still a hash join in DataFusion); identity keys use ``=``.
    """
    source, updates = merge_source(net, key, columns)
    return merge(dt, source, updates, key, columns, truncated=truncated, props=props, before_commit=before_commit,
                 null_safe=null_safe)


def merge(dt: DeltaTable, source: pa.Table | pa.RecordBatchReader, updates: Mapping[str, str], key: Sequence[str],
          columns: Sequence[str], *, truncated: bool, props: CommitProperties, before_commit: Callable[[], None],
          null_safe: bool = False) -> dict[str, int]:
    """``merge_net`` of a built source: a table, or a stream delta-rs reads as the MERGE runs (``streamed_exec``)."""
    op = "IS NOT DISTINCT FROM" if null_safe else "="
    on = " AND ".join(f"(t.{quote_ident(k)} {op} s.{quote_ident(k)})" for k in key)
    inserts = {quote_ident(c): f"s.{quote_ident(c)}" for c in columns}
    merger = dt.merge(source, on, source_alias="s", target_alias="t", commit_properties=props, streamed_exec=True)
    inserted = f"s.{KIND} IN ('I', 'R')"
    if truncated:
        merger = (merger.when_matched_update(inserts, predicate=inserted)
                  .when_matched_delete().when_not_matched_by_source_delete())
    else:
        merger = merger.when_matched_delete(f"s.{KIND} = 'D'")
        if updates:
            merger = merger.when_matched_update(dict(updates))
    merger = merger.when_not_matched_insert(inserts, predicate=inserted)
    before_commit()
    return dict(merger.execute())


INSERTED = ("I", "R")  # net kinds a MERGE inserts at a key no target row holds
APPEND_SWITCH = "PGLOGICAL_DELTA_APPEND"  # "0": every keyed batch MERGEs (the reference of ``append_inserts``)


def appends() -> bool:
    """Whether a batch whose keys no row can hold is appended (``keys_absent``) rather than merged."""
    return os.environ.get(APPEND_SWITCH, "1") != "0"


def keys_absent(dt: DeltaTable, net: pa.Table, key: Sequence[str], *, truncated: bool) -> bool:
    """Whether no key of ``net`` can be at a row of the table, read from its log alone: the table has no data file,
    or (without a truncate before the changes) the batch's values of its single integer or date key, never null,
    all lie below or all above the range the files' ``[min, max]`` statistics span together. Then the MERGE could only insert the ``I``/``R`` rows (nothing is
    matched: an UPDATE or DELETE of a missing row is skipped, as natively), which ``append_inserts`` does without
    its join. Unknown statistics (a file without them, a partition column, a key past the indexed columns)
    answer False: the MERGE, as always."""
    files = pa.table(dt.get_add_actions(flatten=True))
    if not files.num_rows:
        return True
    if truncated or len(key) != 1 or "." in key[0]:
        return False
    column = net.column(key[0])
    if not (pa.types.is_integer(column.type) or pa.types.is_date32(column.type)) or column.null_count:
        return False
    low, high = f"min.{key[0]}", f"max.{key[0]}"
    if low not in files.column_names or high not in files.column_names:
        return False
    lows, highs = files.column(low), files.column(high)
    if lows.null_count or highs.null_count or not net.num_rows:
        return False
    bounds = pc.min_max(column)
    first, last = bounds["min"], bounds["max"]
    below = pc.less(last, pc.min(lows).cast(column.type)).as_py()
    above = pc.greater(first, pc.max(highs).cast(column.type)).as_py()
    return bool(below or above)


def append_inserts(dt: DeltaTable, net: pa.Table, columns: Sequence[str], *, props: CommitProperties,
                   before_commit: Callable[[], None]) -> dict[str, int]:
    """The batch's commit when ``keys_absent``: its ``I``/``R`` rows appended (one commit with the watermark), the
    MERGE's counts of it. Rows keeping a column were resolved before (``resolve_keeps``: dropped or failed)."""
    rows = net.filter(pc.is_in(_kinds(net), pa.array(INSERTED))).select(list(columns))
    # A column the batch does not write (the source dropped it) is null in the appended rows, as the MERGE's insert
    # leaves it; the rows take the table's column order.
    table = pa.schema(dt.schema().to_arrow())
    rows = pa.table({f.name: rows.column(f.name) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
                     for f in table})
    before_commit()
    if rows.num_rows:
        write_deltalake(dt, rows, mode="append", commit_properties=props)
    return {"num_target_rows_inserted": rows.num_rows, "num_target_rows_updated": 0, "num_target_rows_deleted": 0}


def commit_watermark_only(dt: DeltaTable, props: CommitProperties) -> None:
    """A commit with no data, only the app transaction (when the batch changed nothing in this table)."""
    empty = dt.to_pyarrow_dataset().head(0)
    write_deltalake(dt, empty, mode="append", commit_properties=props)


def metadata(slot: str, start_lsn: int, end_lsn: int, rejects: list[Reject]) -> dict[str, str]:
    meta = {"pglogical.slot": slot, "pglogical.start_lsn": str(start_lsn), "pglogical.end_lsn": str(end_lsn)}
    if rejects:
        meta["pglogical.rejects"] = json.dumps(rejects, default=str, sort_keys=True)
    return meta


def with_from(frame: pa.Table, key: Sequence[str]) -> pa.Table:
    """The runner's flat moved-from key columns (``from_column(i)``) → the ``FROM`` struct ``mirror`` reads
    (null where the change did not move a row: every field null). Ordered frames' commit positions are
    named as ``mirror`` expects already (``COMMIT``, ``ORDER``)."""
    names = [from_column(i) for i in range(len(key))]
    if not key:
        return frame  # keyless (insert-only): nothing moves
    children = [frame.column(n).combine_chunks() if frame.num_rows else pa.array([], frame.schema.field(n).type)
                for n in names]
    moved = children[0].is_valid()
    for c in children[1:]:
        moved = pc.or_(moved, c.is_valid())
    struct = pa.StructArray.from_arrays(children, names=list(key), mask=pc.invert(moved))
    return frame.drop_columns(names).append_column(FROM, struct)
