"""The machine's CPU seconds, busy and available, over a test session: whether the suite is bound by its cores
(busy near available) or by waits (sleeps, polls, fsyncs) that more workers could overlap."""

from __future__ import annotations

import os
from dataclasses import dataclass

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuTimes:
    busy_s: float
    total_s: float


def cpu_times(stat: str = "/proc/stat") -> CpuTimes | None:
    """All cores' busy and total seconds since boot from the kernel's ``cpu`` line (idle and iowait not busy);
    None where there is no ``/proc/stat``."""
    try:
        with open(stat) as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already inside user and nice
    return CpuTimes((total - idle) / TICKS, total / TICKS)


def summary(start: CpuTimes, end: CpuTimes) -> str:
    busy, total = end.busy_s - start.busy_s, end.total_s - start.total_s
    cores = os.cpu_count() or 1
    share = 100 * busy / total if total else 0.0
    return (f"machine CPU over the session: {busy:.0f} CPU-s busy of {total:.0f} available on {cores} cores "
            f"({share:.0f}%; anything else running on the machine counts too)")
