"""Benchmark: `pglogical run` with staging on S3 — a first run (creates publication and slot), an empty run and a
100-change batch — counting each command's requests to the store, its CPU seconds and whether it started Spark.

The store is moto's S3 server on 127.0.0.1, in this process behind a middleware that counts every request (and the
directory-marker PUTs among them: keys ending in ``/``). The commands run as a user runs them (console script by
path, venv not activated, the store's credentials in their environment) with a local master, so the ``pglogical``
process reads the staged files itself and none of these runs needs a JVM: ``JAVA_HOME`` points nowhere, a Spark start
would fail the run. With ``--code DIR`` every step runs for this checkout and for DIR's package (``PYTHONPATH=DIR``,
e.g. an exported older tree) alternately, each on a slot and target of its own, side by side.

Usage: python benchmarks/object_store_runs.py [--repeat 3] [--code DIR] [--json FILE] [--paths]
Prints one JSON object; the 1-minute load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from scripts.harness.pgserver import execute, make_database, start_server, stop_server  # noqa: E402
from scripts.harness.userenv import run_as_user, venv_script  # noqa: E402

SCHEMA = "CREATE TABLE t (id int PRIMARY KEY, a int NOT NULL, b text);"
Requests = list[tuple[str, str]]


@contextmanager
def counted_s3() -> Iterator[tuple[str, dict[str, str], Requests]]:
    """A moto S3 server with one bucket, the environment that reaches it, and the (method, path) of every request
    (a listing's path ends with ``?prefix=`` and the prefix it lists)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    seen: Requests = []
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    assert moto._server is not None
    app = moto._server.app

    def counting(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        listed = re.search(r"(?:^|&)prefix=([^&]*)", environ.get("QUERY_STRING", ""))
        seen.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", "") + (f"?prefix={listed[1]}" if listed else "")))
        return app(environ, start_response)

    moto._server.app = counting
    try:
        host, port = moto.get_host_and_port()
        env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "bench-key",
               "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ALLOW_HTTP": "true"}
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="bench-key",
                     aws_secret_access_key="bench-secret", region_name="us-east-1").create_bucket(Bucket="bench")
        seen.clear()
        yield "s3://bench/staging", env, seen
    finally:
        moto.stop()


def by_path(seen: Requests) -> dict[str, int]:
    """Requests per method and path, LSNs and times in names (hex or digit runs of 8 or more) shown as ``<n>``."""
    return dict(sorted(Counter(f"{m} {re.sub(r'[0-9A-Fa-f]{8,}|[0-9]{8}T[0-9]+Z', '<n>', p)}" for m, p in seen).items()))


def measured_run(spec: Path, env: dict[str, str], seen: Requests, paths: bool = False) -> dict[str, Any]:
    """One ``pglogical run``: wall and CPU seconds (the command and what it started), the store's requests (per path
    when ``paths``), Spark."""
    seen.clear()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    done = run_as_user([venv_script("pglogical"), "run", "--spec", str(spec)], env, timeout=600)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"pglogical run failed: {done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    return {"wall_s": round(wall, 2),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            "requests": len(seen), "marker_puts": sum(m == "PUT" and p.endswith("/") for m, p in seen),
            "spark_started": (out.get("spark") or {}).get("started"), "batches_applied": out["apply"]["batches_applied"],
            **({"by_path": by_path(seen)} if paths else {})}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3, help="empty runs and 100-change batches per checkout")
    p.add_argument("--code", type=Path, default=None, help="also run the CLI with this checkout's package (PYTHONPATH)")
    p.add_argument("--json", type=Path, default=None, help="also write the result to this file")
    p.add_argument("--paths", action="store_true", help="also count each run's requests per method and path")
    args = p.parse_args()
    load_before = float(Path("/proc/loadavg").read_text().split()[0])
    server = start_server()
    work = Path(tempfile.mkdtemp(prefix="pglogical-objstore-"))
    codes = {"this_checkout": {}, **({"code": {"PYTHONPATH": str(args.code.resolve())}} if args.code else {})}
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        with counted_s3() as (root, store_env, seen):
            pipelines = {}
            for name, code_env in codes.items():
                source, target = make_database(server), make_database(server)
                execute(server.dsn(source), SCHEMA)
                execute(server.dsn(target), SCHEMA)
                spec = work / f"{name}.yaml"
                spec.write_text(yaml.safe_dump({
                    "source": {"dsn": server.uri(source), "publication": f"{name}_pub", "slot": f"{name}_slot",
                               "create": True},
                    "staging": {"uri": f"{root}/{name}"}, "target": {"kind": "postgres", "dsn": server.uri(target)},
                    "tables": {"public.t": {}}, "spark": {"master": "local[2]"}}))
                env = {**store_env, **code_env, "JAVA_HOME": str(work / "no-java-here")}
                pipelines[name] = (spec, env, server.dsn(source))
            steps = [("first", None)] + [(kind, i) for i in range(args.repeat) for kind in ("empty", "batch")]
            for n, (kind, i) in enumerate(steps):
                # each checkout goes first as often as the other
                for name, (spec, env, dsn) in list(pipelines.items())[::1 if n % 2 == 0 else -1]:
                    if kind == "batch":
                        base = 1000 * (i or 0)
                        execute(dsn, f"INSERT INTO t SELECT g, g, md5(g::text) FROM generate_series({base + 1}, "
                                     f"{base + 60}) g; UPDATE t SET a = -a WHERE id BETWEEN {base + 1} AND {base + 30};"
                                     f"DELETE FROM t WHERE id BETWEEN {base + 51} AND {base + 60}")
                    runs.setdefault(f"{kind}/{name}", []).append(measured_run(spec, env, seen, args.paths))
    finally:
        stop_server(server)
    medians = {key: {m: statistics.median(r[m] for r in found) for m in ("wall_s", "cpu_s", "requests")}
               for key, found in runs.items()}
    result = json.dumps({"runs": runs, "medians": medians,
                         "load_average_1m": [load_before, float(Path("/proc/loadavg").read_text().split()[0])]},
                        indent=2)
    print(result)
    if args.json:
        args.json.write_text(result + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
