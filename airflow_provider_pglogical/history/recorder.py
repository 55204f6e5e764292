"""Collect one run's figures while it runs and append them to the slot's history when it ends.

Recording never fails a run: the run's data was handled (staged, applied) before its record is written,
so an unwritable history is logged and the run goes on. A failed run is recorded too (outcome ``failed``,
its error's one line), then its error propagates unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from airflow_provider_pglogical.exceptions import PgLogicalError, format_lsn
from airflow_provider_pglogical.history.record import RunRecord, SlotFigures, new_run_id, now
from airflow_provider_pglogical.history.store import RunHistory
from airflow_provider_pglogical.hooks.slots import SlotInfo, slot_lag_bytes

logger = logging.getLogger(__name__)
Log = Callable[[str], None]


def slot_figures(info: SlotInfo | None) -> SlotFigures:
    """A slot row's figures for the history (all None when the slot does not exist)."""
    if info is None:
        return SlotFigures()
    return SlotFigures(lag_bytes=slot_lag_bytes(info), retained_bytes=info.retained_bytes,
                       safe_wal_size=info.safe_wal_size, wal_status=info.wal_status)


def error_line(exc: BaseException) -> str:
    """An error as one line; ours carry a user-facing message, anything else only its type (a foreign
    message may quote row values, which a history kept for months must not hold)."""
    text = " ".join(str(exc).split())
    return text if isinstance(exc, PgLogicalError) and text else type(exc).__name__


class RunRecorder:
    """The figures of one run, added step by step; ``finish`` writes them as one record."""

    def __init__(self, staging_uri: str, slot: str, kind: str, *, tool: str = "cli", log: Log | None = None) -> None:
        self.staging_uri = staging_uri
        self.slot = slot
        self.log = log or logger.warning
        self.record = RunRecord(run_id=new_run_id(), kind=kind, slot=slot, started_at=now(), finished_at=now(),
                                outcome="ok", tool=tool)
        self.finished = False

    def _update(self, **changes: Any) -> None:
        self.record = replace(self.record, **changes)

    def decoded(self, batches: Sequence[Mapping[str, Any]], seconds: float) -> None:
        """The drain's batch summaries (``DrainResult.to_summary()``) and its wall time."""
        tables: dict[str, int] = dict(self.record.tables)
        for b in batches:
            for table, n in (b.get("tables") or {}).items():
                tables[table] = tables.get(table, 0) + int(n)
        staged = [b for b in batches if b.get("staged") or b.get("changes")]
        self._update(changes=self.record.changes + sum(int(b.get("changes") or 0) for b in batches),
                     staged_bytes=self.record.staged_bytes + sum(int(b.get("bytes") or 0) for b in batches),
                     batches_staged=self.record.batches_staged + len(staged),
                     decode_s=round((self.record.decode_s or 0.0) + seconds, 3), tables=tables,
                     **self._lsn_range([(int(b["start_lsn_int"]), int(b["end_lsn_int"])) for b in batches
                                        if "start_lsn_int" in b]))

    def applied(self, *, batches_applied: int, rows: Mapping[str, Mapping[str, int]], seconds: float,
                lsns: Sequence[tuple[int, int]] = ()) -> None:
        """What the apply committed: batches, rows written per target table (rejected ones left out), wall time."""
        if self.record.kind == "apply":  # a decode's or run's tables are its staged changes per source table
            tables = dict(self.record.tables)
            for table, counts in rows.items():
                tables[table] = tables.get(table, 0) + sum(n for kind, n in counts.items() if kind != "rejected")
            self._update(tables=tables, **self._lsn_range(lsns))
        self._update(batches_applied=self.record.batches_applied + batches_applied,
                     apply_s=round((self.record.apply_s or 0.0) + seconds, 3))

    def _lsn_range(self, lsns: Sequence[tuple[int, int]]) -> dict[str, str]:
        if not lsns:
            return {}
        start = min(s for s, _ in lsns)
        end = max(e for _, e in lsns)
        if self.record.start_lsn is not None:
            return {"end_lsn": format_lsn(end)}
        return {"start_lsn": format_lsn(start), "end_lsn": format_lsn(end)}

    def saw_slot(self, figures: SlotFigures) -> None:
        self._update(slot_figures=figures)

    def finish(self, *, error: BaseException | None = None) -> str | None:
        """Append the record (once); returns its path, or None when it could not be written (logged)."""
        if self.finished:
            return None
        self.finished = True
        self._update(finished_at=now(), outcome="ok" if error is None else "failed",
                     error=None if error is None else error_line(error))
        try:
            return RunHistory.from_uri(self.staging_uri, self.slot).append(self.record)
        except Exception as exc:  # noqa: BLE001 - the run's data is handled; a missing record must not fail it
            self.log(f"run history of slot {self.slot} not written ({type(exc).__name__}: {' '.join(str(exc).split())})")
            return None


@contextmanager
def recording(staging_uri: str, slot: str, kind: str, *, tool: str = "cli", log: Log | None = None,
              given: RunRecorder | None = None) -> Iterator[RunRecorder]:
    """A recorder for the block, finished (ok or failed) when it ends. ``given``: the enclosing run's recorder,
    which its owner finishes (``pglogical run`` records decode and apply as one run)."""
    if given is not None:
        yield given
        return
    recorder = RunRecorder(staging_uri, slot, kind, tool=tool, log=log)
    try:
        yield recorder
    except BaseException as exc:
        recorder.finish(error=exc)
        raise
    recorder.finish()


class Stopwatch:
    """Seconds since creation (monotonic)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.t0
