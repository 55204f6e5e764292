"""Mirror mode, pure Arrow: one batch's net changes of one table + the target rows they touch → the rows to write.

Input is the shared transforms' output (``transforms.compact``) as Arrow — ``_pgl_kind`` (D, I, U, R), ``_pgl_keep``
(columns whose value the target keeps: unchanged TOAST), ``_pgl_lsn``, ``_pgl_from``, then the written columns —
and ``base``, the target's current rows at the batch's keys. The result (``NetWrite``) is what the copy-on-write
commit (``target.py``) does: remove the rows at ``replaced`` keys, add ``rows``. The rules are the Delta MERGE's
(docs/delta.md, Mode mirror), i.e. a native subscriber's:

* ``D`` → the row at its key goes (nothing when missing);
* ``U`` → the row at its key is replaced by the new values, each column in ``_pgl_keep`` taking the row's value
  (never NULL); nothing when missing (native skips it);
* ``I``/``R`` → inserted; an existing row at its key is replaced, kept columns taking its value;
* after a TRUNCATE at an earlier position (``truncated``) the caller empties the table and ``base`` is empty:
  only ``I``/``R`` rows remain;
* table columns the batch does not write (a column its source dropped, one added by another tool) keep the
  row's value on replacement and are NULL on insert, as a MERGE leaves them.

A kept value that exists nowhere (an ``R`` row, or an ``I`` row with no row at its key) is refused
(``UnresolvableToastError``) or the change rejected, as in the Delta target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.apply.targets.delta.mirror import Key, Reject, key_tuples, reject
from airflow_provider_pglogical.apply.transforms import KEEP, KIND, LSN


@dataclass
class NetWrite:
    """What one table-batch commit does: remove the target rows at ``replaced``, then add ``rows``."""

    rows: pa.Table
    replaced: set[Key]
    counts: dict[str, int] = field(default_factory=dict)
    rejects: list[Reject] = field(default_factory=list)


def key_mask(table: pa.Table, key: Sequence[str], keys: set[Key]) -> pa.Array:
    """Per row of ``table``: whether its key is one of ``keys`` (NULL equals NULL: REPLICA IDENTITY FULL keys)."""
    if not keys or not table.num_rows:
        return pa.array(np.zeros(table.num_rows, dtype=bool))
    if len(key) == 1:  # vectorised: a hash set in Arrow, which matches a NULL to a NULL in the set
        column = table.column(key[0])
        return pc.fill_null(pc.is_in(column, value_set=pa.array([k[0] for k in keys], column.type)), False)
    return pa.array([t in keys for t in key_tuples(table, key)], pa.bool_())


def plan_net(net: pa.Table, base: pa.Table, key: Sequence[str], columns: Sequence[str], table_columns: Sequence[str],
             *, where: str, target: str, unchanged_toast: str) -> NetWrite:
    """The rows the batch leaves at its keys (see the module docstring). ``net`` and ``base`` are typed alike;
    ``base`` holds every column of ``table_columns`` (the Iceberg table's), ``net`` the written ``columns``."""
    present = {k: i for i, k in enumerate(key_tuples(base, key))}
    kinds = net.column(KIND).to_pylist()
    keeps = net.column(KEEP).to_pylist()
    lsns = net.column(LSN).to_pylist()
    keys = key_tuples(net, key)
    out: list[int] = []  # net row of each written row
    at: list[int | None] = []  # its base row (None: a new key)
    kept: list[list[str]] = []
    replaced: set[Key] = set()
    rejects: list[Reject] = []
    deleted = 0
    for i, (kind, keep, lsn, k) in enumerate(zip(kinds, keeps, lsns, keys, strict=True)):
        row = present.get(k)
        if kind == "D":
            if row is not None:
                replaced.add(k)
                deleted += 1
            continue
        if kind == "U" and row is None:
            continue  # native: "did not find row to be updated"
        keep = [c for c in keep or () if c in columns]
        if keep and kind in ("I", "R") and (kind == "R" or row is None):
            reject(where, target, unchanged_toast, k, key, lsn, keep, rejects)
            continue
        if row is not None:
            replaced.add(k)
        out.append(i)
        at.append(row)
        kept.append(keep)
    written = net.take(pa.array(out, pa.int64())) if out else net.slice(0, 0)
    base_rows = pa.array(at, pa.int64())
    arrays = []
    for c in table_columns:
        ftype = base.schema.field(c).type
        from_base = base.column(c).take(base_rows) if base.num_rows else pa.nulls(len(out), ftype)
        if c not in columns:
            arrays.append(from_base)  # not written by the batch: the row's value, NULL for a new row
            continue
        values = written.column(c).cast(ftype)
        rows = [j for j, keep in enumerate(kept) if c in keep]
        if rows:
            mask = np.zeros(len(out), dtype=bool)
            mask[rows] = True
            values = pc.if_else(pa.array(mask), from_base, values)
        arrays.append(values)
    result = pa.Table.from_arrays(arrays, schema=pa.schema([base.schema.field(c) for c in table_columns]))
    updated = sum(1 for row in at if row is not None)
    counts = {"inserted": len(out) - updated, "updated": updated, "deleted": deleted}
    return NetWrite(result, replaced, counts, rejects)
