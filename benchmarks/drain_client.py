"""Benchmark: the drain's client-side work alone (assembler + batch writer) on one captured peek, this tree against
another one (``--ab-code DIR``), alternating: the client's CPU seconds, its decoding thread's, and wall seconds.

The drain's wall time is the server's decoding plus the client's work, and on a loaded machine the first drowns
the second; here the big workload's peek is read once (binary COPY), kept in memory, and handed to the decoder and
the writer the way the drain hands it (lists of the COPY reader's size, cyclic GC paused, the same memory budget),
so two trees compare on the same rows without a server in the timed part. Also timed: handing the rows from the
COPY reader's lists to the decoder's blocks (``progress.metered_blocks`` over ``RowBlocks``) against passing them
row by row through a generator per layer, and the writer's run scan in C against its Python reference.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as `python benchmarks/drain_client.py`

Row = tuple[int, int, bytes]
ITERSIZE = 5000  # the drain's fetch size (DrainConfig.itersize)


def capture(changes: int, workload: str, path: str) -> int:
    """Run the workload on a fresh server and write its peek's rows to ``path``; the number of rows."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import apply as bench  # benchmarks/apply.py: the same workloads

    from airflow_provider_pglogical.hooks import PgLogicalHook
    from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient
    from scripts.harness.pgserver import execute, make_database, start_server, stop_server

    server = start_server()
    try:
        dsn = server.dsn(make_database(server))
        execute(dsn, bench.BIG_SCHEMA + "CREATE PUBLICATION pub_all FOR TABLE big;")
        if workload == "filtered":
            execute(dsn, "ALTER TABLE big REPLICA IDENTITY FULL;")
        PgLogicalHook.from_dsn(dsn).create_slot("ours")
        (bench.filtered_workload if workload == "filtered" else bench.big_workload)(dsn, changes)
        client = PgLogicalClient.from_dsn(dsn)
        try:
            rows = [(lsn, xid, bytes(data)) for lsn, xid, data in client.peek_changes("ours", "pub_all",
                                                                                       itersize=ITERSIZE)]
        finally:
            client.close()
    finally:
        stop_server(server)
    with open(path, "wb") as f:
        pickle.dump(rows, f, protocol=5)
    return len(rows)


def client_work(rows_path: str, repeat: int) -> list[tuple[float, float, float]]:
    """Seconds of assembler + writer over the captured rows, ``repeat`` times: (CPU of all threads, CPU of the
    decoding thread alone, wall). The row-group thread runs beside the decoding thread, so the wall time on an
    idle machine is bounded by the busier thread, and under load by the client's CPU over its cores."""
    from airflow_provider_pglogical.decoding.assembler import ChangeAssembler
    from airflow_provider_pglogical.decoding.gcpause import paused_gc
    from airflow_provider_pglogical.decoding.model import RelationSchema, Transaction
    from airflow_provider_pglogical.decoding.values import RowImageConverter, TypeCatalog
    from airflow_provider_pglogical.staging.drain import DrainConfig
    from airflow_provider_pglogical.staging.layout import StagingLayout
    from airflow_provider_pglogical.staging.writer import BatchWriter

    class Resolver:  # built-in types only: no catalog lookups on a server
        def converter(self, relation: RelationSchema) -> Any:
            return RowImageConverter(relation, TypeCatalog())

        def type_names(self, relation: RelationSchema) -> list[str | None]:
            return [None] * len(relation.columns)

    with open(rows_path, "rb") as f:
        rows: list[Row] = pickle.load(f)
    budget = DrainConfig(slot="s", publication="p", staging_uri="/").memory_budget
    out = []
    for _ in range(repeat):
        blocks = iter([rows[i:i + ITERSIZE] for i in range(0, len(rows), ITERSIZE)])
        root = tempfile.mkdtemp(prefix="pglogical-bench-client-")
        try:
            c0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
            writer = BatchWriter(StagingLayout.from_uri(root, "ours"), start_lsn=1, slot="ours", publication="p",
                                 resolver=Resolver())
            with ChangeAssembler(memory_budget=budget) as assembler, paused_gc():
                for event in assembler.feed_blocks(blocks):
                    assert isinstance(event, Transaction)
                    writer.write_transaction(event)
                writer.finish_files()
            out.append((round(time.process_time() - c0, 3), round(time.thread_time() - t0, 3),
                        round(time.perf_counter() - w0, 3)))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return out


def hand_over(rows_path: str, repeat: int) -> dict[str, list[float]]:
    """CPU seconds of getting the rows from the COPY reader's lists into the decoder's blocks, both ways."""
    from airflow_provider_pglogical.hooks.copystream import RowBlocks
    from airflow_provider_pglogical.progress import Progress, metered_blocks

    with open(rows_path, "rb") as f:
        rows: list[Row] = pickle.load(f)
    lists = [rows[i:i + ITERSIZE] for i in range(0, len(rows), ITERSIZE)]

    def read() -> Iterator[list[Row]]:  # the compiled reader returns a new list per call
        for block in lists:
            yield list(block)

    def per_row() -> Iterator[Row]:  # one generator per layer (COPY reader's rows, then the client's), row by row
        def rows_of_blocks() -> Iterator[Row]:
            for block in read():
                yield from block
        with nullcontext():  # translated_errors
            yield from rows_of_blocks()

    progress = Progress("bench", lambda *_: None)
    out: dict[str, list[float]] = {"per_row_generators": [], "row_blocks": []}
    for _ in range(repeat):
        for key, make in (("per_row_generators", per_row), ("row_blocks", lambda: RowBlocks(read()))):
            c0 = time.process_time()
            for _block in metered_blocks(make(), progress, 0):
                pass
            out[key].append(round(time.process_time() - c0, 3))
    return out


def run_scan(repeat: int, changes: int = 700_000, slice_rows: int = 4096) -> dict[str, list[float]]:
    """CPU seconds of the writer's scan for runs of one relation over ``changes`` row changes in the spill's
    slices: the Python reference against ``_speedups.relation_run`` (empty without the compiled module)."""
    from airflow_provider_pglogical.decoding import speedups
    from airflow_provider_pglogical.decoding.model import RowChange
    from airflow_provider_pglogical.staging import writer

    relation: Any = object()
    slices = [[RowChange("I", relation, i, None, None) for i in range(lo, min(lo + slice_rows, changes))]
              for lo in range(0, changes, slice_rows)]
    scans = {"python": writer.relation_run_py}
    if speedups.compiled is not None:
        scans["compiled"] = speedups.compiled.relation_run
    out: dict[str, list[float]] = {k: [] for k in scans}
    for _ in range(repeat):
        for key, scan in scans.items():
            c0 = time.process_time()
            for changes_slice in slices:
                scan(changes_slice, 1, relation)
            out[key].append(round(time.process_time() - c0, 4))
    return out


def elsewhere(code: str, rows_path: str, repeat: int) -> list[tuple[float, ...]]:
    """``client_work`` run by the package under ``code`` in a child process."""
    # The package first: this module puts its own tree at the front of sys.path when imported. This file's
    # client_work, by path, times both trees the same way (the other tree may have benchmarks/ of its own).
    script = ("import json, sys, runpy; sys.path.insert(0, sys.argv[1]);"
              "import airflow_provider_pglogical.staging.writer, airflow_provider_pglogical.decoding.assembler;"
              "client_work = runpy.run_path(sys.argv[2])['client_work']; import airflow_provider_pglogical as p;"
              "assert p.__file__.startswith(sys.argv[1]), p.__file__;"
              "print(json.dumps(client_work(sys.argv[3], 1)))")
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", script, code, str(Path(__file__).resolve()),
                              rows_path], check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": code})
        runs += [tuple(r) for r in json.loads(out.stdout.strip().splitlines()[-1])]
    return runs


def _client_figures(prefix: str, runs: list[tuple[float, ...]]) -> dict[str, list[float]]:
    return {f"{prefix}{key}": [run[i] for run in runs]
            for i, key in enumerate(("client_cpu_s", "decoding_thread_cpu_s", "wall_s"))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=("big", "filtered"), default="big")
    p.add_argument("--changes", type=int, default=700_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--ab-code", default=None, help="also run the client work with the package found in this directory")
    p.add_argument("--rows", default=None, help="a capture of an earlier run (skips the server)")
    args = p.parse_args()
    capture_dir: str | None = None
    if args.rows is None:  # in a directory only this user can enter (mkdtemp: 0700), since children unpickle it
        capture_dir = tempfile.mkdtemp(prefix="pglogical-bench-rows-")
    rows_path: str = args.rows or os.path.join(str(capture_dir), "rows.pkl")
    try:
        n = capture(args.changes, args.workload, rows_path) if args.rows is None else None
        ours: list[tuple[float, ...]] = []
        theirs: list[tuple[float, ...]] = []
        for _ in range(args.repeat):  # alternating, so both see the same load
            ours += elsewhere(str(Path(__file__).resolve().parent.parent), rows_path, 1)
            if args.ab_code:
                theirs += elsewhere(args.ab_code, rows_path, 1)
        result: dict[str, Any] = {"workload": args.workload, "rows": n, **_client_figures("", ours),
                                  "hand_over_cpu_s": hand_over(rows_path, args.repeat),
                                  "run_scan_cpu_s": run_scan(args.repeat),
                                  "load_average": [round(x, 2) for x in os.getloadavg()]}
        if args.ab_code:
            result |= {"ab_code": args.ab_code, **_client_figures("ab_", theirs)}
            result |= {f"ratio_{name}_min_over_ab_min": round(min(result[key]) / min(result[f"ab_{key}"]), 3)
                       for name, key in (("client_cpu", "client_cpu_s"), ("decoding_thread", "decoding_thread_cpu_s"),
                                         ("wall", "wall_s"))}
        print(json.dumps(result, indent=2))
    finally:
        if capture_dir is not None:
            shutil.rmtree(capture_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
