"""OPTIMIZE (compaction), VACUUM and a log checkpoint for the Delta tables of a target (docs/delta.md, Maintenance).

Batch MERGEs rewrite the files holding matched rows and add small files; old files stay for time
travel. Compaction and VACUUM are ordinary Delta commits: the app transactions (watermarks) are
kept, and they may run between applies (delta-rs retries a commit that races an apply's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation

DEFAULT_RETENTION_HOURS = 168  # Delta's default: 7 days of snapshots stay readable


def maintain(location: DeltaLocation, tables: Sequence[str], *, retention_hours: int = DEFAULT_RETENTION_HOURS,
             vacuum: bool = True) -> dict[str, dict[str, Any]]:
    """Compact, vacuum and checkpoint each existing table; returns per-table counts."""
    out: dict[str, dict[str, Any]] = {}
    for name in tables:
        table = location.open(name)
        if table is None:
            continue
        compacted = table.optimize.compact()
        removed = table.vacuum(retention_hours=retention_hours, dry_run=False,
                               enforce_retention_duration=retention_hours >= DEFAULT_RETENTION_HOURS) if vacuum else []
        table.create_checkpoint()
        out[name] = {"files_added": int(compacted.get("numFilesAdded", 0)),
                     "files_removed": int(compacted.get("numFilesRemoved", 0)), "files_vacuumed": len(removed),
                     "version": table.version()}
    return out
