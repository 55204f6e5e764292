"""A mirror's table-batch collected whole for a lake target (Delta, Iceberg): the steps both run before their commit.

The net frame is collected as Arrow on the driver, the runner's flat moved-from key columns become the ``FROM``
struct (``delta/mirror.with_from``), exactness notes are unwrapped (a noted value in a written row is the lake's
typed error, naming column and LSN), the planned source schema changes reach the table before its data, and the
batch's ordered changes are offered, shaped alike, for a table that must replay them (a moved row keeping an
unchanged TOAST value). The target's ``apply_net`` then decides the rows and commits them with the watermark.
A target that reads the direct path's rows (``lake/direct.py``) gets a covered table-batch's net rows from its
staged files instead of Spark's frame, through the same steps; one netted in key partitions streams them into the
target's streamed commit from their spill files (``lake/parts.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import pyarrow as pa

from airflow_provider_pglogical.apply.targets.base import (
    BatchChanges,
    DirectNet,
    DirectNetSource,
    PlannedBatch,
    PlannedTable,
    StagedRowsSource,
)
from airflow_provider_pglogical.apply.targets.delta.mirror import with_from
from airflow_provider_pglogical.apply.targets.delta.types import Lake, unwrap_notes
from airflow_provider_pglogical.apply.targets.lake import direct as lake_direct
from airflow_provider_pglogical.apply.targets.lake import parts as lake_parts
from airflow_provider_pglogical.apply.targets.lake import stream
from airflow_provider_pglogical.apply.targets.lake.stream import NetSummary
from airflow_provider_pglogical.apply.transforms import LSN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

Outcome = TypeVar("Outcome", covariant=True)


class LakeMirror(Protocol[Outcome]):
    """A lake target's side of the collected net apply."""

    @property
    def lake(self) -> Lake: ...

    def follow_schema(self, table: PlannedTable, data: pa.Table, where: str) -> None: ...

    def apply_net(self, target: str, start_lsn: int, end_lsn: int, net: pa.Table, *, key: Sequence[str],
                  columns: Sequence[str], type_names: Mapping[str, str | None], truncated: bool,
                  unchanged_toast: str = "fail", ordered: Callable[[], pa.Table] | None = None,
                  null_safe_key: bool = False) -> Outcome: ...


def null_safe_key(table: PlannedTable) -> bool:
    """Whether the key may hold NULLs: REPLICA IDENTITY FULL keyed by all its columns (no configured key)."""
    return table.relation.replica_identity == "f" and not table.config.key_columns


def prepared(table: PlannedTable, rows: pa.Table, where: str, lake: Lake) -> pa.Table:
    """Collected changes of ``table`` (all, or one bucket) shaped as ``apply_net`` reads them."""
    return unwrap_notes(with_from(rows, table.key), f"{where}: {table.target}", LSN, lake=lake)


def collected(table: PlannedTable, frame: DataFrame, where: str, lake: Lake) -> pa.Table:
    """``frame`` (the net or ordered changes of ``table``) on the driver, shaped as ``apply_net`` reads it."""
    return prepared(table, stream.arrow(frame), where, lake)


def apply_collected(target: LakeMirror[Outcome], table: PlannedTable, plan: PlannedBatch, changes: BatchChanges,
                    frame: DataFrame, seconds: dict[str, float]) -> Outcome:
    """``table``'s net changes ``frame`` collected whole and applied by ``target`` in its one commit of the batch;
    ``seconds`` gains the time spent collecting ("stage") and applying ("apply")."""
    return apply_rows(target, table, plan, changes, frame.toArrow, seconds)


def apply_rows(target: LakeMirror[Outcome], table: PlannedTable, plan: PlannedBatch, changes: BatchChanges,
               rows: Callable[[], pa.Table], seconds: dict[str, float]) -> Outcome:
    """``apply_collected`` of net changes ``rows`` gives as Arrow in the net frame's layout (Spark's frame collected,
    or the staged files read by ``lake/direct.py``)."""
    where = f"batch {plan.start_lsn:X}-{plan.end_lsn:X}"
    started = time.monotonic()
    net = prepared(table, rows(), where, target.lake)
    seconds["stage"] += time.monotonic() - started
    started = time.monotonic()
    target.follow_schema(table, net, where)
    outcome = target.apply_net(
        table.target, plan.start_lsn, plan.end_lsn, net, key=table.key, columns=table.columns,
        type_names=table.type_names(), truncated=table.truncated_at is not None,
        unchanged_toast=table.unchanged_toast, ordered=lambda: collected(table, changes.ordered(table), where,
                                                                         target.lake),
        null_safe_key=null_safe_key(table))
    seconds["apply"] += time.monotonic() - started
    return outcome


def apply_mirror(target: LakeMirror[Outcome], table: PlannedTable, plan: PlannedBatch, changes: BatchChanges,
                 seconds: dict[str, float], bucket_rows: Sequence[int | None],
                 streamed: Callable[[stream.NetChunks, NetSummary], Outcome], *, direct: bool = False) -> Outcome:
    """``table``'s net changes in the batch, by the rule both lake targets follow: ``streamed`` (bucket by bucket
    from Spark, ``lake/stream.py``) when some bound of ``bucket_rows`` is worth streaming for what the table-batch
    staged and no change needs the whole table's changes, else collected whole (``apply_collected``, the
    reference). The net frame stays cached for the summary and every bucket while ``streamed`` runs.

    ``direct``: the target reads a table-batch the direct path covers from its staged files (``lake/direct.py``)
    when it would be collected whole anyway, and streams it from them otherwise (``lake/parts.py``; one netted in
    key partitions whatever its size); Spark is not asked for it (nor started for it), of several
    schema versions too (their union, ``apply/versions.py``). A table-batch with no published change goes to Spark."""
    staged = changes.staged_rows(table) if isinstance(changes, StagedRowsSource) else None
    whole = not table.key or not any(stream.worth_streaming(rows, staged) for rows in bucket_rows)
    found = changes.direct_net(table) if direct and isinstance(changes, DirectNetSource) else None
    # covered but not collected whole: streamed from spill files of the net rows read here, not from Spark, which
    # would read the staged changes again (``direct_net`` has just read them to judge the batch)
    if (found is not None and table.key and (found.partitions > 1 or not whole)
            and lake_direct.readable(found)):
        outcome = _apply_partitioned(found, table, seconds, streamed)
        if outcome is not None:
            return outcome
    elif found is not None and whole:
        started = time.monotonic()
        rows = lake_direct.net_table(found)
        seconds["stage"] += time.monotonic() - started
        if rows is not None:
            log.debug("%s: %d net changes read straight from the staged files%s", table.target, rows.num_rows,
                      " and netted in this process" if found.compacted else "")
            return apply_rows(target, table, plan, changes, lambda: rows, seconds)
    frame = changes.net(table)
    if whole:
        return apply_collected(target, table, plan, changes, frame, seconds)
    started = time.monotonic()
    frame = frame.persist()  # read by the summary and by every bucket
    try:
        summary = stream.summarise(frame, table.columns)
        seconds["stage"] += time.monotonic() - started
        if summary.needs_collected:
            return apply_collected(target, table, plan, changes, frame, seconds)
        return streamed(stream.frame_chunks(frame, table.key, summary.rows), summary)
    finally:
        frame.unpersist()


def _apply_partitioned(found: DirectNet, table: PlannedTable, seconds: dict[str, float],
                       streamed: Callable[[stream.NetChunks, NetSummary], Outcome]) -> Outcome | None:
    """A table-batch the direct path covers, its net rows read in this process (netted in key partitions, in one
    piece, or a staged row group at a time) and streamed into the target's commit from spill files
    (``lake/parts.py``); None, having written nothing, when a change needs the whole table's changes
    (an inserted row keeping a column: Spark's ordered changes) or no partition holds a change (Spark's frame
    types the empty table-batch)."""
    started = time.monotonic()
    with lake_parts.spilled(found, table.columns) as spilled:
        seconds["stage"] += time.monotonic() - started
        if spilled.summary.needs_collected or not spilled.paths:
            log.debug("%s: netted in key partitions in this process, but applied from Spark's frame (%s)",
                      table.target, "an inserted row keeps a column" if spilled.summary.needs_collected
                      else "no change")
            return None
        log.debug("%s: %d net changes read straight from the staged files and streamed from %d spill file(s)",
                  table.target, spilled.summary.rows, len(spilled.paths))
        return streamed(stream.NetChunks(pieces=spilled.pieces, buckets=spilled.buckets), spilled.summary)
