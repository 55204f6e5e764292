"""A pipeline's health and history as the CLI and the Airflow UI view show them: ``pglogical check`` and
``pglogical report``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow_provider_pglogical.history.health import Finding, Thresholds, judge, severity
from airflow_provider_pglogical.history.record import RunRecord, SlotFigures
from airflow_provider_pglogical.history.recorder import slot_figures
from airflow_provider_pglogical.history.render import render_html, report_data
from airflow_provider_pglogical.history.store import RunHistory
from airflow_provider_pglogical.pipeline.source import source_client
from airflow_provider_pglogical.pipeline.spec import PipelineSpec
from airflow_provider_pglogical.pipeline.target import spec_targets


def thresholds(spec: PipelineSpec, *, min_safe_wal_bytes: int | None = None,
               max_lag_bytes: int | None = None) -> Thresholds:
    """The given thresholds, else the spec's ``source.min_safe_wal_bytes`` / ``source.max_lag_bytes``."""
    return Thresholds(
        min_safe_wal_bytes=spec.source.min_safe_wal_bytes if min_safe_wal_bytes is None else min_safe_wal_bytes,
        max_lag_bytes=spec.source.max_lag_bytes if max_lag_bytes is None else max_lag_bytes)


def read_slot(spec: PipelineSpec) -> SlotFigures | None:
    """The slot's figures now (None: it does not exist)."""
    with source_client(spec) as client:
        info = client.slot_info(spec.source.slot)
    return None if info is None else slot_figures(info)


def check(spec: PipelineSpec, limits: Thresholds) -> dict[str, Any]:
    """``pglogical check``: the slot's figures judged against ``limits`` (``health``: ok / at_risk / lost)."""
    figures = read_slot(spec)
    findings = judge(spec.source.slot, figures, limits)
    return {"slot": spec.source.slot, "health": severity(findings), "findings": [_finding(f) for f in findings],
            "figures": None if figures is None else vars(figures),
            "thresholds": {"min_safe_wal_bytes": limits.min_safe_wal_bytes, "max_lag_bytes": limits.max_lag_bytes}}


def _finding(f: Finding) -> dict[str, str]:
    return {"check": f.check, "severity": f.severity, "message": f.message}


def history(spec: PipelineSpec, *, since: datetime | None = None) -> list[RunRecord]:
    return RunHistory.from_uri(spec.staging.uri, spec.source.slot).records(since=since)


def current_state(spec: PipelineSpec, records: list[RunRecord], limits: Thresholds) -> dict[str, Any]:
    """The report's current-state table: the slot now (when the source answers) and the last run."""
    # Every target's kind (``targets:`` has several), as its handle names it.
    kinds = ", ".join(f"{name}: {t.kind}" if spec.targets else t.kind for name, t in spec_targets(spec).items())
    state: dict[str, Any] = {"slot": spec.source.slot, "target": kinds, "staging": spec.staging.uri}
    try:
        figures = read_slot(spec)
    except Exception as exc:  # noqa: BLE001 - the history is still worth showing without the source
        state.update(health="unknown", source=f"not reachable ({type(exc).__name__})")
    else:
        findings = judge(spec.source.slot, figures, limits)
        state.update(health=severity(findings), findings="; ".join(f.message for f in findings) or None)
        if figures is not None:
            state.update(wal_status=figures.wal_status, lag_bytes=figures.lag_bytes,
                         retained_bytes=figures.retained_bytes, safe_wal_size=figures.safe_wal_size)
    state.update(min_safe_wal_bytes=limits.min_safe_wal_bytes, max_lag_bytes=limits.max_lag_bytes)
    if records:
        last = records[-1]
        state.update(last_run=f"{last.kind} {last.outcome} at {last.finished_at.isoformat(timespec='seconds')}")
    return state


def report(spec: PipelineSpec, *, since: datetime | None = None, limits: Thresholds | None = None,
           with_current: bool = True) -> tuple[dict[str, Any], str]:
    """``pglogical report``: the data (``--json``) and the self-contained HTML page (``--html``)."""
    limits = limits or thresholds(spec)
    records = history(spec, since=since)
    current = current_state(spec, records, limits) if with_current else {}
    data = report_data(spec.source.slot, records, current=current, since=since)
    return data, render_html(data, records)
