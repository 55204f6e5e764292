"""Retiring one target of a pipeline (``pglogical drop --target NAME``): the slot, the publication, the staging area
and the other targets stay; that target's bookkeeping goes, and so do the staging area's records of it, so retention no
longer keeps batches for it.

A target is found in one of two ways. While the spec still names it, through the spec: its handle drops the slot's
bookkeeping on the target (a PostgreSQL target's rows in the progress, sync and rejects tables; a lake target keeps
its watermarks in each table with the data, nothing separate) and says which records are its own. Once the spec no
longer names it, through the staging area's records alone, by the name its position record carries (written by
every prune of a ``targets:`` spec) or by the identity ``status`` and ``prune`` show: then only those records go,
since nothing says how to reach the target itself (list it in the spec again to drop its bookkeeping there too).

The user's tables and data on the target are never touched: a retired target's tables are the user's to keep or to
drop with their own tools.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.pipeline.source import exclusive_slot, source_client
from airflow_provider_pglogical.pipeline.spec import PipelineSpec
from airflow_provider_pglogical.pipeline.target import spec_target
from airflow_provider_pglogical.staging.layout import StagingLayout
from airflow_provider_pglogical.staging.retention import (
    forget_target,
    is_retired_mark,
    positions,
    recorded_names,
    target_files,
)

Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def recorded_target(layout: StagingLayout, name: str) -> str | None:
    """The identity of the target the staging area records under ``name`` (the spec name its position record
    carries, or the identity itself), or None."""
    by_name = [identity for identity, recorded in recorded_names(layout).items() if recorded == name]
    if len(by_name) > 1:
        raise SpecError(f"--target {name}: {len(by_name)} recorded targets carry that name ({', '.join(by_name)}); "
                        "name one by its identity")
    if by_name:
        return by_name[0]
    return name if name in positions(layout) else None


def retire_target(spec: PipelineSpec, name: str, *, dry_run: bool = False, log: Log = _quiet) -> dict[str, Any]:
    """Retire target ``name`` (see the module docstring). Holds the slot's drain lock on the source and, for a
    target the spec names, its apply lock on the target, so no run starts meanwhile (``PipelineBusyError`` while
    one holds either). Idempotent: what is gone is skipped. ``dry_run``: report what would go, remove nothing."""
    layout = StagingLayout.from_uri(spec.staging.uri, spec.source.slot)
    in_spec = bool(spec.targets) and name in spec.targets
    recorded = None if in_spec else recorded_target(layout, name)
    if recorded is not None:
        for own, view in spec.target_views().items():
            with spec_target(view) as current:
                if current.identity() == recorded:
                    raise SpecError(f"{spec.origin}: --target {name}: that is where the spec's target {own} "
                                    f"writes; retire it by that name")
    if not in_spec and recorded is None:
        known = sorted(positions(layout))
        raise SpecError(f"{spec.origin}: --target {name}: neither a target of the spec's targets: "
                        f"({', '.join(spec.targets) or 'none'}) nor one the staging area of slot {spec.source.slot} "
                        f"records ({', '.join(known) or 'none'})")
    with source_client(spec) as client, ExitStack() as stack:
        if not dry_run:
            stack.enter_context(exclusive_slot(spec, client))
        identity = recorded or ""
        if in_spec:
            target = stack.enter_context(spec_target(spec.target_views((name,))[name]))
            identity = target.identity()
            if not dry_run:
                stack.enter_context(target.exclusive())
            # Before the records: the apply's target record says where the bookkeeping is.
            bookkeeping = target.drop_bookkeeping(dry_run=dry_run, log=log)
        else:
            bookkeeping = {"note": f"{spec.origin} no longer names this target, so only the staging area's records "
                                   "of it go; to drop its bookkeeping on the target too, list it under targets: "
                                   "again and retire it by that name"}
        # A retired target's mark is not one of its records: run again, the retirement finds nothing left to forget.
        records = [layout.uri_for(p) for p in target_files(layout, identity) if not is_retired_mark(layout, p)]
        if not dry_run:
            forget_target(layout, identity)
            if in_spec:
                target.mark_retired(bookkeeping)
            log(f"target {name} retired: forgot {len(records)} staging record(s) of {identity}; retention no longer "
                "keeps batches for it")
            if in_spec and bookkeeping.get("rows"):
                log(f"remove targets.{name} from {spec.origin}: until then its applies stop with an error instead "
                    "of applying the staged batches again")
            elif in_spec:
                log(f"remove targets.{name} from {spec.origin}: until then its runs go on from the watermarks its "
                    "tables keep, and retention waits for it again")
    return {"dry_run": dry_run, "retired": name, "identity": identity, "in_spec": in_spec,
            "bookkeeping": bookkeeping, "staging_records": records}


__all__ = ["recorded_target", "retire_target"]
