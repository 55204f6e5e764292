"""What the apply records in a slot's staging area about its target: where the watermarks live, whether any batch was applied.

The staging area belongs to one pipeline (one slot) and outlives every run, so it is where the
apply pins its bookkeeping location: a later run reads it back instead of looking the progress
table up again, which would depend on what other pipelines created in the same database. The
``applied`` flag turns a progress table that disappeared (or a target that changed under the
pipeline) into an error instead of a silent re-apply of every staged batch from the first.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from airflow_provider_pglogical.exceptions import StagingError, WatermarksMissingError
from airflow_provider_pglogical.staging.layout import StagingLayout, make_dirs, quote_name
from airflow_provider_pglogical.staging.manifest import read_text, write_text_atomic


@dataclass(frozen=True)
class TargetRecord:
    """``bookkeeping_schema``: where the progress table is; ``applied``: a watermark was committed there;
    ``retired``: ``pglogical drop --target`` dropped its watermarks, so applying to it again would apply the staged
    batches twice (retention no longer waits for it)."""

    bookkeeping_schema: str
    applied: bool = False
    retired: bool = False


def retired_error(slot: str) -> WatermarksMissingError:
    """What an apply to a retired target (``TargetRecord.retired``) raises instead of applying every batch again."""
    return WatermarksMissingError(
        f"slot {slot}: this target was retired by `pglogical drop --target` (its watermarks are gone), so applying "
        "to it again would apply the staged batches twice; remove it from the spec's targets:, or run "
        "`pglogical reset --spec FILE --target NAME --yes` to empty its tables and apply the staged log again")


def record_path(layout: StagingLayout, target: str) -> str:
    """Where the slot's staging area keeps its record of ``target``."""
    return f"{layout.state_dir}/target-{quote_name(target)}.json"


def read_record(staging_uri: str, slot: str, target: str) -> TargetRecord | None:
    """The slot's record for ``target`` (the database applied to, e.g. ``postgres/<name>/<oid>``), or None
    before the first apply there: a database created anew is another target, which starts from the first batch."""
    layout = StagingLayout.from_uri(staging_uri, slot)
    path = record_path(layout, target)
    if not layout.exists(path):
        return None
    try:
        body = json.loads(read_text(layout, path))
        return TargetRecord(bookkeeping_schema=str(body["bookkeeping_schema"]), applied=bool(body["applied"]),
                            retired=bool(body.get("retired", False)))
    except (ValueError, TypeError, KeyError) as exc:
        raise StagingError(f"unreadable target record {path}: {type(exc).__name__}") from exc


def write_record(staging_uri: str, slot: str, target: str, record: TargetRecord) -> None:
    """Replace the record of ``target`` (atomically: readers see the old or the new one)."""
    layout = StagingLayout.from_uri(staging_uri, slot)
    make_dirs(layout.fs, layout.state_dir)
    write_text_atomic(layout, record_path(layout, target), json.dumps(asdict(record)))
