"""Slot health: is there still time before ``max_slot_wal_keep_size`` invalidates the slot? (pure)

A slot is *at risk* while something can still be done — ``safe_wal_size`` under the threshold, lag over
it, or ``wal_status = unreserved`` (the WAL it needs is past ``max_slot_wal_keep_size`` and the next
checkpoint may remove it) — and *lost* once ``wal_status = lost`` (or the slot is gone), when only a
resync brings the target back.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_pglogical.exceptions import SlotInvalidatedError
from airflow_provider_pglogical.history.record import SlotFigures

AT_RISK = "at_risk"
LOST = "lost"
UNRESERVED = "unreserved"


@dataclass(frozen=True)
class Thresholds:
    """``None``: not checked. ``min_safe_wal_bytes`` is only checked where the server reports a
    ``safe_wal_size`` (it is NULL with ``max_slot_wal_keep_size = -1``: such a slot is never invalidated)."""

    min_safe_wal_bytes: int | None = None
    max_lag_bytes: int | None = None


@dataclass(frozen=True)
class Finding:
    """One reason the slot is not healthy: ``check`` names what was measured, ``severity`` is at_risk or lost."""

    check: str
    severity: str
    message: str


def judge(slot: str, figures: SlotFigures | None, thresholds: Thresholds) -> list[Finding]:
    """Every finding about ``slot`` (``figures`` None: the slot does not exist); empty when it is healthy."""
    if figures is None:
        return [Finding("exists", LOST, f"replication slot {slot!r} does not exist")]
    if figures.wal_status == LOST:
        return [Finding("wal_status", LOST, f"replication slot {slot!r} has been invalidated (wal_status=lost). "
                                            f"Hint: {SlotInvalidatedError.hint}")]
    found = []
    if figures.wal_status == UNRESERVED:
        found.append(Finding("wal_status", AT_RISK,
                             f"replication slot {slot!r} is unreserved: it retains {figures.retained_bytes} bytes of "
                             "WAL, more than max_slot_wal_keep_size, and the next checkpoint may invalidate it"))
    floor = thresholds.min_safe_wal_bytes
    if floor is not None and figures.safe_wal_size is not None and figures.safe_wal_size < floor:
        found.append(Finding("safe_wal_size", AT_RISK,
                             f"replication slot {slot!r} can lose WAL after {figures.safe_wal_size} more bytes "
                             f"(safe_wal_size under the threshold {floor})"))
    ceiling = thresholds.max_lag_bytes
    if ceiling is not None and figures.lag_bytes is not None and figures.lag_bytes > ceiling:
        found.append(Finding("lag", AT_RISK, f"replication slot {slot!r} lags {figures.lag_bytes} bytes behind the "
                                             f"WAL (threshold {ceiling})"))
    return found


def severity(findings: list[Finding]) -> str:
    """``ok``, ``at_risk`` or ``lost``: the worst finding's."""
    if any(f.severity == LOST for f in findings):
        return LOST
    return AT_RISK if findings else "ok"
