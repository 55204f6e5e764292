"""Benchmark: the column of absent columns a table-batch of several schema versions gets per staged change
(``versions.absent_column``, from offsets) against its reference (one Python list per row), and the whole
``versions.conform`` of a row group of the older version, alternately ``--repeat`` times in one run.

The row group: ``--rows`` changes of a version with ``id bigint, a integer`` before ``ADD COLUMN b text`` and
``ADD COLUMN c integer DEFAULT 7``; each row conformed lacks ``b`` (its ``absent`` list) and gets ``c``'s default.
Prints one JSON object with every timing and the ratio of the medians (fast / reference). Pure pyarrow: no
database, no JVM.

Usage: python benchmarks/versions.py [--rows 500000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402

from airflow_provider_pglogical.apply import versions  # noqa: E402
from airflow_provider_pglogical.staging.reader import RelationColumn, RelationInfo  # noqa: E402


def _chunk(rows: int) -> pa.Table:
    ids = pa.array(range(rows), pa.int64())
    image = pa.StructArray.from_arrays([ids, ids.cast(pa.int32())], names=["id", "a"])
    return pa.table({"op": pa.array(["U"] * rows), "old": image, "new": image})


def _union(chunk: pa.Table) -> versions.SchemaUnion:
    newer = pa.struct([pa.field("id", pa.int64()), pa.field("a", pa.int32()), pa.field("b", pa.string()),
                       pa.field("c", pa.int32())])
    schemas = [chunk.schema, chunk.schema.set(2, pa.field("new", newer)).set(1, pa.field("old", newer))]
    columns = (RelationColumn("id", "bigint", True), RelationColumn("a", "integer", False),
               RelationColumn("b", "text", False), RelationColumn("c", "integer", False, "{7}"))
    union = versions.union_of(schemas, [(2, RelationInfo("public", "t", "d", columns))])
    if union is None:
        raise SystemExit("no union")
    return union


def _timed(f: Callable[[], object]) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    chunk = _chunk(args.rows)
    union = _union(chunk)
    absent = ["b"]
    if not versions.absent_column(absent, args.rows).equals(versions.absent_column_reference(absent, args.rows)):
        raise SystemExit("absent_column differs from its reference")
    fast: list[float] = []
    reference: list[float] = []
    conform: list[float] = []
    for _ in range(args.repeat):  # alternating, in one run
        fast.append(_timed(lambda: versions.absent_column(absent, args.rows)))
        reference.append(_timed(lambda: versions.absent_column_reference(absent, args.rows)))
        conform.append(_timed(lambda: versions.conform(chunk, union)))
    out = {"rows": args.rows, "absent_column_s": fast, "absent_column_reference_s": reference,
           "conform_s": conform,
           "ratio_fast_to_reference": statistics.median(fast) / statistics.median(reference)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
