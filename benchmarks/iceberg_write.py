"""Benchmark: one mirror batch into an Iceberg table three ways, side by side in one run, each checked equal.

A table of ``--rows`` rows (key ``id``) receives one batch updating every ``--every``-th row and inserting as many
new ones:

* ``ours``: ``IcebergTarget.apply_net`` — the Arrow row plan and copy-on-write of the files holding the keys
  (docs/iceberg.md, Delete mode);
* ``delete_in``: pyiceberg's ``Transaction.delete(In(id, keys))`` then ``append`` of the new rows (one commit);
* ``upsert``: pyiceberg's ``Table.upsert`` (no deletes, no unchanged-TOAST columns: the batch has neither).

Prints one JSON object with the seconds of each and the ratios to ``ours``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation  # noqa: E402
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget  # noqa: E402
from airflow_provider_pglogical.apply.transforms import FROM, KEEP, KIND, LSN  # noqa: E402

TYPES = {"id": "integer", "n": "integer", "body": "text"}


def rows(ids: list[int], n: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int32()), "n": pa.array([n] * len(ids), pa.int32()),
                     "body": pa.array([f"row {i}" for i in ids], pa.string())})


def net(kinds: list[str], data: pa.Table) -> pa.Table:
    count = data.num_rows
    return pa.table({KIND: kinds, KEEP: pa.array([[]] * count, pa.list_(pa.string())),
                     LSN: pa.array(range(count), pa.int64()), FROM: pa.nulls(count, pa.struct([("id", pa.int32())])),
                     **{c: data.column(c) for c in data.column_names}})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--every", type=int, default=2)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="pglogical-bench-iceberg-write-")
    try:
        initial = rows(list(range(args.rows)), 1)
        changed = list(range(0, args.rows, args.every))
        new = list(range(args.rows, args.rows + len(changed)))
        batch = rows(changed + new, 2)
        results: dict[str, float] = {}
        final: dict[str, list[tuple]] = {}
        for way in ("ours", "delete_in", "upsert"):
            target = IcebergTarget(IcebergLocation({"type": "sql", "uri": f"sqlite:///{root}/{way}.db",
                                                    "warehouse": f"{root}/{way}"}), "bench")
            target.apply_net("public.t", 0, 10, net(["I"] * args.rows, initial), key=("id",),
                             columns=tuple(TYPES), type_names=TYPES, truncated=False)
            table = target.open("public.t")
            assert table is not None
            t0 = time.monotonic()
            if way == "ours":
                target.apply_net("public.t", 10, 20, net(["U"] * len(changed) + ["I"] * len(new), batch),
                                 key=("id",), columns=tuple(TYPES), type_names=TYPES, truncated=False)
            elif way == "delete_in":
                from pyiceberg.expressions import In

                with table.transaction() as tx:
                    tx.delete(In("id", changed))
                    tx.append(batch.cast(table.schema().as_arrow()))
            else:
                table.upsert(batch.cast(table.schema().as_arrow()), join_cols=["id"])
            results[way] = time.monotonic() - t0
            scanned = target.open("public.t")
            assert scanned is not None
            final[way] = sorted(tuple(r.values()) for r in scanned.scan().to_arrow().to_pylist())
        same = final["ours"] == final["delete_in"] == final["upsert"]
        print(json.dumps({"rows": args.rows, "updated": len(changed), "inserted": len(new),
                          "seconds": {k: round(v, 2) for k, v in results.items()},
                          "ratio_delete_in_over_ours": round(results["delete_in"] / results["ours"], 2),
                          "ratio_upsert_over_ours": round(results["upsert"] / results["ours"], 2),
                          "identical": same, "load_average": [round(x, 2) for x in os.getloadavg()]}, indent=2))
        return 0 if same else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
