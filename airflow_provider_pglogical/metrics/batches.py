"""Per-batch metrics through Airflow's ``Stats`` (StatsD, Datadog or OpenTelemetry, as configured),
and the same numbers in one readable log line.

Names (``<slot>`` and ``<schema>.<table>`` normalised to ``[A-Za-z0-9_.-]``; the same values go
in the tags ``slot`` / ``table`` / ``kind`` for backends that keep tags):

========================================  =======  ===============================================
``pglogical.<slot>.slot_lag_bytes``        gauge    WAL the slot has not confirmed, after the batch
``pglogical.<slot>.slot_lag_seconds``      gauge    age of the newest staged commit when staged
``pglogical.<slot>.decode.staged_changes`` counter  row changes staged by the batch
``pglogical.<slot>.decode.staged_bytes``   counter  Parquet bytes staged by the batch
``pglogical.<slot>.decode.duration``       timer    one drain cycle (ms)
``pglogical.<slot>.apply.duration``        timer    one batch's apply: staging COPY + transaction (ms)
``pglogical.<slot>.apply.rows.<table>``    counter  rows written to one target table (all kinds)
``pglogical.<slot>.apply.batches``         counter  batches committed
========================================  =======  ===============================================
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "pglogical"
Log = Callable[[str], None]


def _name(part: str) -> str:
    from airflow.sdk.observability.stats import normalize_name_for_stats

    return normalize_name_for_stats(part, log_warning=False)


def _stats() -> Any:
    # The SDK's module-level functions; the backend is the one the task runner initialised.
    from airflow.sdk.observability import stats

    return stats


@dataclass(frozen=True)
class DecodeBatchMetrics:
    """One drain cycle's numbers (LSNs in ``X/X`` text)."""

    slot: str
    start_lsn: str
    end_lsn: str
    changes: int
    transactions: int
    staged_bytes: int
    duration_s: float
    lag_bytes: int | None
    lag_seconds: float | None


@dataclass(frozen=True)
class ApplyBatchMetrics:
    """One applied batch's numbers: rows per target table and kind, seconds per phase."""

    slot: str
    start_lsn: str
    end_lsn: str
    applied: bool
    rows: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    seconds: Mapping[str, float] = field(default_factory=dict)
    ordered: bool = False

    @property
    def duration_s(self) -> float:
        return float(sum(self.seconds.values()))

    def table_rows(self, table: str) -> int:
        return sum(n for kind, n in self.rows.get(table, {}).items() if kind != "rejected")


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "?"
    return f"{value:.1f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def decode_line(m: DecodeBatchMetrics) -> str:
    """The batch as one ``key=value`` log line."""
    return (f"pglogical decode slot={m.slot} batch={m.start_lsn}..{m.end_lsn} changes={m.changes} "
            f"transactions={m.transactions} staged_bytes={m.staged_bytes} duration={m.duration_s:.2f}s "
            f"slot_lag_bytes={_num(m.lag_bytes)} slot_lag_seconds={_num(m.lag_seconds, 's')}")


def apply_line(m: ApplyBatchMetrics) -> str:
    """The batch as one ``key=value`` log line; per table ``+inserted ~updated -deleted !rejected``."""
    marks = {"inserted": "+", "updated": "~", "deleted": "-", "rejected": "!"}
    tables = " ".join(
        f"{table}=" + "/".join(f"{marks.get(kind, kind + ':')}{n}" for kind, n in sorted(counts.items()))
        for table, counts in sorted(m.rows.items())) or "-"
    phases = ", ".join(f"{k} {v:.2f}s" for k, v in m.seconds.items())
    return (f"pglogical apply slot={m.slot} batch={m.start_lsn}..{m.end_lsn} applied={str(m.applied).lower()} "
            f"ordered={str(m.ordered).lower()} duration={m.duration_s:.2f}s ({phases or 'skipped'}) rows {tables}")


def emit_decode_batch(m: DecodeBatchMetrics, log: Log | None = None) -> str:
    """Send one drain cycle's metrics to ``Stats`` and log them as one line; returns the line."""
    stats, slot = _stats(), _name(m.slot)
    tags = {"slot": m.slot}
    if m.lag_bytes is not None:
        stats.gauge(f"{PREFIX}.{slot}.slot_lag_bytes", m.lag_bytes, tags=tags)
    if m.lag_seconds is not None:
        stats.gauge(f"{PREFIX}.{slot}.slot_lag_seconds", m.lag_seconds, tags=tags)
    stats.incr(f"{PREFIX}.{slot}.decode.staged_changes", m.changes, tags=tags)
    stats.incr(f"{PREFIX}.{slot}.decode.staged_bytes", m.staged_bytes, tags=tags)
    stats.timing(f"{PREFIX}.{slot}.decode.duration", dt.timedelta(seconds=m.duration_s), tags=tags)
    line = decode_line(m)
    if log is not None:
        log(line)
    return line


def emit_apply_batch(m: ApplyBatchMetrics, log: Log | None = None) -> str:
    """Send one applied batch's metrics to ``Stats`` and log them as one line; returns the line."""
    stats, slot = _stats(), _name(m.slot)
    if m.applied:
        stats.incr(f"{PREFIX}.{slot}.apply.batches", tags={"slot": m.slot})
        stats.timing(f"{PREFIX}.{slot}.apply.duration", dt.timedelta(seconds=m.duration_s), tags={"slot": m.slot})
        for table in sorted(m.rows):
            stats.incr(f"{PREFIX}.{slot}.apply.rows.{_name(table)}", m.table_rows(table),
                       tags={"slot": m.slot, "table": table})
    line = apply_line(m)
    if log is not None:
        log(line)
    return line


def apply_metrics_from_report(slot: str, report: Mapping[str, Any]) -> ApplyBatchMetrics:
    """An :class:`ApplyBatchMetrics` from one batch of the apply app's JSON report."""
    from airflow_provider_pglogical.exceptions import format_lsn

    return ApplyBatchMetrics(slot=slot, start_lsn=format_lsn(int(report["start_lsn"])),
                             end_lsn=format_lsn(int(report["end_lsn"])), applied=bool(report["applied"]),
                             rows={t: dict(c) for t, c in (report.get("rows") or {}).items()},
                             seconds=dict(report.get("seconds") or {}), ordered=bool(report.get("ordered")))


def newest_commit_age_s(staging_uri: str, slot: str, start_lsn: int) -> float | None:
    """Seconds between the newest commit staged in the batch starting at ``start_lsn`` and now
    (None when there is no such batch or it holds no transaction)."""
    import pyarrow.compute as pc

    from airflow_provider_pglogical.staging.layout import TRANSACTIONS
    from airflow_provider_pglogical.staging.reader import StagingReader

    reader = StagingReader.from_uri(staging_uri, slot)
    ref = reader.find(start_lsn)
    if ref is None:
        return None
    commits = reader.read_file(ref, TRANSACTIONS).column("commit_time")
    newest: dt.datetime | None = pc.max(commits).as_py() if len(commits) else None
    if newest is None:
        return None
    return max((dt.datetime.now(dt.UTC) - newest).total_seconds(), 0.0)


def decode_metrics(summary: Mapping[str, Any], *, staging_uri: str, lag_bytes: int | None) -> DecodeBatchMetrics:
    """The metrics of one drain cycle from its summary (``DrainResult.to_summary()``) and the slot's lag after it.

    Lag in seconds is the age of the newest staged commit; with nothing staged it is 0 when the
    slot has caught up, unknown otherwise.
    """
    lag_seconds: float | None = None
    if summary.get("staged") and summary.get("transactions"):
        lag_seconds = newest_commit_age_s(staging_uri, summary["slot"], int(summary["start_lsn_int"]))
    elif lag_bytes == 0:
        lag_seconds = 0.0
    return DecodeBatchMetrics(slot=summary["slot"], start_lsn=summary["start_lsn"], end_lsn=summary["end_lsn"],
                              changes=int(summary.get("changes") or 0),
                              transactions=int(summary.get("transactions") or 0),
                              staged_bytes=int(summary.get("bytes") or 0),
                              duration_s=float(summary.get("duration_s") or 0.0), lag_bytes=lag_bytes,
                              lag_seconds=None if lag_seconds is None else round(lag_seconds, 3))
