"""Benchmark: the round trips a Spark Connect client makes, counted and timed in the process that makes them.

Writes a ``sitecustomize`` module that, once pyspark's Connect client module is imported, times every call of
``SparkConnectClient._analyze`` (one analysis round trip: a frame's schema, columns, …, by its method),
``_execute_and_fetch`` (a plan or command run on the server: a Spark job, ``RESET``) and ``config`` (a settings
request, by its operation); each Python process started with it on its ``PYTHONPATH`` appends one JSON line of its
calls to a file at exit. ``benchmarks/small_run.py --connect --connect-calls`` puts it on the CLI's ``PYTHONPATH``
for the runs over a warm Connect server and reports each run's calls; alone, it runs one command with it:

Usage: python benchmarks/connect_calls.py -- pglogical run --spec SPEC.yaml
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

OUT_VARIABLE = "PGLOGICAL_BENCH_CONNECT_CALLS"

SITECUSTOMIZE = '''
import atexit, importlib.abc, importlib.util, json, os, sys, time

_OUT = os.environ.get("PGLOGICAL_BENCH_CONNECT_CALLS")
_CALLS = []
_MODULE = "pyspark.sql.connect.client.core"


def _timed(cls, name, kind):
    original = getattr(cls, name)

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            _CALLS.append([f"{name}:{kind(args, kwargs)}", time.perf_counter() - t0])

    setattr(cls, name, timed)


def _install(module):
    client = module.SparkConnectClient
    _timed(client, "_analyze", lambda a, k: a[0] if a else k.get("method"))
    _timed(client, "_execute_and_fetch", lambda a, k: "plan")
    _timed(client, "config", lambda a, k: a[0].WhichOneof("op_type") if a else "?")


class _Hook(importlib.abc.MetaPathFinder):
    """Patches the client once its module is imported (importing it here would cost every process its import)."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _install(module)

        spec.loader.exec_module = exec_module
        return spec


def _write():
    with open(_OUT, "a") as f:
        f.write(json.dumps({"argv": sys.argv, "calls": _CALLS}) + "\\n")


if _OUT:
    sys.meta_path.insert(0, _Hook())
    atexit.register(_write)
'''


def profiled_env(env: dict[str, str], directory: Path) -> dict[str, str]:
    """``env`` with the profiler on its ``PYTHONPATH`` (before the rest) writing to ``directory/calls.jsonl``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = directory / "calls.jsonl"
    out.unlink(missing_ok=True)
    path = os.pathsep.join(p for p in (str(directory), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, OUT_VARIABLE: str(out)}


def summary(directory: Path) -> dict[str, Any]:
    """The calls the profiled processes made: count and seconds by call and kind, and the totals."""
    out = directory / "calls.jsonl"
    counts: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    for line in out.read_text().splitlines() if out.exists() else []:
        for name, s in json.loads(line)["calls"]:
            counts[name] += 1
            seconds[name] += s
    return {"calls": {name: {"n": counts[name], "s": round(seconds[name], 3)} for name in sorted(counts)},
            "analyze_n": sum(n for name, n in counts.items() if name.startswith("_analyze:")),
            "analyze_s": round(sum(s for name, s in seconds.items() if name.startswith("_analyze:")), 3),
            "config_n": sum(n for name, n in counts.items() if name.startswith("config:")),
            "config_s": round(sum(s for name, s in seconds.items() if name.startswith("config:")), 3)}


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        raise SystemExit(__doc__)
    with tempfile.TemporaryDirectory(prefix="connect-calls-") as work:
        done = subprocess.run(command, env=profiled_env(dict(os.environ), Path(work)), check=False)
        print(json.dumps(summary(Path(work)), indent=2))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
