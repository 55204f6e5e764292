"""Several targets from one slot (``targets:``): the slot is drained once into one staging area holding every table
any target needs, and each target applies its own view of the spec (``PipelineSpec.target_views``: its tables, row
filters, column lists and watermarks).

Each target's progress is its own: a target whose apply fails leaves the others applying in the same command, and
catches up from its own watermarks on the next one (exactly once: its watermarks commit with its data). Retention
keeps every batch some target of the staging area has not applied (``pipeline/retention.prune``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.history.recorder import RunRecorder, recording
from airflow_provider_pglogical.pipeline.retention import check_window
from airflow_provider_pglogical.pipeline.runs import (
    SparkStarter,
    apply_pending,
    decode_pending,
    pipeline_name,
    spark_expected,
)
from airflow_provider_pglogical.pipeline.spec import PipelineSpec
from airflow_provider_pglogical.pipeline.target import spec_target

Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def select_views(spec: PipelineSpec, names: Sequence[str] | None = None) -> dict[str, PipelineSpec]:
    """Name → the view of each chosen target (``names``: those, in spec order; None: every one). A name the spec
    does not have is a ``SpecError`` listing the ones it has."""
    if names:
        unknown = [n for n in dict.fromkeys(names) if n not in spec.target_names]
        if unknown:
            raise SpecError(f"{spec.origin}: --target {', '.join(unknown)}: no such target; the spec's targets: "
                            f"{', '.join(spec.target_names)}")
    return spec.target_views(tuple(names) if names else None)


@dataclass
class FanoutResult:
    """Per target: its apply's result, or the error that stopped it (the others went on)."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    failures: dict[str, BaseException] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {name: ({"error": _line(self.failures[name])} if name in self.failures else self.results[name])
                for name in [*self.results, *self.failures]}


def _line(exc: BaseException) -> str:
    from airflow_provider_pglogical.history.recorder import error_line

    return error_line(exc)


def apply_targets(spec: PipelineSpec, names: Sequence[str] | None = None, *, master: str | None = None,
                  max_batches: int | None = None, log: Log = _quiet, spark: SparkStarter | None = None,
                  recorder: RunRecorder | None = None) -> FanoutResult:
    """Apply every chosen target in turn, each from its own watermarks; an error stops that target only (it is
    logged and returned, never raised). ``spark``: one session for every target (its owner stops it)."""
    out = FanoutResult()
    for name, view in select_views(spec, names).items():
        def say(message: str, name: str = name) -> None:
            log(f"target {name}: {message}")

        try:
            check_window(view)  # a target that would need pruned batches fails before anything is applied
            out.results[name] = apply_pending(view, master=master, max_batches=max_batches, log=say, spark=spark,
                                              recorder=recorder)
        except Exception as exc:  # noqa: BLE001 - that target's failure: the others apply on, the caller reports it
            out.failures[name] = exc
            say(f"failed: {type(exc).__name__}")
    return out


def run_targets(spec: PipelineSpec, names: Sequence[str] | None = None, *, master: str | None = None,
                max_batches: int | None = None, log: Log = _quiet,
                allow_gap: bool = False) -> tuple[dict[str, Any], FanoutResult]:
    """``pglogical run`` of a spec with several targets: decode once (every table any target needs), then apply each
    chosen target as ``apply_targets`` does, on one Spark session, started while the drain runs when every chosen
    target allows it and one surely needs it, else on demand. Recorded as one ``run``; it fails in the history when a target failed."""
    views = select_views(spec, names)
    starter = SparkStarter(master or spec.spark.where, spec.spark.conf, log=log, pipeline=pipeline_name(spec))
    # Started during the drain only when some target surely needs it (``runs.spark_expected``), as for one target.
    may_start = all(spec_target(view).early_spark_start for view in views.values())
    early = may_start and any(spark_expected(view, starter.master) for view in views.values())
    early_for_snapshot = may_start and any(spark_expected(view, starter.master, snapshot=True)
                                           for view in views.values())

    def on_changes() -> None:
        if early:
            starter.start("the drain has changes to stage")

    def on_snapshot() -> None:
        if early_for_snapshot:
            starter.start("a snapshot was staged")

    applied = FanoutResult()
    with recording(spec.staging.uri, spec.source.slot, "run", log=log) as recorder:
        try:
            decoded = decode_pending(spec, max_batches=max_batches, log=log, on_changes=on_changes,
                                     on_snapshot=on_snapshot, allow_gap=allow_gap, recorder=recorder)
            applied = apply_targets(spec, list(views), master=master, log=log, spark=starter, recorder=recorder)
        finally:
            starter.stop()
        if applied.failures:
            recorder.finish(error=next(iter(applied.failures.values())))
    return {"decode": decoded, "spark": starter.summary()}, applied


__all__ = ["FanoutResult", "apply_targets", "run_targets", "select_views"]
