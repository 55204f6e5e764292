"""A Delta mirror batch merged in one commit per bucket (``DeltaTarget.apply_net_buckets``) in a child process that
dies (exit 137, no cleanup) at a kill point, and the workload it applies.

Usage: python -m tests.support.delta_buckets_child '<json>' with keys lake (the Delta location), truncated (whether
a TRUNCATE precedes the batch's changes) and kill_at (``bucket_committed:n`` for the n-th bucket commit, "" to finish).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import pyarrow as pa

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget, TableOutcome
from airflow_provider_pglogical.apply.transforms import FROM, KEEP, KIND, LSN, TOUCHED
from tests.support.kill_points import KILLED, dying_at

__all__ = ["KILLED"]

TARGET = "public.t"
SLOT = "s1"
KEY = ("id",)
COLUMNS = ("id", "n", "body")
TYPES = {"id": "integer", "n": "integer", "body": "text"}
BUCKETS = 3
BASE = (0, 10)  # the batch that loads the base rows: (start, end) LSN
BATCH = (10, 20)


def net(rows: list[tuple[str, list[str], int, int | None, str | None]]) -> pa.Table:
    """Net changes shaped as ``apply_net`` reads them; rows: (kind, keep, id, n, body)."""
    return pa.table({
        KIND: pa.array([r[0] for r in rows], pa.string()),
        KEEP: pa.array([r[1] for r in rows], pa.list_(pa.string())),
        LSN: pa.array(range(100, 100 + len(rows)), pa.int64()),
        FROM: pa.array([None] * len(rows), pa.struct([("id", pa.int32())])),
        TOUCHED: pa.array([False] * len(rows)),
        "id": pa.array([r[2] for r in rows], pa.int32()),
        "n": pa.array([r[3] for r in rows], pa.int32()),
        "body": pa.array([r[4] for r in rows], pa.string()),
    })


def base() -> pa.Table:
    return net([("I", [], i, 0, f"b{i}") for i in range(60)])


def batch(truncated: bool) -> pa.Table:
    """Deletes, updates (some keeping ``body``: unchanged TOAST) and inserts, new keys and replaced ones; after a
    TRUNCATE the changes a native subscriber would see: inserts and deletes, no kept values."""
    rows: list[tuple[str, list[str], int, int | None, str | None]] = []
    for i in range(90):
        kind = "DUUI"[i % 4] if not truncated else "DI"[i % 2]
        keep = ["body"] if kind == "U" and i % 8 == 2 else []
        rows.append((kind, keep, i, None if kind == "D" else i % 4, None if kind == "D" or keep else f"x{i}"))
    return net(rows)


def buckets(table: pa.Table) -> list[pa.Table]:
    """``table`` in ``BUCKETS`` key-disjoint buckets, each holding every kind of change."""
    ids = table.column("id").to_pylist()
    return [table.filter(pa.array([i % BUCKETS == b for i in ids], pa.bool_())) for b in range(BUCKETS)]


def kept(table: pa.Table) -> tuple[str, ...]:
    return ("body",) if any(table.column(KEEP).to_pylist()) else ()


def apply_batch(lake: str, truncated: bool,
                on_checkpoint: Callable[[str, str], None] | None = None) -> TableOutcome:
    """The batch merged bucket by bucket into the Delta location ``lake`` (the child's run, or a rerun in the test)."""
    target = DeltaTarget(DeltaLocation(lake), SLOT, on_checkpoint=on_checkpoint)
    changes = batch(truncated)
    return target.apply_net_buckets(TARGET, *BATCH, iter(buckets(changes)), count=BUCKETS, rows=changes.num_rows,
                                    kept=kept(changes), key=KEY, columns=COLUMNS, type_names=TYPES,
                                    truncated=truncated)


def main() -> None:
    args = json.loads(sys.argv[1])
    die_at = dying_at(args["kill_at"]) if args["kill_at"] else None

    def checkpoint(name: str, target: str) -> None:
        if die_at is not None:
            die_at(name)

    apply_batch(args["lake"], args["truncated"], checkpoint)
    sys.exit(0)


if __name__ == "__main__":
    main()
