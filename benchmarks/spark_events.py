"""Read a Spark event log (``spark.eventLog.enabled``) into job/stage timings: where the apply's Spark seconds go.

Usage: python benchmarks/spark_events.py <event-log-dir-or-file>   (prints a table per job)
``summarize`` is what ``benchmarks/apply.py --event-log`` calls.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

# Accumulables of the Arrow Python runner (mapInArrow) worth showing, when this Spark version reports them.
PYTHON_METRICS = ("time spent executing", "python", "data sent to Python", "data returned from Python")


def _events(path: Path) -> list[dict[str, Any]]:
    """Every event of the log: a file, a rolling-log directory (``eventlog_v2_*``) or a directory of either."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "appstatus")))
    else:
        files = [path]
    out: list[dict[str, Any]] = []
    for f in files:
        if f.suffix == ".zstd":  # Spark 4 compresses event logs with zstd by default
            with pa.CompressedInputStream(pa.OSFile(str(f)), "zstd") as raw:
                text = raw.read().decode()
        else:
            text = f.read_text()
        out.extend(json.loads(line) for line in text.splitlines() if line.strip())
    return out


def summarize(path: str | Path) -> dict[str, Any]:
    """Jobs (wall seconds, stages) and stages (wall, task run/CPU/GC seconds, shuffle bytes, Python metrics)."""
    events = _events(Path(path))
    stages: dict[int, dict[str, Any]] = {}
    task_sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    jobs: list[dict[str, Any]] = []
    app_start = next((e["Timestamp"] for e in events if e["Event"] == "SparkListenerApplicationStart"), None)
    for e in events:
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            jobs.append({"job": e["Job ID"], "start": e["Submission Time"], "stages": e["Stage IDs"],
                         "description": (e.get("Properties") or {}).get("spark.job.description", "")})
        elif kind == "SparkListenerJobEnd":
            for j in jobs:
                if j["job"] == e["Job ID"]:
                    j["end"] = e["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            acc = {a.get("Name", ""): a.get("Value") for a in info.get("Accumulables", [])}
            stages[info["Stage ID"]] = {
                "stage": info["Stage ID"], "name": info["Stage Name"].split(" at ")[0], "tasks": info["Number of Tasks"],
                "wall_s": (info.get("Completion Time", 0) - info.get("Submission Time", 0)) / 1000,
                "python": {k: v for k, v in acc.items() if any(m in k for m in PYTHON_METRICS)},
            }
        elif kind == "SparkListenerTaskEnd":
            m = e.get("Task Metrics") or {}
            s = task_sums[e["Stage ID"]]
            s["run_s"] += m.get("Executor Run Time", 0) / 1000
            s["cpu_s"] += m.get("Executor CPU Time", 0) / 1e9
            s["gc_s"] += m.get("JVM GC Time", 0) / 1000
            s["shuffle_write_mb"] += (m.get("Shuffle Write Metrics") or {}).get("Shuffle Bytes Written", 0) / 2**20
            s["input_mb"] += (m.get("Input Metrics") or {}).get("Bytes Read", 0) / 2**20
    for sid, sums in task_sums.items():
        if sid in stages:
            stages[sid].update({k: round(v, 2) for k, v in sums.items()})
    for j in jobs:
        j["wall_s"] = round((j.get("end", j["start"]) - j["start"]) / 1000, 2)
        j["offset_s"] = round((j["start"] - app_start) / 1000, 2) if app_start else None
    return {"jobs": jobs, "stages": [stages[k] for k in sorted(stages)],
            "job_wall_s": round(sum(j["wall_s"] for j in jobs), 2)}


def main() -> int:
    summary = summarize(sys.argv[1])
    for j in summary["jobs"]:
        print(f"job {j['job']:>3} at +{j['offset_s']}s  {j['wall_s']:>7.2f}s  stages {j['stages']}")
        for sid in j["stages"]:
            s = next((s for s in summary["stages"] if s["stage"] == sid), None)
            if s:
                print(f"    stage {sid:>3} {s['name'][:40]:<40} tasks {s['tasks']:>3} wall {s['wall_s']:>7.2f}s "
                      f"run {s.get('run_s', 0):>7.2f}s cpu {s.get('cpu_s', 0):>7.2f}s gc {s.get('gc_s', 0):>5.2f}s "
                      f"in {s.get('input_mb', 0):>6.1f}MB shuffle {s.get('shuffle_write_mb', 0):>6.1f}MB {s['python']}")
    print(f"total job wall {summary['job_wall_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
