"""One run's figures as a small, versioned JSON record (pure: no I/O).

A record is written once, when its run ends, and never changed. Every field but ``run_id``, ``kind``,
``slot``, ``started_at``, ``finished_at`` and ``outcome`` may be missing (None or empty): a decode run
knows no apply seconds, an apply run started by spark-submit knows no slot figures, a failed run
knows what it saw before it failed.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

FORMAT_VERSION = 1
KINDS = ("decode", "apply", "run")
OUTCOMES = ("ok", "failed")


@dataclass(frozen=True)
class SlotFigures:
    """The slot as ``pg_replication_slots`` showed it when the run ended (bytes; None: unknown)."""

    lag_bytes: int | None = None  # WAL written since confirmed_flush_lsn: what the next drain reads
    retained_bytes: int | None = None  # WAL kept for the slot: current LSN - restart_lsn
    safe_wal_size: int | None = None  # bytes left before max_slot_wal_keep_size removes WAL it needs
    wal_status: str | None = None  # reserved / extended / unreserved / lost


@dataclass(frozen=True)
class RunRecord:
    """One decode, apply or run (decode then apply) of a pipeline's slot.

    ``tables``: changes staged (decode) or rows written (apply) per table; ``start_lsn``/``end_lsn``: the
    LSN range of the batches the run staged or applied (``X/X`` text). ``error``: the failure's one line
    (errors name identifiers, LSNs and counts, never row values).
    """

    run_id: str
    kind: str
    slot: str
    started_at: datetime
    finished_at: datetime
    outcome: str
    tool: str = "cli"  # cli / airflow: who ran it
    slot_figures: SlotFigures = field(default_factory=SlotFigures)
    changes: int = 0
    staged_bytes: int = 0
    batches_staged: int = 0
    batches_applied: int = 0
    decode_s: float | None = None
    apply_s: float | None = None
    tables: Mapping[str, int] = field(default_factory=dict)
    start_lsn: str | None = None
    end_lsn: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"run kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"run outcome must be one of {', '.join(OUTCOMES)}, not {self.outcome!r}")
        for name in ("started_at", "finished_at"):
            if getattr(self, name).tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware")

    @property
    def duration_s(self) -> float:
        return max((self.finished_at - self.started_at).total_seconds(), 0.0)

    @property
    def changes_per_s(self) -> float | None:
        """Drain throughput: changes staged per second of decode (None without a decode)."""
        if not self.decode_s or self.decode_s <= 0 or not math.isfinite(self.decode_s):
            return None
        return self.changes / self.decode_s

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["started_at"] = self.started_at.isoformat()
        body["finished_at"] = self.finished_at.isoformat()
        body["tables"] = dict(sorted(self.tables.items()))
        return {"format": FORMAT_VERSION, **body}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> RunRecord:
        """A record from its JSON form; fields a newer writer added are ignored, missing optional ones default."""
        if int(body.get("format", 0)) > FORMAT_VERSION:
            raise ValueError(f"run record format {body.get('format')} is newer than this reader ({FORMAT_VERSION})")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in body.items() if k in known}
        values["started_at"] = _utc(str(values["started_at"]))
        values["finished_at"] = _utc(str(values["finished_at"]))
        figures = values.get("slot_figures") or {}
        slot_known = {f.name for f in fields(SlotFigures)}
        values["slot_figures"] = SlotFigures(**{k: v for k, v in figures.items() if k in slot_known})
        values["tables"] = {str(k): int(v) for k, v in (values.get("tables") or {}).items()}
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        return cls.from_dict(json.loads(text))


def _utc(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def new_run_id() -> str:
    return uuid.uuid4().hex


def now() -> datetime:
    return datetime.now(UTC)


def record_name(record: RunRecord) -> str:
    """The record's file name: its end time first, so names sort in time order (``20260126T101500123456Z-<id>.json``)."""
    return f"{record.finished_at.astimezone(UTC).strftime('%Y%m%dT%H%M%S%fZ')}-{record.run_id}.json"


def name_time(name: str) -> datetime | None:
    """The end time a record's file name carries (None: not a record's name)."""
    stamp, _sep, rest = name.partition("-")
    if not rest.endswith(".json"):
        return None
    try:
        return datetime.strptime(stamp, "%Y%m%dT%H%M%S%fZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def parse_since(text: str, *, at: datetime | None = None) -> datetime:
    """``--since``: an ISO time (UTC when it names no zone) or an age such as ``90m``, ``24h``, ``7d``, ``2w``."""
    from datetime import timedelta

    value = text.strip()
    units = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
    if value[-1:].lower() in units and value[:-1].isdigit():
        return (at or now()) - timedelta(**{units[value[-1].lower()]: int(value[:-1])})
    try:
        return _utc(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--since {text!r}: expected an ISO time (2026-01-31T12:00) or an age (90m, 24h, 7d, 2w)") from None
