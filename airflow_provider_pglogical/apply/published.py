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
operation rewritten, everything else as staged. ``kernels.compact_changes`` then refills TOAST
(``kernels.refill_toast``, which the filter's new images go through too) and nets them as it nets unfiltered
changes, exactly as ``to_key_events`` and ``compact`` follow ``published_changes`` in Spark. The filter is
evaluated by ``filter_columns``, over whole columns where that is exact and per row by ``filter_eval`` elsewhere;
``NotCovered`` when it or a value leaves the covered subset leaves the batch to Spark. The column list is the
target's business (the written columns), as in Spark.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.apply import kernels
from airflow_provider_pglogical.apply.filter_columns import compile_matcher
from airflow_provider_pglogical.apply.filter_eval import NotCovered

ACTIONS = ("insert", "update", "delete")
_OP_OF = {"insert": "I", "update": "U", "delete": "D"}
_LETTERS = ("", "I", "U", "D")  # a change's operation as a small code: its index here


def transforms(row_filter: str | None, actions: Sequence[str]) -> bool:
    """Whether the publication drops or rewrites any change: a row filter, or an action left out."""
    return bool(row_filter) or not set(ACTIONS) <= set(actions)


def publish(staged: pa.Table, *, row_filter: str | None, actions: Sequence[str], identity: Sequence[str]) -> pa.Table:
    """The staged changes the publication sends, their ``op`` rewritten by the filter (module docstring);
    ``identity``: the source's replica identity columns, which a key-only old image holds. NotCovered when the
    filter cannot be evaluated here."""
    if not transforms(row_filter, actions):
        return staged
    n = staged.num_rows  # read chunk by chunk (the staged row groups): nothing is copied but the rows kept
    op = staged.column("op")
    is_i, is_u, is_d = (kernels.mask(pc.equal(op, letter)) for letter in _LETTERS[1:])
    published = {_OP_OF[a] for a in actions if a in _OP_OF}
    code = np.zeros(n, dtype=np.int8)  # an index into _LETTERS; 0: not sent
    for letter, where in zip(_LETTERS[1:], (is_i, is_u, is_d), strict=True):
        if letter in published:
            code[where] = _LETTERS.index(letter)
    if row_filter and n:
        old_match, new_match = _matches(staged, row_filter, identity)
        has_old = kernels.mask(staged.column("old").is_valid())
        sent = code != 0
        i, u, d = _LETTERS.index("I"), _LETTERS.index("U"), _LETTERS.index("D")
        code = np.select(
            [is_i, is_d, is_u & ~has_old, is_u & old_match & new_match, is_u & new_match, is_u & old_match],
            [np.where(new_match, i, 0), np.where(old_match, d, 0), np.where(new_match, u, 0), u, i, d],
            default=0).astype(np.int8)
        code[~sent] = 0
    keep = code != 0
    if keep.all() and not row_filter:
        return staged
    out = staged.filter(pa.array(keep))
    letters = pa.array(_LETTERS, out.schema.field("op").type)
    return out.set_column(out.schema.get_field_index("op"), "op", letters.take(pa.array(code[keep])))


def _matches(staged: pa.Table, row_filter: str, identity: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Which old and which (TOAST-refilled, ``kernels.refill_toast``) new images the filter selects."""
    old, new = staged.column("old"), staged.column("new")
    if not isinstance(new.type, pa.StructType) or not isinstance(old.type, pa.StructType):
        raise NotCovered("images that are not structs")
    new_types = {new.type.field(i).name: new.type.field(i).type for i in range(new.type.num_fields)}
    old_types = {old.type.field(i).name: old.type.field(i).type for i in range(old.type.num_fields)}
    compiled = compile_matcher(row_filter, new_types)
    if any(old_types.get(c) != new_types[c] for c in compiled.columns):
        raise NotCovered("an old image without a filter column of the new image's type")
    columns = compiled.columns
    if not columns:  # a filter of constants: nothing to refill
        return compiled.matches(old), compiled.matches(new)
    has_old = kernels.mask(old.is_valid())
    has_full_old = has_old & ~kernels.mask(staged.column("old_key_only"))
    values, _ = kernels.refill_toast(staged, kernels.fields(old, columns), kernels.fields(new, columns), columns,
                                     identity, has_old, has_full_old)
    # The filter's columns only, in one piece each (a null new image, a DELETE's, reads as nulls).
    refilled = pa.StructArray.from_arrays([_whole(values[c]) for c in columns], names=list(columns))
    return compiled.matches(old), compiled.matches(refilled)


def _whole(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
