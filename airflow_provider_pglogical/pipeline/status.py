"""``pglogical status``: slot position and lag, a summary of the staging area (every batch with ``--batches``), the
target's watermarks, how far each target of the staging area has applied, and each table's sync state."""

from __future__ import annotations

from typing import Any

from airflow_provider_pglogical.exceptions import PgLogicalError, SlotError, WatermarksMissingError, format_lsn
from airflow_provider_pglogical.hooks.slots import check_wal_retention, slot_lag_bytes, slot_summary
from airflow_provider_pglogical.lsn import parse_lsn
from airflow_provider_pglogical.pipeline.retention import applied_through
from airflow_provider_pglogical.pipeline.runs import drain_config, pending_batches
from airflow_provider_pglogical.pipeline.snapshots import sync_states
from airflow_provider_pglogical.pipeline.source import resolved, source_client
from airflow_provider_pglogical.pipeline.spec import PipelineSpec
from airflow_provider_pglogical.pipeline.target import SpecTarget, spec_target
from airflow_provider_pglogical.staging.drain import gap_refusal
from airflow_provider_pglogical.staging.layout import StagingLayout
from airflow_provider_pglogical.staging.reader import StagingReader
from airflow_provider_pglogical.staging.retention import positions, read_pruned


def staged_batches(spec: PipelineSpec) -> list[dict[str, Any]]:
    """Every visible batch of the spec's slot, in LSN order, with its counts."""
    reader = StagingReader.from_uri(spec.staging.uri, spec.source.slot)
    out = []
    for ref in reader.batches():
        manifest = reader.manifest(ref)
        out.append({"batch": ref.name, "start_lsn": manifest.start_lsn, "end_lsn": manifest.end_lsn,
                    "transactions": manifest.transactions, "changes": manifest.changes,
                    "truncates": manifest.truncates, "bytes": manifest.bytes,
                    "tables": {name: t["rows"] for name, t in sorted(manifest.tables.items())}})
    return out


def target_watermarks(target: SpecTarget) -> dict[str, str]:
    """Target table → committed end LSN in ``X/X`` form."""
    return {table: format_lsn(lsn) for table, lsn in sorted(target.watermarks().items())}


def staging_summary(spec: PipelineSpec, batches: list[dict[str, Any]], pending: int | None) -> dict[str, Any]:
    """The staging area in a few numbers: batches, bytes, changes, LSN range, batches pending for the spec's target
    (None when its watermarks are gone), the retention settings, what was pruned and how far each target the
    staging area knows has applied it (``staging/retention.py``)."""
    layout = StagingLayout.from_uri(spec.staging.uri, spec.source.slot)
    retention = spec.staging.retention
    pruned = read_pruned(layout)
    return {"uri": spec.staging.uri, "batch_count": len(batches), "bytes": sum(b["bytes"] for b in batches),
            "staged_changes": sum(b["changes"] for b in batches),
            "oldest_start_lsn": batches[0]["start_lsn"] if batches else None,
            "last_end_lsn": batches[-1]["end_lsn"] if batches else None,
            "pending_batches": pending,
            "retention": None if retention is None else {"keep_batches": retention.keep_batches,
                                                         "keep_for_seconds": retention.keep_for_seconds},
            "pruned": pruned.to_summary() if pruned else None,
            "targets": {t: None if lsn is None else format_lsn(lsn) for t, lsn in sorted(positions(layout).items())}}


def status(spec: PipelineSpec, *, batches: bool = False) -> dict[str, Any]:
    """Slot position and lag, the staging area's summary (``batches``: every staged batch too) and target
    watermarks, as one JSON-friendly dict; with ``targets:``, ``targets`` holds each target's (``target_status``).

    ``problems``: why the next run would fail (a missing or unusable slot, a gap between the staged log
    and the slot, watermarks gone), each as its error's one line; empty when the pipeline can run.
    """
    with source_client(spec) as client:
        info = client.slot_info(spec.source.slot)
        current = client.current_wal_flush_lsn()
    slot = None
    if info is not None:
        slot = {**slot_summary(info), "lag_bytes": slot_lag_bytes(info)}
        if spec.source.max_lag_bytes is not None:
            slot["lag_ok"] = slot["lag_bytes"] <= spec.source.max_lag_bytes
        try:
            check_wal_retention(info, slot=spec.source.slot, min_safe_wal_bytes=spec.source.min_safe_wal_bytes)
            slot["wal_retention"] = "ok"
        except SlotError as exc:  # status reports the problem; decode is what fails on it
            slot["wal_retention"] = str(exc)
    listed = staged_batches(spec)
    problems = []
    if info is None and (listed or not spec.source.create):
        problems.append(f"slot {spec.source.slot!r} does not exist" + (" but batches of it are staged" if listed
                                                                      else " and source.create is false"))
    elif slot is not None and slot["wal_retention"] != "ok":
        problems.append(slot["wal_retention"])
    if info is not None and info.confirmed_flush_lsn is not None and listed:
        refusal = gap_refusal(drain_config(spec), parse_lsn(listed[-1]["end_lsn"]), str(listed[-1]["batch"]),
                              info.confirmed_flush_lsn, {parse_lsn(b["start_lsn"]) for b in listed})
        if refusal is not None:  # the drain's own check: a slot it replays from is no problem
            problems.append(refusal)
    if spec.targets:
        staging = staging_summary(spec, listed, None)
        if batches:
            staging["batches"] = listed
        staged_end = parse_lsn(listed[-1]["end_lsn"]) if listed else None
        targets = {}
        for name, view in spec.target_views().items():
            targets[name], trouble = target_status(view, staged_end)
            problems += [f"target {name}: {line}" for line in trouble]
        return {
            "spec": spec.origin,
            "source": {"publication": ", ".join(spec.source.all_publications), "current_wal_flush_lsn": format_lsn(current), "slot": slot},
            "staging": staging,
            "targets": targets,
            "problems": problems,
        }
    with spec_target(spec) as target:  # watermarks and sync marks on one target connection
        try:
            watermarks: dict[str, str] | None = target_watermarks(target)
            sync = _sync_states(spec, target)
            pending: int | None = len(pending_batches(spec, target=target))
        except WatermarksMissingError as exc:
            watermarks, sync, pending = None, sync_states(spec, {}), None
            problems.append(str(exc))
        staging = staging_summary(spec, listed, pending)
        if batches:
            staging["batches"] = listed
        return {
            "spec": spec.origin,
            "source": {"publication": ", ".join(spec.source.all_publications), "current_wal_flush_lsn": format_lsn(current), "slot": slot},
            "staging": staging,
            "target": {"kind": target.kind, "watermarks": watermarks},
            "sync": sync,
            "problems": problems,
        }


def target_status(view: PipelineSpec, staged_end: int | None) -> tuple[dict[str, Any], list[str]]:
    """One target of a spec with several (its view): kind, watermarks, batches pending, how far it is done with the
    staged log and how many bytes of it remain (``lag_bytes``), each table's sync state; and its problems. A target
    that does not answer (its database down, its catalog unreachable) is a problem, not a failed status."""
    out: dict[str, Any] = {"kind": None, "watermarks": None, "pending_batches": None, "applied_through_lsn": None,
                           "lag_bytes": None, "sync": None}
    try:
        view = resolved(view)
        with spec_target(view) as target:
            out["kind"] = target.kind
            try:
                out["watermarks"] = target_watermarks(target)
                out["sync"] = _sync_states(view, target)
                out["pending_batches"] = len(pending_batches(view, target=target))
                through = applied_through(view, target)
            except WatermarksMissingError as exc:
                out["sync"] = sync_states(view, {})
                return out, [str(exc)]
    except Exception as exc:  # noqa: BLE001 - status reports a target it cannot reach; the others are still shown
        text = " ".join(str(exc).split())
        return out, [text if isinstance(exc, PgLogicalError) and text else f"{type(exc).__name__}: not reachable"]
    out["applied_through_lsn"] = None if through is None else format_lsn(through)
    out["lag_bytes"] = 0 if through is None or staged_end is None else max(0, staged_end - through)
    return out, []


def _sync_states(spec: PipelineSpec, target: SpecTarget) -> dict[str, Any]:
    """Per table: pending / copying (with progress) / staged / synced at LSN / none."""
    return sync_states(spec, target.sync_marks())
