"""Several independent table-batches ("cases") staged as one batch, so a property test that compares
with Spark pays a Spark query's fixed cost (planning, code generation, scheduling: 0.2–1 s) once for several cases
rather than once per case, which is most of what a few-row case costs.

Each case keeps its own rows; in the union every image also carries the case's number in a column ``CASE``, which is
part of the table's replica identity and is appended to the apply key, and each case's transactions get LSNs of their
own (case ``c`` commits after case ``c - 1``, as in a real batch where no two changes share a position). Every
netting step groups by the whole key, so no change of one case can meet another case's: a case's rows out of the
union, with ``CASE`` and its from-key column taken away, are the rows its own batch gives. ``by_case`` splits them
back, and a property compares each case on its own, naming the case that differs.

A case's own batch (``write_case``, for the in-process side of a comparison) gets the same shifted LSNs and no
``CASE`` column: it is exactly the batch the case's strategy drew, later in the WAL.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_provider_pglogical.apply.batches import Batch, has_unchanged_toast, keys_never_repeat, list_batches
from airflow_provider_pglogical.apply.targets.base import PlannedTable, from_column
from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch

CASE = "case_id"
# Commit LSNs of case c start at c * LSN_STRIDE; the strategies here commit well below it.
LSN_STRIDE = 1_000_000


def with_case(rel: Rel) -> Rel:
    """``rel`` with the case column last, part of its replica identity."""
    return replace(rel, columns=(*rel.columns, Col(CASE, pa.int64(), "bigint", True)))


def case_key(key: Sequence[str]) -> tuple[str, ...]:
    """The apply key of the union: the case's key, then the case number."""
    return (*key, CASE)


def shifted(changes: Iterable[Chg], case: int) -> list[Chg]:
    """The changes of case ``case`` with their LSNs moved after the earlier cases'."""
    return [replace(c, commit_lsn=c.commit_lsn + case * LSN_STRIDE) for c in changes]


def _tag(image: dict[str, Any] | None, case: int) -> dict[str, Any] | None:
    return None if image is None else {**image, CASE: case}


def tagged(changes: Iterable[Chg], case: int) -> list[Chg]:
    """The changes of case ``case`` as the union stages them: shifted LSNs, ``CASE`` in every image."""
    return [replace(c, new=_tag(c.new, case), old=_tag(c.old, case)) for c in shifted(changes, case)]


def _only_batch(root: str | os.PathLike[str], spec: BatchSpec) -> Batch:
    write_batch(root, "slot", spec)
    (batch,) = list_batches(str(root), "slot")
    return batch


def write_union(root: str | os.PathLike[str], rel: Rel, cases: Mapping[int, Sequence[Chg]]) -> Batch:
    """One staged batch of ``with_case(rel)`` holding every case's tagged changes."""
    changes = [c for case, chs in cases.items() for c in tagged(chs, case)]
    return _only_batch(Path(root) / "union", BatchSpec(0, (max(cases, default=0) + 1) * LSN_STRIDE, {with_case(rel): changes}))


def write_case(root: str | os.PathLike[str], rel: Rel, changes: Sequence[Chg], case: int) -> Batch:
    """The case's own staged batch of ``rel`` (shifted LSNs, no case column)."""
    return _only_batch(Path(root) / f"case{case}",
                       BatchSpec(case * LSN_STRIDE, (case + 1) * LSN_STRIDE, {rel: shifted(changes, case)}))


def by_case(rows: Iterable[Mapping[str, Any]], key: Sequence[str] | None = None) -> dict[int, list[tuple]]:
    """Rows of the union (by column name) per case, without ``CASE`` and, when ``key`` (the case's own key) is
    given, without the case's from-key column ``from_column(len(key))``; each case's rows sorted."""
    drop = {CASE} | ({from_column(len(key))} if key is not None else set())
    out: dict[int, list[tuple]] = {}
    for row in rows:
        out.setdefault(row[CASE], []).append(tuple(v for k, v in row.items() if k not in drop))
    return {case: sorted(found, key=repr) for case, found in out.items()}


def union_branches(union: Batch, table: PlannedTable) -> str:
    """Which of Spark's whole-batch plans the union's net frame takes (``SparkBatchChanges.net``): compaction or
    not (some key of the union repeats), TOAST refill or not (some change lists an unchanged-TOAST value). A
    hypothesis ``event``, so a run's statistics show both sides of each reached."""
    unique = bool(table.key) and keys_never_repeat(union, table.source, table.key,
                                                   full_identity=table.relation.replica_identity == "f")
    return f"Spark union: {'no compaction' if unique else 'compaction'}, " \
           f"{'TOAST refill' if has_unchanged_toast(union, table.source) else 'no TOAST refill'}"


def rows_of(frame: Any) -> list[tuple]:
    """A Spark frame's rows as tuples, sorted (an order-free comparison)."""
    return sorted((tuple(r) for r in frame.collect()), key=repr)
