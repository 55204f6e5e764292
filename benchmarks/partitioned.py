"""Benchmark: one large table-batch netted in process whole and in key partitions, side by side, with peak memory.

Stages the filtered workload of ``benchmarks/apply.py`` (REPLICA IDENTITY FULL, row filter ``a % 2 = 0`` crossed by
every UPDATE, keys repeating) at ``--changes`` changes from a throwaway server, takes its largest table-batch by
staged bytes, and nets it (published, then netted: what the PostgreSQL target's COPY receives, nothing written to
a target) in two fresh processes, one after the other: ``direct.compacted_batches`` in one piece (the reference,
the bound-limited path) and in key partitions spilled to disk (``apply/partitioned.py``; ``--partitions``, else as
many as the default bounds give). Each child prints its seconds, its peak RSS (``VmHWM`` reset as it starts: the
netting's own, the child reads nothing else) and its rows by kind with a digest over every column of every net row
(``row_digest``: equal in both when the row multisets are). Prints one JSON object with both and the ratios.

With ``--wide BYTES`` it stages rows of that many bytes of text instead (``wide_workload``) and nets the
partitions a third time with the routed chunks bounded in rows only (``partitioned.ROUTE_BYTES`` lifted: how they
were gathered before), to show the byte bound's effect on the peak.

Usage: python benchmarks/partitioned.py [--changes 3750000] [--partitions N] [--wide BYTES]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from airflow_provider_pglogical.apply import direct, partitioned  # noqa: E402
from airflow_provider_pglogical.apply.targets.base import DirectNet  # noqa: E402

KEY, COLUMNS, FILTER = ("id",), ("id", "a", "b", "c", "d"), "a % 2 = 0"


def net(paths: list[str], partitions: int) -> dict[str, object]:
    """Net the staged files in this process: seconds, peak RSS, rows by kind, a digest of every net row."""
    spec = DirectNet("public.big", "public.big", tuple(paths), KEY, COLUMNS, compacted=True, identity=COLUMNS,
                     row_filter=FILTER, partitions=partitions)
    reset_peak()
    t0 = time.monotonic()
    kinds: dict[str, int] = {}
    digest = 0
    for batch in direct.compacted_batches(direct.staged_chunks(paths), spec):
        for kind in ("D", "R", "I", "U"):
            mask = batch.column("op").to_numpy(zero_copy_only=False) == kind
            kinds[kind] = kinds.get(kind, 0) + int(mask.sum())
        digest = (digest + row_digest(batch)) % 2**64
    return {"partitions": partitions, "seconds": round(time.monotonic() - t0, 2),
            "peak_rss_mib": peak_rss_mib(),
            "rows_by_kind": kinds, "row_digest": digest}


def reset_peak() -> None:
    """Forget the peak RSS so far: a child forked from a parent that staged a large batch starts with the parent's
    high-water mark, which ``ru_maxrss`` keeps across ``exec`` (Linux: ``clear_refs`` 5 resets ``VmHWM``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mib() -> int:
    """The peak RSS since ``reset_peak`` (``VmHWM``), else ``ru_maxrss`` (since the process started)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def row_digest(batch: pa.RecordBatch) -> int:
    """The wrapping sum of a 64-bit hash of each net row over all its columns (the keep list joined to a string):
    equal for the same multiset of rows, whatever their order or batches."""
    columns = [pc.binary_join(c, ",") if pa.types.is_list(c.type) else c for c in batch.columns]
    return int(partitioned.key_hash(columns).sum(dtype=np.uint64))


def wide_workload(dsn: str, changes: int, width: int) -> None:
    """Wide rows: ``changes // 2`` inserts whose ``b`` holds ``width`` bytes, then one UPDATE of them all crossing
    the filter (each change staged with a full old image: twice the width)."""
    from scripts.harness.pgserver import execute

    rows = changes // 2
    execute(dsn, "INSERT INTO big SELECT g, g %% 1000, repeat(md5(g::text), %s), 1, '2026-01-01'::timestamptz "
                 "FROM generate_series(0, %s) g", params=(max(1, width // 32), rows - 1))
    execute(dsn, "UPDATE big SET a = a + 1")


def stage(changes: int, root: str, width: int = 0) -> list[str]:
    """The filtered workload (or ``wide_workload`` when ``width``) staged under ``root``: the largest table-batch's
    files."""
    from airflow_provider_pglogical.apply.batches import list_batches
    from airflow_provider_pglogical.hooks import PgLogicalHook
    from benchmarks.apply import BIG_SCHEMA, filtered_workload
    from scripts.harness.pgserver import execute, make_database, start_server, stop_server
    from scripts.harness.subscriber import drain_all

    server = start_server()
    try:
        dsn = server.dsn(make_database(server))
        execute(dsn, BIG_SCHEMA + "ALTER TABLE big REPLICA IDENTITY FULL; CREATE PUBLICATION pub_all FOR TABLE big;")
        PgLogicalHook.from_dsn(dsn).create_slot("ours")
        if width:
            execute(dsn, "ALTER TABLE big ALTER COLUMN b SET STORAGE MAIN")  # inline: no unchanged-TOAST values
            wide_workload(dsn, changes, width)
        else:
            filtered_workload(dsn, changes)
        drain_all(dsn, root, slot="ours")
    finally:
        stop_server(server)
    best: list[str] = []
    best_bytes = -1
    for batch in list_batches(root, "ours"):
        files = [f"{batch.ref.path}/{f}" for f in batch.table_files.get("public.big", ())]
        if files and (size := direct.staged_bytes(files)[0]) > best_bytes:
            best, best_bytes = files, size
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=3_750_000)
    p.add_argument("--partitions", type=int, default=None, help="default: as many as the default bounds give")
    p.add_argument("--wide", type=int, default=0, metavar="BYTES",
                   help="stage rows of this many bytes of text instead (and also net the partitions with the "
                        "routed chunks bounded in rows only, as before the byte bound)")
    p.add_argument("--route-bytes", type=int, default=None, help=argparse.SUPPRESS)  # child: partitioned.ROUTE_BYTES
    p.add_argument("--net", nargs="*", help=argparse.SUPPRESS)  # child: net these files
    args = p.parse_args()
    if args.net is not None:
        if args.route_bytes is not None:
            partitioned.ROUTE_BYTES = args.route_bytes
        print(json.dumps(net(args.net, args.partitions or 1)))
        return 0
    root = tempfile.mkdtemp(prefix="pglogical-bench-partitioned-")
    try:
        files = stage(args.changes, root, args.wide)
        total, _ = direct.staged_bytes(files)
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        parts = args.partitions or partitioned.partition_count(rows, total, direct.INPROCESS_ROWS,
                                                               direct.INPROCESS_BYTES)
        out: dict[str, object] = {"changes": args.changes, "batch_changes": rows,
                                  "batch_staged_mib": round(total / 2**20, 1),
                                  "load_average_start": [round(x, 2) for x in os.getloadavg()]}
        runs: list[tuple[str, int, list[str]]] = [("whole", 1, []), ("partitioned", parts, [])]
        if args.wide:
            runs.append(("partitioned_rows_only", parts, ["--route-bytes", str(2**62)]))
        for name, count, extra in runs:
            child = subprocess.run([sys.executable, __file__, "--partitions", str(count), *extra, "--net", *files],
                                   check=True, capture_output=True, text=True)
            out[name] = json.loads(child.stdout.strip().splitlines()[-1])
        whole, parted = out["whole"], out["partitioned"]
        assert isinstance(whole, dict) and isinstance(parted, dict)
        out["same_rows"] = (whole["rows_by_kind"], whole["row_digest"]) == (parted["rows_by_kind"], parted["row_digest"])
        out["ratio_partitioned_over_whole_seconds"] = round(parted["seconds"] / whole["seconds"], 2)
        out["ratio_partitioned_over_whole_peak_rss"] = round(parted["peak_rss_mib"] / whole["peak_rss_mib"], 2)
        if args.wide:
            rows_only = out["partitioned_rows_only"]
            assert isinstance(rows_only, dict)
            out["same_rows"] = out["same_rows"] and rows_only["row_digest"] == whole["row_digest"]
            out["ratio_partitioned_over_rows_only_peak_rss"] = round(
                parted["peak_rss_mib"] / rows_only["peak_rss_mib"], 2)
            out["ratio_partitioned_over_rows_only_seconds"] = round(parted["seconds"] / rows_only["seconds"], 2)
        out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(out, indent=2))
        return 0 if out["same_rows"] else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
