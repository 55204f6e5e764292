"""Benchmark: a Spark Connect server's Python workers across client sessions, and what a kept session saves.

Starts a local Connect server (``scripts/harness/sparkconnect.py``: local[2] executors), then runs one small
``mapInArrow`` job (two tasks) ``--repeat`` times each way, alternating: over a session of its own, released at its
end (as a run did before it kept its session), and over one session id reopened by every client
(``sc://host:port/;session_id=<uuid>``, left open: as ``pglogical run`` keeps it, ``pipeline/connect_session.py``).
Each task reports its worker's pid, its parent's (the session's worker daemon), the worker's age and how long it
took to import the COPY writers' module (``apply/targets/postgres/copy.py``, 0 when the worker had it). Prints
every job's wall seconds and those reports, then one JSON object with the medians and their ratio.

Usage: python benchmarks/connect_workers.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402

from scripts.harness.sparkconnect import start_server, stop  # noqa: E402

REPORT = "pid long, daemon long, age_s double, import_s double"


def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One row per task: its worker, the worker's age (``/proc``) and the COPY module's import time."""
    t0 = time.perf_counter()
    import airflow_provider_pglogical.apply.targets.postgres.copy  # noqa: F401

    imported = time.perf_counter() - t0
    with open(f"/proc/{os.getpid()}/stat") as stat, open("/proc/uptime") as uptime:
        started = int(stat.read().rpartition(")")[2].split()[19]) / os.sysconf("SC_CLK_TCK")
        age = float(uptime.read().split()[0]) - started
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "daemon": [os.getppid()], "age_s": [round(age, 2)],
                                      "import_s": [round(imported, 3)]})


def job(url: str, session_id: str | None) -> dict[str, Any]:
    """The probe's job over a new client: of its own session (released) or of ``session_id`` (left open)."""
    from pyspark.sql.connect.session import SparkSession

    t0 = time.monotonic()
    spark = SparkSession.builder.remote(url + (f"/;session_id={session_id}" if session_id else "")).create()
    spark.release_session_on_close = session_id is None
    rows = spark.range(4).repartition(2).mapInArrow(probe, REPORT).collect()
    spark.stop()
    return {"wall_s": round(time.monotonic() - t0, 2), "tasks": [r.asDict() for r in rows]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as work:
        process, url = start_server({}, Path(work) / "connect-server.log")
        try:
            kept = str(uuid.uuid4())
            job(url, None)  # the server's first plans
            runs: dict[str, list[dict[str, Any]]] = {"own_session": [], "kept_session": []}
            for i in range(args.repeat):
                for name in list(runs)[::1 if i % 2 == 0 else -1]:
                    runs[name].append(job(url, kept if name == "kept_session" else None))
                    print(name, json.dumps(runs[name][-1]), flush=True)
        finally:
            stop(process)
    load.append(os.getloadavg()[0])
    medians = {name: statistics.median(r["wall_s"] for r in found) for name, found in runs.items()}
    print(json.dumps({"load_average_1m": [round(v, 2) for v in load], "runs": runs, "median_s": medians,
                      "kept_vs_own": round(medians["kept_session"] / medians["own_session"], 3)}, indent=1))


if __name__ == "__main__":
    main()
