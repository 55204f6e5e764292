"""Compaction and snapshot expiry for the Iceberg tables of a target (docs/iceberg.md, Maintenance).

Every batch's copy-on-write commit rewrites the files holding replaced rows and adds small files, and old
snapshots keep their files for time travel. pyiceberg has no rewrite-data-files action, so compaction here is the
whole table's rows rewritten in one commit (pyiceberg splits them by ``write.target-file-size-bytes``) — only when
the table has more than one data file; snapshot expiry is pyiceberg's. Both are ordinary commits that keep the table
properties (the watermarks) and may run between applies: one racing an apply fails its compare-and-swap and is
simply run again. Deleting the files no snapshot references any more is left to an engine's orphan-file removal.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget

DEFAULT_RETENTION_HOURS = 168  # as for Delta: 7 days of snapshots stay readable


def maintain(target: IcebergTarget, tables: Sequence[str], *, retention_hours: int = DEFAULT_RETENTION_HOURS,
             expire: bool = True) -> dict[str, dict[str, Any]]:
    """Compact and expire snapshots of each existing table; returns per-table counts."""
    from pyiceberg.expressions import AlwaysTrue

    out: dict[str, dict[str, Any]] = {}
    for name in tables:
        table = target.open(name)
        if table is None:
            continue
        before = [task.file.file_path for task in table.scan().plan_files()]
        added = 0
        if len(before) > 1:
            rows = table.scan().to_arrow()
            with table.transaction() as tx, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "did not match any records": nothing to warn about here
                tx.delete(AlwaysTrue(), snapshot_properties={"pglogical.maintenance": "compact"})
                if rows.num_rows:
                    tx.append(rows, snapshot_properties={"pglogical.maintenance": "compact"})
            table = target.open(name) or table
            added = len(list(table.scan().plan_files()))
        expired = 0
        if expire:
            cutoff = datetime.now(UTC) - timedelta(hours=retention_hours)
            current = table.current_snapshot()
            old = [s.snapshot_id for s in table.snapshots()
                   if s.timestamp_ms < cutoff.timestamp() * 1000 and (current is None or s.snapshot_id != current.snapshot_id)]
            if old:
                table.maintenance.expire_snapshots().by_ids(old).commit()
                expired = len(old)
            table = target.open(name) or table
        out[name] = {"files_added": added, "files_removed": len(before) if added else 0,
                     "snapshots_expired": expired, "snapshots": len(table.snapshots())}
    return out
