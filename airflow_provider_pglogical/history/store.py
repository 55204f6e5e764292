"""The run history of one slot: ``<staging root>/<slot>/history/<end time>-<run id>.json``, append-only.

Beside the manifests, on the staging area's own filesystem (local or object store), so every tool that
reads the staged log — the CLI, the DAG's tasks on any worker, the Airflow UI view — reads the same
history, whatever the target kind. Each record is one small file written atomically (a temp sibling
renamed over it locally, one PUT on object stores): a concurrent reader sees a whole record or none.

Bounded: each write prunes records older than ``max_age`` and all but the newest ``max_records``
(defaults :data:`MAX_AGE` and :data:`MAX_RECORDS`); the newest record is always kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from airflow_provider_pglogical.history.record import RunRecord, name_time, now, record_name
from airflow_provider_pglogical.staging.layout import StagingLayout, make_dirs
from airflow_provider_pglogical.staging.manifest import read_text, write_text_atomic

HISTORY_DIR = "history"
MAX_RECORDS = 5000  # about 52 days of one decode and one apply every 30 minutes; each record is under 2 KB
MAX_AGE = timedelta(days=90)

logger = logging.getLogger(__name__)
Log = Callable[[str], None]


class RunHistory:
    """Read, append and prune one slot's run records."""

    def __init__(self, layout: StagingLayout, *, max_records: int = MAX_RECORDS, max_age: timedelta = MAX_AGE) -> None:
        if max_records < 1:
            raise ValueError("max_records must be at least 1")
        self.layout = layout
        self.max_records = max_records
        self.max_age = max_age

    @classmethod
    def from_uri(cls, staging_uri: str, slot: str, *, max_records: int = MAX_RECORDS,
                 max_age: timedelta = MAX_AGE) -> RunHistory:
        return cls(StagingLayout.from_uri(staging_uri, slot), max_records=max_records, max_age=max_age)

    @property
    def directory(self) -> str:
        return f"{self.layout.slot_dir}/{HISTORY_DIR}"

    def names(self) -> list[str]:
        """Record file names, oldest first (temp files and anything else skipped)."""
        return sorted(i.base_name for i in self.layout.files(self.directory) if name_time(i.base_name) is not None)

    def append(self, record: RunRecord) -> str:
        """Write the record (atomically) and prune; returns its path."""
        make_dirs(self.layout.fs, self.directory)
        path = f"{self.directory}/{record_name(record)}"
        write_text_atomic(self.layout, path, record.to_json())
        self.prune()
        return path

    def prune(self, *, at: datetime | None = None) -> list[str]:
        """Delete records beyond the count and age bounds (never the newest); returns the names deleted."""
        names = self.names()
        cutoff = (at or now()) - self.max_age
        excess = max(len(names) - self.max_records, 0)
        doomed = [n for i, n in enumerate(names[:-1]) if i < excess or (name_time(n) or cutoff) < cutoff]
        for name in doomed:
            try:
                self.layout.fs.delete_file(f"{self.directory}/{name}")
            except FileNotFoundError:  # a concurrent writer pruned it first
                pass
        return doomed

    def records(self, *, since: datetime | None = None, log: Log | None = None) -> list[RunRecord]:
        """Records ending at or after ``since``, oldest first. An unreadable record is skipped (and named in
        ``log``): a history is for looking at, and one damaged file must not hide the rest."""
        out = []
        for name in self.names():
            stamp = name_time(name)
            if since is not None and stamp is not None and stamp < since:
                continue
            path = f"{self.directory}/{name}"
            try:
                out.append(RunRecord.from_json(read_text(self.layout, path)))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                (log or logger.warning)(f"skipping unreadable run record {path}: {type(exc).__name__}")
        return out
