"""Net changes per key of a small table-batch in this process, with Arrow and numpy kernels: no JVM.

The same steps as the Spark chain ``published_changes`` → ``to_key_events`` → ``compact`` (``transforms.py``) for
the table-batches the in-process rule of ``direct.py`` lets through (their row filter and actions applied per change
first by ``published.py``; no exactness notes; several schema versions' files unioned first by ``versions.conform``,
whose ``absent`` column joins an UPDATE's keep list; the changes before a truncate or a snapshot's sync LSN left out
first by ``direct.after_cut``), and the same rows:

* unchanged-TOAST values are filled from the old image where it has them (``resolve_toast_from_old``);
* every change becomes one key event, a key change two: the DELETE of the old key (sub 0, away) and the INSERT
  of the new key (sub 1) remembering the old key (``to_key_events``);
* events are sorted on fixed-width positions — the key columns, then (commit LSN, order in transaction, sub,
  change LSN) — so each key's events are one run in event order, and ``compact``'s aggregates become index
  arithmetic over those runs (``np.*.reduceat``): the last DELETE, the first event after it, the last event that
  knows each column; the values are then taken by index once.

Keys compare with Arrow equality, nulls equal to nulls (Spark's grouping): floating-point keys, whose -0.0/NaN
Spark normalises, are left to Spark by the rule (``groupable``). ``tests/unit/apply/test_kernels.py`` compares
``compact_changes`` (its ``Net.table``) with ``transforms.compact`` on random batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# The staged columns the kernel reads.
STAGED_COLUMNS = ("op", "lsn", "commit_lsn", "tx_order", "old", "old_key_only", "new", "new_unchanged_toast")


def groupable(dtype: pa.DataType) -> bool:
    """Whether key values of this type group by Arrow equality exactly as Spark groups them: integers, strings,
    binaries, booleans, decimals, dates, times and timestamps (not floats, whose -0.0 and NaN Spark normalises,
    nor nested types)."""
    return bool(pa.types.is_integer(dtype) or pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
                or pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or pa.types.is_boolean(dtype)
                or pa.types.is_decimal(dtype) or pa.types.is_temporal(dtype))


def fields(image: pa.StructArray | pa.ChunkedArray, names: Sequence[str]) -> dict[str, pa.Array | pa.ChunkedArray]:
    """The image's fields with the image's own nulls applied (a null image has null fields), by name: arrays of a
    ``StructArray``, chunked arrays of a ``ChunkedArray`` (its chunks as they are)."""
    flat = dict(zip([image.type.field(i).name for i in range(image.type.num_fields)], image.flatten(), strict=True))
    return {c: flat[c] for c in names if c in flat}


def mask(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean array as numpy, null as False."""
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)


def _differs(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Row-wise null-safe inequality (null equals null)."""
    differs: np.ndarray = mask(pc.not_equal(a, b)) | (mask(a.is_null()) != mask(b.is_null()))
    return differs


def refill_toast(staged: pa.Table, old: dict[str, pa.Array | pa.ChunkedArray],
                 new: dict[str, pa.Array | pa.ChunkedArray], columns: Sequence[str], identity: Sequence[str],
                 has_old: np.ndarray, has_full_old: np.ndarray,
                 ) -> tuple[dict[str, pa.Array | pa.ChunkedArray], dict[str, np.ndarray]]:
    """``resolve_toast_from_old`` over ``columns`` of the staged changes: a column a change lists as unchanged
    TOAST takes the old image's value where the old image holds it (every column of a full old image, the
    ``identity`` columns of a key-only one); elsewhere the target keeps its own. Returns each column's values
    and where the value stays unknown (kept)."""
    toast = staged.column("new_unchanged_toast").combine_chunks()
    listed_rows = np.asarray(pc.list_parent_indices(toast).to_numpy(zero_copy_only=False), dtype=np.int64)
    listed_names = np.asarray(pc.list_flatten(toast).to_numpy(zero_copy_only=False), dtype=object)
    n = staged.num_rows
    ident = set(identity)
    values_of: dict[str, pa.Array | pa.ChunkedArray] = {}
    keep_of: dict[str, np.ndarray] = {}
    for c in columns:
        listed = np.zeros(n, dtype=bool)
        if len(listed_rows):
            listed[listed_rows[listed_names == c]] = True
        fillable = has_old if c in ident else has_full_old
        fill = listed & fillable
        values_of[c] = pc.if_else(pa.array(fill), old[c], new[c]) if fill.any() and c in old else new[c]
        keep_of[c] = listed & ~fillable
    return values_of, keep_of


def absent_columns(absent: pa.ChunkedArray, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """Per written column, the staged changes whose schema version lacks it (``versions.ABSENT``): an UPDATE leaves
    such a column alone, so it joins the UPDATE's keep list."""
    lists = absent.combine_chunks()
    rows = np.asarray(pc.list_parent_indices(lists).to_numpy(zero_copy_only=False), dtype=np.int64)
    names = np.asarray(pc.list_flatten(lists).to_numpy(zero_copy_only=False), dtype=object)
    out = {}
    for c in columns:
        lacking = np.zeros(len(lists), dtype=bool)
        lacking[rows[names == c]] = True
        out[c] = lacking
    return out


@dataclass(frozen=True)
class Net:
    """One row per key, in the columns of ``transforms.compact`` (the moved-from key split per key column)."""

    kind: pa.Array  # D, I, U, R
    keep: pa.Array  # list<string>: columns the target keeps (unchanged TOAST no event of the key knows)
    lsn: pa.Array
    from_key: list[pa.Array]  # the old key of a row that arrived by a key change (I/R only)
    touched: pa.Array  # the key's row changed in the batch before a key change moved it away
    columns: list[pa.Array]  # the written columns, in their order (key values from the key's events)
    keys: list[pa.Array] = field(default_factory=list)  # each key column's value per row (the group's key)

    def table(self, key: Sequence[str], columns: Sequence[str]) -> pa.Table:
        """As a table named like ``SparkBatchChanges.net``'s frame: kind, keep, lsn, from0…, touched, columns."""
        names = ["kind", "keep", "lsn", *[f"from{i}" for i in range(len(key))], "touched", *columns]
        return pa.table([self.kind, self.keep, self.lsn, *self.from_key, self.touched, *self.columns], names=names)

    def take(self, rows: np.ndarray) -> Net:
        """These rows (indices) only."""
        idx = pa.array(rows, pa.int64())
        return Net(kind=self.kind.take(idx), keep=self.keep.take(idx), lsn=self.lsn.take(idx),
                   from_key=[a.take(idx) for a in self.from_key], touched=self.touched.take(idx),
                   columns=[a.take(idx) for a in self.columns], keys=[a.take(idx) for a in self.keys])


@dataclass(frozen=True)
class Events:
    """The key events of staged changes (``to_key_events``): one per change, a second (the DELETE of the old key,
    ``away``) per key change, the changes' events first; ``source`` is each event's staged row."""

    key: list[pa.Array]  # each key column's value per event, in the new image's type
    source: np.ndarray
    away: np.ndarray
    kind: np.ndarray  # D, I, U per event
    sub: np.ndarray  # 0 for a DELETE and the old half of a key change, 1 otherwise
    moved: np.ndarray  # per staged row: an UPDATE that changes its key
    old: dict[str, pa.Array | pa.ChunkedArray]
    values_of: dict[str, pa.Array | pa.ChunkedArray]  # each written column, unchanged TOAST refilled
    keep_of: dict[str, np.ndarray]  # per written column, where its value stays unknown (kept)


def key_events(staged: pa.Table, key: Sequence[str], columns: Sequence[str], identity: Sequence[str]) -> Events:
    """The TOAST refill and the key events of staged changes (``STAGED_COLUMNS``, in one chunk): each event's key
    is its change's old key (a DELETE, an UPDATE that keeps its key) or its refilled new key (an INSERT, the new
    half of a key change), the away event's the old key. Per change: a change's events do not depend on others."""
    n = staged.num_rows
    op = staged.column("op")
    is_d, is_i, is_u = (mask(pc.equal(op, letter)) for letter in ("D", "I", "U"))
    old_image = staged.column("old").chunk(0) if n else pa.array([], staged.schema.field("old").type)
    new_image = staged.column("new").chunk(0) if n else pa.array([], staged.schema.field("new").type)
    old = fields(old_image, columns)
    new = fields(new_image, columns)
    has_old = mask(old_image.is_valid())
    has_full_old = has_old & ~mask(staged.column("old_key_only"))

    values_of, keep_of = refill_toast(staged, old, new, columns, identity, has_old, has_full_old)
    if "absent" in staged.column_names:  # several schema versions (``versions.conform``): ``transforms._kept``
        for c, lacking in absent_columns(staged.column("absent"), columns).items():
            keep_of[c] = keep_of[c] | (is_u & lacking)

    # to_key_events: a key change is an UPDATE whose old key differs (null-safe) from its new key.
    moved = is_u & has_old
    if key:
        differs = np.zeros(n, dtype=bool)
        for k in key:
            differs |= _differs(old[k], values_of[k])  # the new key as refilled: an unchanged TOAST key column
        moved &= differs
    else:
        moved[:] = False
    key_from_old = is_d | (is_u & has_old & ~moved)
    away_rows = np.flatnonzero(moved)
    m = len(away_rows)
    away_idx = pa.array(away_rows, pa.int64())
    return Events(
        key=[pa.concat_arrays([pc.if_else(pa.array(key_from_old), old[k], values_of[k]).cast(new[k].type),
                               pc.take(old[k], away_idx).cast(new[k].type)]) for k in key],
        source=np.concatenate([np.arange(n), away_rows]),
        away=np.concatenate([np.zeros(n, dtype=bool), np.ones(m, dtype=bool)]),
        kind=np.concatenate([np.where(is_d, "D", np.where(is_i | moved, "I", "U")), np.full(m, "D")]),
        sub=np.concatenate([np.where(is_d, 0, 1), np.zeros(m, dtype=np.int64)]).astype(np.int64),
        moved=moved, old=old, values_of=values_of, keep_of=keep_of)


def compact_changes(staged: pa.Table, key: Sequence[str], columns: Sequence[str],
                    identity: Sequence[str]) -> Net:
    """Staged changes of one table-batch (``STAGED_COLUMNS``, of one schema's types) → its net change per key.

    ``key``: the apply key; ``columns``: the written columns (every one in the images); ``identity``: the
    source's replica identity columns, which a key-only old image holds (filling unchanged TOAST from it)."""
    staged = staged.combine_chunks()
    events = key_events(staged, key, columns, identity)
    old, values_of, keep_of, moved = events.old, events.values_of, events.keep_of, events.moved
    source, away, ev_kind, sub, ev_key = events.source, events.away, events.kind, events.sub, events.key
    ev_d = ev_kind == "D"
    n = staged.num_rows
    m = len(source) - n
    commit = staged.column("commit_lsn").to_numpy()[source]
    order = staged.column("tx_order").to_numpy()[source]
    lsn = staged.column("lsn").to_numpy()[source]

    # One sort: each key's events become one run, in event order (seq = commit, order, sub, lsn).
    e = n + m
    sort_table = pa.table([*ev_key, pa.array(commit), pa.array(order), pa.array(sub), pa.array(lsn)],
                          names=[*[f"k{i}" for i in range(len(key))], "c", "o", "s", "l"])
    perm = np.asarray(pc.sort_indices(sort_table, sort_keys=[(name, "ascending", "at_start")
                                                             for name in sort_table.column_names]).to_numpy(),
                      dtype=np.int64)
    sorted_keys = [pc.take(k, pa.array(perm)) for k in ev_key]
    start = np.zeros(e, dtype=bool)
    if e:
        start[0] = True
        for k in sorted_keys:
            start[1:] |= _differs(k.slice(1), k.slice(0, e - 1))
    starts = np.flatnonzero(start)
    ends = np.append(starts[1:], e)
    group = np.cumsum(start) - 1
    pos = np.arange(e)
    s_d, s_away, s_source = ev_d[perm], away[perm], source[perm]
    seq = [commit[perm], order[perm], sub[perm], lsn[perm]]

    if e:
        last_d = np.maximum.reduceat(np.where(s_d, pos, -1), starts)
        last_away = np.maximum.reduceat(np.where(s_away, pos, -1), starts)
    else:
        last_d = last_away = np.zeros(0, dtype=np.int64)
    first_after = np.maximum(last_d + 1, starts)  # events after the key's last DELETE are the run's tail
    n_after = ends - first_after
    after = pos >= first_after[group]
    kind = np.where(n_after == 0, "D", np.where(last_d >= 0, "R",
                                                 np.where(ev_kind[perm][np.minimum(first_after, e - 1)] == "I",
                                                          "I", "U")))
    # touched: the key's last away event comes later than its first event (seq strictly greater).
    la = np.maximum(last_away, 0)
    later = np.zeros(len(starts), dtype=bool)
    for part in seq:
        later |= part[la] != part[starts]
    touched = (last_away >= 0) & later

    # Values: each column from the last event after the last DELETE that knows it (not in its keep list).
    value_columns = [c for c in columns if c not in key]
    out: list[pa.Array] = []
    unknown: dict[str, np.ndarray] = {}
    for c in columns:
        if c in key:
            out.append(pc.take(sorted_keys[list(key).index(c)], pa.array(starts, pa.int64())))
            continue
        known = after & ~s_d & ~keep_of[c][s_source]
        winner = np.maximum.reduceat(np.where(known, pos, -1), starts) if e else np.zeros(0, dtype=np.int64)
        rows = s_source[np.maximum(winner, 0)] if e else np.zeros(0, dtype=np.int64)
        out.append(pc.take(values_of[c], pa.array(rows, pa.int64(), mask=winner < 0)))
        unknown[c] = winner < 0

    # FROM: the moved-from key of the key's first event after its last DELETE, for a row that arrives (I/R).
    first_event = np.minimum(first_after, max(e - 1, 0))
    first = s_source[first_event] if e else np.zeros(0, dtype=np.int64)
    arrives = (kind == "I") | (kind == "R")
    from_rows = pa.array(first, pa.int64(), mask=~(arrives & moved[first] & ~s_away[first_event]) if e else None)
    return Net(kind=pa.array(kind, pa.string()), keep=_keep_lists(kind == "D", value_columns, unknown),
               lsn=pa.array(lsn[perm][ends - 1] if e else [], pa.int64()),
               from_key=[pc.take(old[k], from_rows) for k in key],
               touched=pa.array(touched, pa.bool_()), columns=out,
               keys=[pc.take(k, pa.array(starts, pa.int64())) for k in sorted_keys])


def _keep_lists(deleted: np.ndarray, value_columns: Sequence[str], unknown: dict[str, np.ndarray]) -> pa.Array:
    """Per key, the value columns no event after its last DELETE knows (in column order); empty for a DELETE."""
    groups = len(deleted)
    if not value_columns:
        return pa.ListArray.from_arrays(pa.array(np.zeros(groups + 1, dtype=np.int32)), pa.array([], pa.string()))
    matrix = np.stack([unknown[c] for c in value_columns], axis=1) & ~deleted[:, None]  # groups × columns
    offsets = np.zeros(groups + 1, dtype=np.int32)
    np.cumsum(matrix.sum(axis=1), out=offsets[1:])
    names = np.asarray(value_columns, dtype=object)[np.nonzero(matrix)[1]]  # row-major: per key, column order
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(names, pa.string()))
