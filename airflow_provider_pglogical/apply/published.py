"""A small table-batch's staged changes as its publication sends them, in this process: actions and row filter.

The Spark path's ``changes.published_changes`` runs, per change and before any netting: ``filter_actions`` (a change
whose original operation is not published is dropped), ``resolve_toast_from_old`` (an unchanged-TOAST value the
old image holds is the new value, which the filter then sees), and ``filters.apply_row_filter`` (pgoutput's
``pgoutput_row_filter``, semantics §6):

* an INSERT is kept when its new image matches, a DELETE when its old image matches;
* an UPDATE with an old image becomes an UPDATE (old and new match), an INSERT (only the new one), a DELETE
  (only the old one) or nothing; one without an old image (its key unchanged, RI DEFAULT/INDEX) is kept as an
  UPDATE when its new image matches; NULL counts as no match.

``publish`` is those steps over the staged Arrow columns (``kernels.STAGED_COLUMNS``): the rows that stay, their
operation rewritten, everything else as staged — ``kernels.compact_changes`` then refills TOAST and nets them as it
nets unfiltered changes, exactly as ``to_key_events`` and ``compact`` follow ``published_changes`` in Spark. The
filter is evaluated by ``filter_eval`` (``NotCovered`` when it or a value leaves the covered subset: the caller
then leaves the batch to Spark). The column list is the target's business (the written columns), as in Spark.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.apply.filter_eval import NotCovered, compile_filter

ACTIONS = ("insert", "update", "delete")
_OP_OF = {"insert": "I", "update": "U", "delete": "D"}


def transforms(row_filter: str | None, actions: Sequence[str]) -> bool:
    """Whether the publication drops or rewrites any change: a row filter, or an action left out."""
    return bool(row_filter) or not set(ACTIONS) <= set(actions)


def publish(staged: pa.Table, *, row_filter: str | None, actions: Sequence[str], identity: Sequence[str]) -> pa.Table:
    """The staged changes the publication sends, their ``op`` rewritten by the filter (module docstring);
    ``identity``: the source's replica identity columns, which a key-only old image holds. NotCovered when the
    filter cannot be evaluated here."""
    if not transforms(row_filter, actions):
        return staged
    staged = staged.combine_chunks()
    n = staged.num_rows
    op = np.asarray(staged.column("op").to_numpy(zero_copy_only=False), dtype=object)
    keep = np.isin(op, [_OP_OF[a] for a in actions if a in _OP_OF])
    if row_filter and n:
        old = staged.column("old").chunk(0)
        new = staged.column("new").chunk(0)
        old_match, new_match = _matches(staged, old, new, row_filter, identity)
        has_old = np.asarray(old.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        is_i, is_d, is_u = op == "I", op == "D", op == "U"
        rewritten = np.select(
            [is_i, is_d, is_u & ~has_old, is_u & old_match & new_match, is_u & new_match, is_u & old_match],
            [np.where(new_match, "I", ""), np.where(old_match, "D", ""), np.where(new_match, "U", ""),
             "U", "I", "D"], default="").astype(object)
        keep &= rewritten != ""
        op = rewritten
    if keep.all() and not row_filter:
        return staged
    index = pa.array(np.flatnonzero(keep), pa.int64())
    out = staged.take(index)
    return out.set_column(out.schema.get_field_index("op"), "op",
                          pa.array(op[keep], out.schema.field("op").type))


def _matches(staged: pa.Table, old: pa.StructArray, new: pa.StructArray, row_filter: str,
             identity: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Which old and which (TOAST-refilled) new images the filter selects."""
    if not isinstance(new.type, pa.StructType) or not isinstance(old.type, pa.StructType):
        raise NotCovered("images that are not structs")
    new_types = {new.type.field(i).name: new.type.field(i).type for i in range(new.type.num_fields)}
    old_types = {old.type.field(i).name: old.type.field(i).type for i in range(old.type.num_fields)}
    compiled = compile_filter(row_filter, new_types)
    if any(old_types.get(c) != new_types[c] for c in compiled.columns):
        raise NotCovered("an old image without a filter column of the new image's type")
    return compiled.matches(old), compiled.matches(_refilled(staged, old, new, compiled.columns, identity))


def _refilled(staged: pa.Table, old: pa.StructArray, new: pa.StructArray, columns: Sequence[str],
              identity: Sequence[str]) -> pa.StructArray:
    """The new image's ``columns`` with unchanged-TOAST values taken from the old image where it holds them
    (``resolve_toast_from_old``: every column of a full old image, the identity columns of a key-only one)."""
    if not columns:  # a filter of constants: nothing to refill
        return new
    n = len(new)
    toast = staged.column("new_unchanged_toast").combine_chunks()
    rows = np.asarray(pc.list_parent_indices(toast).to_numpy(zero_copy_only=False), dtype=np.int64)
    names = np.asarray(pc.list_flatten(toast).to_numpy(zero_copy_only=False), dtype=object)
    has_old = np.asarray(old.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    key_only = np.asarray(pc.fill_null(staged.column("old_key_only").combine_chunks(), False)
                          .to_numpy(zero_copy_only=False), dtype=bool)
    has_full_old = has_old & ~key_only
    old_fields = dict(zip([old.type.field(i).name for i in range(old.type.num_fields)], old.flatten(), strict=True))
    new_fields = dict(zip([new.type.field(i).name for i in range(new.type.num_fields)], new.flatten(), strict=True))
    arrays = []
    for c in columns:
        listed = np.zeros(n, dtype=bool)
        listed[rows[names == c]] = True
        fill = listed & (has_old if c in identity else has_full_old)
        arrays.append(pc.if_else(pa.array(fill), old_fields[c], new_fields[c]) if fill.any() else new_fields[c])
    return pa.StructArray.from_arrays(arrays, names=list(columns), mask=new.is_null())
