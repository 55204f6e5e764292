"""Staging retention: how far each target has applied the staged log, and pruning the prefix every one has applied.

A staging area can feed several targets (one pipeline spec each over the same slot and staging). Each records in
``state/applied-<target>.json`` the LSN through which it is done with the log: every batch ending at or before it
is applied there (or holds nothing it needs). A batch may be pruned only when every target the staging area knows
— those with such a record and those with a ``target-<target>.json`` record of the apply — is done with it; a
known target that recorded no position (``null``: new, reset, or staged by an older release) keeps everything.

Pruning removes a prefix of the log, oldest batch first, so the visible batches stay contiguous. Crash windows
(``CHECKPOINTS``): ``state/pruned.json`` is written first (the range it names is gone for readers from now on,
so a replay can never silently start past it); then per batch its manifest is deleted (one atomic delete: the batch
no longer exists for any reader) and only then its files. A crash leaves visible batches that are whole (``verify``
passes) and, at worst, a manifest-less directory before the oldest visible batch, which the next prune removes.
Running a prune again is harmless: it finishes what a crashed one started and counts no batch twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from airflow_provider_pglogical.exceptions import StagingError, format_lsn
from airflow_provider_pglogical.staging.layout import MANIFEST, StagingLayout, make_dirs, quote_name, unquote_name
from airflow_provider_pglogical.staging.manifest import read_text, write_text_atomic
from airflow_provider_pglogical.staging.reader import BatchRef, StagingReader
from airflow_provider_pglogical.staging.target_record import record_path

APPLIED_PREFIX = "applied-"
TARGET_RECORD_PREFIX = "target-"  # staging/target_record.py: the apply's record of a target
PRUNED = "pruned.json"
CHECKPOINTS = ("recorded", "manifest_removed", "batch_removed")

Checkpoint = Callable[[str], None]
Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _position_path(layout: StagingLayout, target: str) -> str:
    return f"{layout.state_dir}/{APPLIED_PREFIX}{quote_name(target)}.json"


def record_position(layout: StagingLayout, target: str, applied_through_lsn: int | None, *,
                    name: str | None = None) -> None:
    """Record that ``target`` is done with every batch ending at or before ``applied_through_lsn`` (None: it
    applies from the first staged batch, e.g. after a reset), replacing its previous record atomically. ``name``:
    the spec's name for it (``targets:``), so it can be retired by that name once the spec no longer lists it."""
    make_dirs(layout.fs, layout.state_dir)
    body = {"target": target, "applied_through_lsn_int": applied_through_lsn,
            "applied_through_lsn": None if applied_through_lsn is None else format_lsn(applied_through_lsn),
            "recorded_at": _now_text(), **({"name": name} if name else {})}
    write_text_atomic(layout, _position_path(layout, target), json.dumps(body))


def positions(layout: StagingLayout) -> dict[str, int | None]:
    """Every target the staging area knows → the LSN through which it is done with the log (None: unknown,
    which keeps every batch)."""
    out: dict[str, int | None] = {}
    for info in layout.files(layout.state_dir):
        name = info.base_name
        if not name.endswith(".json"):
            continue
        if name.startswith(TARGET_RECORD_PREFIX):
            if not is_retired_mark(layout, info.path):  # a retired target keeps no batch
                out.setdefault(unquote_name(name[len(TARGET_RECORD_PREFIX):-len(".json")]), None)
        elif name.startswith(APPLIED_PREFIX):
            try:
                body = json.loads(read_text(layout, info.path))
                lsn = body["applied_through_lsn_int"]
                out[str(body["target"])] = None if lsn is None else int(lsn)
            except (ValueError, TypeError, KeyError) as exc:
                raise StagingError(f"unreadable applied-position record {info.path}: {type(exc).__name__}") from exc
    return out


def is_retired_mark(layout: StagingLayout, path: str) -> bool:
    """Whether the apply's target record at ``path`` marks a retired target (``staging/target_record.py``)."""
    try:
        body = json.loads(read_text(layout, path))
    except ValueError as exc:
        raise StagingError(f"unreadable target record {path}: {type(exc).__name__}") from exc
    return isinstance(body, dict) and bool(body.get("retired"))


def recorded_names(layout: StagingLayout) -> dict[str, str]:
    """Target → the spec's name for it, of the targets whose position record carries one (``record_position``)."""
    out: dict[str, str] = {}
    for info in layout.files(layout.state_dir):
        if info.base_name.startswith(APPLIED_PREFIX):
            try:
                body = json.loads(read_text(layout, info.path))
            except ValueError as exc:
                raise StagingError(f"unreadable applied-position record {info.path}: {type(exc).__name__}") from exc
            if isinstance(body, dict) and body.get("name") and body.get("target"):
                out[str(body["target"])] = str(body["name"])
    return out


def target_files(layout: StagingLayout, target: str) -> list[str]:
    """The staging area's records of ``target`` that exist: its applied position and the apply's target record."""
    paths = [_position_path(layout, target), record_path(layout, target)]
    return [p for p in paths if layout.exists(p)]


def forget_target(layout: StagingLayout, target: str) -> list[str]:
    """Delete the staging area's records of ``target`` (retention stops waiting for it); returns the paths deleted.
    Idempotent: a record already gone is skipped."""
    gone = target_files(layout, target)
    for path in gone:
        layout.fs.delete_file(path)
    return gone


@dataclass(frozen=True)
class PrunedRange:
    """What pruning removed so far: every batch ending at or before ``through_lsn`` (``batches``, ``bytes``:
    totals over every prune of the staging area)."""

    through_lsn: int
    batches: int
    bytes: int
    updated_at: str = ""

    def to_summary(self) -> dict[str, object]:
        return {"through_lsn": format_lsn(self.through_lsn), "batches": self.batches, "bytes": self.bytes,
                "updated_at": self.updated_at}


def read_pruned(layout: StagingLayout) -> PrunedRange | None:
    """The staging area's pruned range, or None when nothing was ever pruned."""
    path = f"{layout.state_dir}/{PRUNED}"
    if not layout.exists(path):
        return None
    try:
        body = json.loads(read_text(layout, path))
        return PrunedRange(int(body["through_lsn_int"]), int(body["batches"]), int(body["bytes"]),
                           str(body.get("updated_at", "")))
    except (ValueError, TypeError, KeyError) as exc:
        raise StagingError(f"unreadable pruned-range record {path}: {type(exc).__name__}") from exc


def _write_pruned(layout: StagingLayout, pruned: PrunedRange) -> None:
    make_dirs(layout.fs, layout.state_dir)
    body = {"through_lsn_int": pruned.through_lsn, "through_lsn": format_lsn(pruned.through_lsn),
            "batches": pruned.batches, "bytes": pruned.bytes, "updated_at": pruned.updated_at}
    write_text_atomic(layout, f"{layout.state_dir}/{PRUNED}", json.dumps(body))


@dataclass(frozen=True)
class StagedBatch:
    """What the retention rule looks at in a batch: its range, size and when it was staged."""

    start_lsn: int
    end_lsn: int
    bytes: int
    created_at: datetime


def prunable(batches: Sequence[StagedBatch], *, applied_through: int, keep_batches: int | None,
             keep_for_seconds: int | None, now: datetime) -> int:
    """How many batches, from the oldest, may be pruned: a prefix of ``batches`` (LSN order) whose every batch ends
    at or before ``applied_through``, is not among the newest ``keep_batches`` (the newest batch always stays: its
    end is where the next drain starts and its relation state what it starts from) and was staged more than
    ``keep_for_seconds`` before ``now``."""
    limit = len(batches) - max(1, keep_batches or 1)
    count = 0
    for batch in batches[:max(limit, 0)]:
        if batch.end_lsn > applied_through:
            break
        if keep_for_seconds is not None and (now - batch.created_at).total_seconds() < keep_for_seconds:
            break
        count += 1
    return count


def staged_batches(reader: StagingReader) -> list[tuple[BatchRef, StagedBatch]]:
    """Every visible batch with what the retention rule needs from its manifest."""
    out = []
    for ref in reader.batches():
        manifest = reader.manifest(ref)
        created = datetime.strptime(manifest.created_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) \
            if manifest.created_at else datetime.now(UTC)
        out.append((ref, StagedBatch(ref.start_lsn, ref.end_lsn, manifest.bytes, created)))
    return out


def prune_batches(layout: StagingLayout, batches: Sequence[tuple[BatchRef, StagedBatch]], *,
                  on_checkpoint: Checkpoint | None = None, log: Log = _quiet) -> PrunedRange | None:
    """Remove ``batches`` (the oldest visible ones, in LSN order) crash-safely, then any leftover of a crashed
    prune; returns the staging area's pruned range afterwards."""
    checkpoint = on_checkpoint or _quiet
    previous = read_pruned(layout)
    if batches:
        done = previous.through_lsn if previous else -1
        new = [b for _ref, b in batches if b.end_lsn > done]  # a crashed prune counted the others already
        pruned = PrunedRange(max(batches[-1][1].end_lsn, done),
                             (previous.batches if previous else 0) + len(new),
                             (previous.bytes if previous else 0) + sum(b.bytes for b in new), _now_text())
        _write_pruned(layout, pruned)
        checkpoint("recorded")
        for ref, _batch in batches:
            if layout.exists(f"{ref.path}/{MANIFEST}"):  # a concurrent prune may have gone first
                layout.fs.delete_file(f"{ref.path}/{MANIFEST}")
            checkpoint("manifest_removed")
            if layout.exists(ref.path):
                layout.delete_dir(ref.path)
            checkpoint("batch_removed")
        log(f"pruned {len(batches)} staged batch(es) of slot {layout.slot} up to {format_lsn(pruned.through_lsn)}")
        previous = pruned
    if previous is not None:
        remove_leftovers(layout, previous.through_lsn, log=log)
    return previous


def remove_leftovers(layout: StagingLayout, through_lsn: int, *, log: Log = _quiet) -> int:
    """Delete manifest-less batch directories ending at or before ``through_lsn``: what a crashed prune left
    (a batch being staged starts where the newest visible one ends, after every pruned one)."""
    removed = 0
    for _start, end, path in layout.list_batch_dirs():
        if end <= through_lsn and not layout.exists(f"{path}/{MANIFEST}"):
            layout.delete_dir(path)
            removed += 1
    if removed:
        log(f"removed {removed} batch director(ies) a crashed prune left")
    return removed
