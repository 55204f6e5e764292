"""The PostgreSQL apply in a process that starts no Spark: the runner (``runner.apply_slot``), unchanged, with a
session source that refuses to start one, so the apply stops cleanly at the first step that needs a Spark frame.

Every batch before that step committed with its watermarks, as the runner always commits; the step that asked for
Spark was inside a batch whose transaction had not committed (it rolled back, or was never opened), so that batch
and every later one are still pending, for an apply with Spark (the spark-submitted app) to take from the
watermarks on: each batch is applied exactly once, by one route or the other, with the same steps. What may have
committed before the refusal is idempotent for the other route: a target table created (``CREATE TABLE``), or a
snapshot group loaded with its sync marks while another group asked for Spark (the rerun skips groups at their sync
LSN). The Airflow apply task runs this in its worker before it spark-submits (``operators/apply.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_pglogical.apply import planning, snapshots
from airflow_provider_pglogical.apply.batches import list_batches, read_relations, read_truncates
from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.sparkenv import session_is_local
from airflow_provider_pglogical.apply.targets.base import BatchReport
from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class SparkNeeded(Exception):  # noqa: N818 - a signal between two routes, not an error a user sees
    """A step of the apply asked for a Spark session in a process where none may start."""


def _refuse() -> SparkSession:
    raise SparkNeeded("a step of the apply needs a Spark session")


def refusing_session(local_master: bool) -> SparkOnDemand:
    """A session on demand that never starts: a step that asks for it raises ``SparkNeeded`` (``needed_spark``
    finds it however a step wrapped it). ``local_master``: whether this process may read staging on an object
    store itself (``batches.readable_here``)."""
    return SparkOnDemand(_refuse, local_master=local_master)


@dataclass
class WithoutSparkResult:
    """``reports``: one per batch the runner handed on (``on_batch``'s), in LSN order; ``needs_spark``: a step
    needed Spark, so the batches from the one it was in on are left, unapplied, for an apply with Spark;
    ``summary``: what the runner returned (snapshot groups included), or ``reports`` when it stopped."""

    reports: list[BatchReport] = field(default_factory=list)
    needs_spark: bool = False
    summary: list[BatchReport] = field(default_factory=list)


def apply_without_spark(config: ApplyConfig, dsn: str, *, master: str | None = None,
                        on_batch: Callable[[BatchReport], None] | None = None) -> WithoutSparkResult:
    """Apply the slot's staged batches past the target's watermarks into PostgreSQL at ``dsn`` as far as no step
    needs Spark. A run with nothing to apply does not open the runner at all (its validation of row filters
    would ask for Spark): it reports every listed batch as not applied, as the runner does. ``master``: the master
    the rest would be submitted to (a local one lets this process read staging on an object store itself,
    ``batches.readable_here``; None: not known, not local)."""
    result = WithoutSparkResult()

    def seen(report: BatchReport) -> None:
        result.reports.append(report)
        if on_batch is not None:
            on_batch(report)

    idle = idle_reports(config, dsn)
    if idle is not None:
        for report in idle:
            seen(report)
        result.summary = list(result.reports)
        return result
    from airflow_provider_pglogical.apply.runner import apply_slot

    try:
        result.summary = apply_slot(refusing_session(session_is_local(master)), config, dsn, on_batch=seen)
    except Exception as exc:
        if not needed_spark(exc):
            raise
        result.needs_spark, result.summary = True, list(result.reports)
        done = [r for r in result.reports if r.applied]
        log.info("slot %s: %d batch(es) applied without Spark; a step of the next one needs Spark", config.slot,
                 len(done))
    return result


def needed_spark(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was raised while handling or because of, the refusal (a step may wrap it)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, SparkNeeded):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def idle_reports(config: ApplyConfig, dsn: str) -> list[BatchReport] | None:
    """The runner's batch reports when it would apply nothing — no snapshot to load, every listed batch at or below
    its tables' watermarks — judged from the manifests, truncate and relation files and one read of the target's
    bookkeeping (the runner's own definition of pending, ``planning.pending_tables``); None when there is work."""
    batches = list_batches(config.staging_root, config.slot)
    if config.max_batches is not None:
        batches = batches[: config.max_batches]
    names = ([planning.target_name(s, c) for s, c in config.tables.items()] if config.tables
             else sorted({s for b in batches for s in b.table_files}))
    target = PostgresTarget(SparkOnDemand(_refuse), config, dsn, target_tables=names)
    with target.session(config.slot):
        held = snapshots.waiting(config, target)
        if snapshots.has_pending_snapshots(config, target, held):  # asked without creating a table
            return None
        flowing = snapshots.without(config, held, known={s for b in batches for s in b.table_files})
        if flowing is None:  # every table waits for its snapshot: the runner hands no batch on
            return []
        marks = target.watermarks(config.slot)
        for batch in batches:
            # Truncates before a sync LSN are not dropped here: counting them can only send a batch to the runner.
            sources = planning.batch_sources(batch.table_files, read_truncates(batch))
            if planning.pending_tables(sources, flowing.routed(read_relations(batch)), marks, batch.end_lsn):
                return None
    return [BatchReport(b.start_lsn, b.end_lsn, applied=False) for b in batches]
