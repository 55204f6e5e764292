"""The spec's staging retention: record how far its target has applied, prune what every target has applied, and
refuse an apply or replay that would need a pruned range (the replay window)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from airflow_provider_pglogical.exceptions import SpecError, StagingPrunedError, format_lsn
from airflow_provider_pglogical.pipeline.runs import pending_batches
from airflow_provider_pglogical.pipeline.source import resolved
from airflow_provider_pglogical.pipeline.spec import PipelineSpec
from airflow_provider_pglogical.pipeline.target import SpecTarget, spec_target
from airflow_provider_pglogical.snapshot.layout import SnapshotLayout
from airflow_provider_pglogical.staging.layout import StagingLayout
from airflow_provider_pglogical.staging.reader import StagingReader
from airflow_provider_pglogical.staging.retention import (
    Checkpoint,
    forget_target,
    positions,
    prunable,
    prune_batches,
    read_pruned,
    record_position,
    recorded_names,
    staged_batches,
)
from airflow_provider_pglogical.staging.target_record import read_record, retired_error

Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def _lsn(value: int | None) -> str | None:
    return None if value is None else format_lsn(value)


def applied_through(spec: PipelineSpec, target: SpecTarget) -> int | None:
    """The LSN through which ``target`` is done with the staged log (None before any batch is staged): the start
    of its first pending batch (judged as the apply judges it), else the newest batch's end — lowered to the sync
    LSN of any staged snapshot it has not loaded yet, whose rebuild takes the changes from that LSN on."""
    batches = StagingReader.from_uri(spec.staging.uri, spec.source.slot).batches()
    if not batches:
        return None
    pending = pending_batches(spec, target=target)
    through = pending[0][0] if pending else batches[-1].end_lsn
    snapshots = SnapshotLayout.from_uri(spec.staging.uri, spec.source.slot)
    marks = target.sync_marks()
    for name, table in spec.tables.items():
        ref = snapshots.latest(name)
        if ref is not None and marks.get(table.target_name, -1) < ref.lsn:
            through = min(through, ref.lsn)
    return through


def _mine(spec: PipelineSpec, mine: dict[str, int | None]) -> dict[str, Any]:
    """The spec's own target(s) in a prune's result: ``target``/``applied_through_lsn`` of its one target (the
    ``target:`` form), or ``applied`` (identity → LSN) of every target of ``targets:``."""
    if not spec.targets:
        ((identity, lsn),) = mine.items()
        return {"target": identity, "applied_through_lsn": _lsn(lsn)}
    return {"applied": {t: _lsn(lsn) for t, lsn in mine.items()}}


def prune(spec: PipelineSpec, *, dry_run: bool = False, log: Log = _quiet, require_settings: bool = False,
          on_checkpoint: Checkpoint | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Record how far each of the spec's targets has applied the staged log, then (with ``staging.retention``) prune the
    batches every target known to the staging area has applied and the retention bounds let go.

    Runs after every apply (a target that never records its position holds every batch for the others), and as
    ``pglogical prune``. ``dry_run``: record nothing, prune nothing, report what would go. ``require_settings``:
    a spec without ``staging.retention`` is a ``SpecError`` (the command), instead of recording only; without it
    (after an apply) a staging area this process may not write to is a warning, not a failed apply.
    """
    retention = spec.staging.retention
    if retention is None and require_settings:
        raise SpecError(f"{spec.origin}: staging.retention is not set, so nothing is ever pruned; add "
                        "staging.retention.keep_batches and/or keep_for (docs/pipeline-spec.md)")
    layout = StagingLayout.from_uri(spec.staging.uri, spec.source.slot)
    mine: dict[str, int | None] = {}  # identity → how far that target of the spec is done with the log
    named: dict[str, str] = {}  # identity → the spec's target it is
    former: set[str] = set()  # what earlier releases recorded the spec's targets as
    unreachable: list[str] = []
    for name, view in spec.target_views().items():
        try:
            view = resolved(view)
            with spec_target(view) as target:
                identity = target.identity()
                if identity in named:
                    # One record for two targets: the later position would hide the other's, and prune its batches.
                    raise SpecError(f"{spec.origin}: targets {named[identity]} and {name} are both recorded as "
                                    f"{identity} in the staging area; give each a place of its own (docs/targets.md)")
                named[identity] = name
                former.update(target.former_identities())
                mine[identity] = applied_through(view, target)
        except SpecError:
            raise
        except Exception as exc:
            if not spec.targets:
                raise
            # One of several targets that cannot answer (it failed its apply, say) is not known to be done with
            # anything: nothing is pruned, the others' positions are still recorded.
            log(f"target {name}: how far it applied is unknown ({type(exc).__name__}); nothing pruned")
            unreachable.append(name)
    if not dry_run:
        try:
            for identity, lsn in mine.items():
                record_position(layout, identity, lsn, name=named[identity] if spec.targets else None)
            for identity in sorted(former - set(mine)):
                if forget_target(layout, identity):
                    log(f"replaced the record of {identity} (an earlier release's name for a target of this spec)")
        except OSError as exc:
            if require_settings:
                raise
            # After an apply with read-only staging credentials: the apply stands; nothing can be pruned from
            # here, and the target, unrecorded, keeps every batch for the others (as the apply's own record does).
            log(f"could not record how far target{'s' if len(mine) > 1 else ''} {', '.join(mine)} applied the staging "
                f"of slot {spec.source.slot}: {type(exc).__name__}; nothing pruned")
            return {"dry_run": False, **_mine(spec, mine), "recorded": False, "pruned_batches": 0, "pruned_bytes": 0}
    known = {**positions(layout), **mine}
    result: dict[str, Any] = {"dry_run": dry_run, **_mine(spec, mine),
                              "targets": {t: _lsn(lsn) for t, lsn in sorted(known.items())}}
    if unreachable:
        result["unreachable"] = unreachable
    if retention is None:
        return {**result, "retention": None, "pruned_batches": 0, "pruned_bytes": 0}
    # The slowest target decides; one without a recorded position (or not answering) keeps everything.
    bound = -1 if unreachable else min(-1 if lsn is None else lsn for lsn in known.values())
    batches = staged_batches(StagingReader(layout))
    count = prunable([b for _ref, b in batches], applied_through=bound, keep_batches=retention.keep_batches,
                     keep_for_seconds=retention.keep_for_seconds, now=now or datetime.now(UTC))
    chosen = batches[:count]
    pruned = read_pruned(layout) if dry_run else prune_batches(layout, chosen, on_checkpoint=on_checkpoint, log=log)
    if not chosen:
        log(f"nothing to prune in the staging of slot {spec.source.slot} ({len(batches)} batch(es) kept)")
    _name_strangers(spec, layout, known, set(mine), bound, log)
    return {**result, "retention": {"keep_batches": retention.keep_batches,
                                    "keep_for_seconds": retention.keep_for_seconds},
            "held_by": sorted(t for t, lsn in known.items() if (-1 if lsn is None else lsn) == bound),
            "pruned_batches": len(chosen), "pruned_bytes": sum(b.bytes for _ref, b in chosen),
            "kept_batches": len(batches) - len(chosen), "pruned": pruned.to_summary() if pruned else None}


def _name_strangers(spec: PipelineSpec, layout: StagingLayout, known: dict[str, int | None], mine: set[str],
                    bound: int, log: Log) -> None:
    """Log the targets holding batches back that this spec does not name (another pipeline's over the same staging,
    or one removed from the spec), with the command that retires one that is gone."""
    strangers = [t for t, lsn in sorted(known.items()) if t not in mine and (-1 if lsn is None else lsn) == bound]
    names = recorded_names(layout) if strangers else {}
    for identity in strangers:
        name = names.get(identity)
        # A name the spec now gives a target elsewhere (moved to another place) would retire that one: the identity.
        handle = name if name and name not in spec.targets else identity
        log(f"staged batches are held for target {identity}{f' ({name})' if name else ''}, which {spec.origin} does "
            f"not name; if it is retired, forget it with `pglogical drop --spec {spec.origin} --target {handle} --yes`")


def check_window(spec: PipelineSpec, *, reset: bool = False, upto_lsn: int | None = None) -> None:
    """Refuse (``StagingPrunedError``) an apply or replay that would need batches retention pruned (for each target of
    a spec with several): the spec's target
    has not applied the pruned range (a new target, or ``reset`` — a replay empties it first) and a table has no
    staged snapshot at or past its end; or a replay ``upto_lsn`` lies inside it. Nothing pruned: returns at once."""
    layout = StagingLayout.from_uri(spec.staging.uri, spec.source.slot)
    pruned = read_pruned(layout)
    if pruned is None:
        return
    if spec.targets:
        for view in spec.target_views().values():
            check_window(view, reset=reset, upto_lsn=upto_lsn)
        return
    end, slot = format_lsn(pruned.through_lsn), spec.source.slot
    what = f"the staged log of slot {slot!r} is pruned up to {end} ({pruned.batches} batch(es), staging.retention)"
    if upto_lsn is not None and upto_lsn < pruned.through_lsn:
        raise StagingPrunedError(f"{what}: a replay up to {format_lsn(upto_lsn)} is outside the replay window; "
                                 f"replay up to {end} or later")
    spec = resolved(spec)
    with spec_target(spec) as target:
        identity = target.identity()
    if not reset and (record := read_record(spec.staging.uri, slot, identity)) is not None and record.retired:
        raise retired_error(slot)  # not a new target that a snapshot could start: say what it is
    mine = None if reset else positions(layout).get(identity)
    if mine is not None and mine >= pruned.through_lsn:
        return
    snapshots = SnapshotLayout.from_uri(spec.staging.uri, slot)
    missing = [name for name in sorted(spec.tables)
               if (ref := snapshots.latest(name)) is None or ref.lsn < pruned.through_lsn]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        tables = " ".join(f"--table {t}" for t in missing)
        raise StagingPrunedError(
            f"{what} and target {identity} has not applied it: {len(missing)} table(s) ({shown}) have no staged "
            f"snapshot past it; stage one with `pglogical resync --spec {spec.origin} {tables}` (or the DAG's "
            "resync_tables param), then apply")
