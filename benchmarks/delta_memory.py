"""Peak memory of the Delta apply's driver for one large batch: the MERGE source collected whole, streamed into one
commit, and merged in one commit per bucket (``max_merge_rows``).

    python benchmarks/delta_memory.py [--changes 1000000] [--base 500000] [--chunk-rows 100000]
                                      [--max-merge-rows 100000] [--master local[2]]

One batch's net changes of one table (``--changes``: a third updates of existing keys, a third inserts, a
third deletes, ``body`` a 100-character text) are built by Spark in the shape the runner hands the Delta
target, and applied by ``DeltaTarget`` to a Delta table of ``--base`` rows — once with the source collected
whole (``chunk_rows=None``, the reference path), once streamed into one MERGE commit (``--chunk-rows``) and once
merged in one commit per key-hash bucket of about ``--max-merge-rows`` net changes, each in a fresh process of its own, so each figure is that process's peak RSS (``VmHWM``): the driver's Python, the Arrow buffers and
delta-rs (a classic session's JVM is a child process and is reported on its own; with ``--master sc://…`` the
process is a Spark Connect client and the Spark work is the server's). All end with the same table (checked).

delta-rs builds its MERGE's hash join from the whole source, so the one-commit modes hold every net change in
delta-rs's memory while the MERGE runs; one commit per bucket holds one bucket's (docs/delta.md, "Driver memory").
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TABLE = "public.bench"


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _children_hwm_kib() -> int:
    """Peak RSS of this process's child processes (a local session's JVM) that are still running."""
    import os

    total = 0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                total += _status_kib(int(child), "VmHWM")
            except (FileNotFoundError, ProcessLookupError):
                continue
    return total


def _base(lake: str, rows: int) -> None:
    import pyarrow as pa

    from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
    from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
    from airflow_provider_pglogical.apply.transforms import FROM, KEEP, KIND, LSN, TOUCHED

    ids = pa.array(range(rows), pa.int64())
    net = pa.table({KIND: pa.array(["I"] * rows), KEEP: pa.array([[]] * rows, pa.list_(pa.string())),
                    LSN: pa.array([1] * rows, pa.int64()),
                    FROM: pa.array([None] * rows, pa.struct([("id", pa.int64())])),
                    TOUCHED: pa.array([False] * rows), "id": ids, "n": ids,
                    "body": pa.array(["b" * 100] * rows)})
    DeltaTarget(DeltaLocation(lake), "bench", chunk_rows=None).apply_net(
        TABLE, 0, 10, net, key=("id",), columns=("id", "n", "body"),
        type_names={"id": "bigint", "n": "bigint", "body": "text"}, truncated=False)


MODES = ("collected", "streamed", "per-bucket")


def _measure(lake: str, changes: int, base: int, mode: str, chunk_rows: int, max_merge_rows: int,
             master: str) -> dict[str, Any]:
    """One apply of the batch in this process; its peak RSS."""
    from pyspark.sql import functions as F

    from airflow_provider_pglogical.apply.config import TableApplyConfig
    from airflow_provider_pglogical.apply.targets.base import PlannedBatch, PlannedTable, from_column
    from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
    from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
    from airflow_provider_pglogical.apply.transforms import KEEP, KIND, LSN, TOUCHED
    from airflow_provider_pglogical.pipeline.runs import new_spark_session
    from airflow_provider_pglogical.staging.reader import RelationColumn, RelationInfo

    spark = new_spark_session(master, {"spark.driver.memory": "2g"})
    before = _status_kib(__import__("os").getpid(), "VmHWM")
    # Net changes, one per key: ids [0, base) exist; a third updates ids from 0, a third deletes the next ids (those
    # past ``base`` are missing: nothing to delete), a third inserts new ids past them.
    third = changes // 3
    g = F.col("id")
    kind = F.when(g < third, F.lit("U")).when(g < 2 * third, F.lit("D")).otherwise(F.lit("I"))
    key = F.when(g < 2 * third, g).otherwise(F.lit(base) + g)
    net = (spark.range(changes).select(kind.alias(KIND), F.array().cast("array<string>").alias(KEEP),
                                       (g + 100).alias(LSN), F.lit(None).cast("bigint").alias(from_column(0)),
                                       F.lit(False).alias(TOUCHED), key.alias("id"), (g * 7).alias("n"),
                                       F.when(kind == "D", F.lit(None)).otherwise(
                                           F.concat(F.lit("c" * 90), F.lpad(g.cast("string"), 10, "0"))).alias("body")))

    class Changes:
        def net(self, table: PlannedTable) -> Any:
            return net

    relation = RelationInfo(schema="public", table="bench", replica_identity="d", columns=(
        RelationColumn("id", "bigint", True), RelationColumn("n", "bigint", False), RelationColumn("body", "text", False)))
    table = PlannedTable(source=TABLE, target=TABLE, key=("id",), columns=("id", "n", "body"), relation=relation,
                         config=TableApplyConfig())
    plan = PlannedBatch(slot="bench", start_lsn=10, end_lsn=20, tables=(table,), watermark_tables=(TABLE,))
    target = DeltaTarget(DeltaLocation(lake), "bench", chunk_rows=None if mode == "collected" else chunk_rows,
                         max_merge_rows=max_merge_rows if mode == "per-bucket" else None)
    started = time.monotonic()
    result = target.apply_batch(plan, Changes())  # type: ignore[arg-type]
    seconds = time.monotonic() - started
    import os

    pid = os.getpid()
    out = {"mode": mode, "seconds": round(seconds, 1),
           "rows": result.rows.get(TABLE, {}), "peak_rss_mib": round(_status_kib(pid, "VmHWM") / 1024),
           "rss_before_apply_mib": round(before / 1024), "jvm_peak_rss_mib": round(_children_hwm_kib() / 1024)}
    spark.stop()
    return out


def _rows_digest(lake: str) -> list[int]:
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation

    data = DeltaTable(DeltaLocation(lake).table_uri(TABLE)).to_pyarrow_table()
    return [data.num_rows, int(pc.sum(data.column("id")).as_py() or 0), int(pc.sum(data.column("n")).as_py() or 0),
            int(pc.sum(pc.utf8_length(data.column("body"))).as_py() or 0)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--changes", type=int, default=1_000_000)
    p.add_argument("--base", type=int, default=500_000)
    p.add_argument("--chunk-rows", type=int, default=100_000)
    p.add_argument("--max-merge-rows", type=int, default=100_000)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--child", choices=("base", *MODES), help=argparse.SUPPRESS)
    p.add_argument("--lake", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child == "base":
        _base(a.lake, a.base)
        return
    if a.child:
        result = _measure(a.lake, a.changes, a.base, a.child, a.chunk_rows, a.max_merge_rows, a.master)
        print(json.dumps({**result, "table": _rows_digest(a.lake)}))
        return
    workdir = Path(tempfile.mkdtemp(prefix="pglogical-delta-memory-"))
    try:
        results = {}
        for mode in MODES:
            lake = str(workdir / mode)
            common = [sys.executable, __file__, "--lake", lake, "--changes", str(a.changes), "--base", str(a.base),
                      "--chunk-rows", str(a.chunk_rows), "--max-merge-rows", str(a.max_merge_rows),
                      "--master", a.master]
            subprocess.run([*common, "--child", "base"], check=True)
            done = subprocess.run([*common, "--child", mode], check=True, capture_output=True, text=True)
            results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        streamed, bucketed = results["streamed"], results["per-bucket"]
        print(f"{a.changes} net changes into a Delta table of {a.base} rows, Spark {a.master}, "
              f"chunk_rows {a.chunk_rows}, max_merge_rows {a.max_merge_rows}")
        print(f"{'':28}{'collected':>12}{'streamed':>12}{'per-bucket':>12}{'per-bucket/streamed':>21}")
        for label, k in (("driver peak RSS (MiB)", "peak_rss_mib"), ("  of which before the apply", "rss_before_apply_mib"),
                         ("local JVM peak RSS (MiB)", "jvm_peak_rss_mib"), ("apply seconds", "seconds")):
            ratio = bucketed[k] / streamed[k] if streamed[k] else float("nan")
            print(f"{label:28}" + "".join(f"{results[m][k]:>12}" for m in MODES) + f"{ratio:>21.2f}")
        for mode in MODES:
            print(f"rows {mode}: {results[mode]['rows']}")
        tables = {m: results[m]["table"] for m in MODES}
        assert len({json.dumps(t) for t in tables.values()}) == 1, tables
        print(f"same table: {streamed['table'][0]} rows, equal checksums")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
