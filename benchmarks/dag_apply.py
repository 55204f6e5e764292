"""Benchmark: `airflow dags test` of a pipeline DAG on an empty slot and on a 100-change batch, with the PostgreSQL
apply task applying in the worker (``spark.apply_in_worker``, the default) and with every apply spark-submitted
(``apply_in_worker: false``, the route every run took before), side by side in one run.

Two specs: the example pipeline's (``dags/specs/example_pipeline.yaml``: ``orders`` row-filtered, so a batch with
``orders`` changes needs Spark until row filters are evaluated in process) and the same tables without the row
filter and column list (``plain``: a batch of inserts, updates and deletes, each key once, needs no Spark). Each
variant has its own source database, slot, target database and staging root; every run is timed as a whole
command (wall seconds, and CPU seconds of the command with every child it waited for: the task processes, the
spark-submit JVMs, OpenLineage's forks; on a shared machine the CPU seconds move far less with the load than the
wall seconds) and its output searched for the spark-submit command line the apache-spark provider logs (one per JVM
the apply task starts).

The commands run as a user runs them (``airflow`` by path, venv not activated, Spark's default JVM options).

Usage: python benchmarks/dag_apply.py [--repeat 2] [--variants example-on,example-off,plain-on,plain-off]
                                       [--json FILE] [--code DIR]
``--code DIR`` runs Airflow's tasks with another checkout's package (``PYTHONPATH=DIR``, e.g. the previous commit
exported with ``git worktree add``) for A/B runs of the ``-on`` variants.
Prints one JSON object as the last lines of stdout. The 1-minute load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from scripts.harness.airflowenv import airflow_vars, migrate  # noqa: E402
from scripts.harness.pgserver import PgServer, execute, make_database, start_server, stop_server  # noqa: E402
from scripts.harness.userenv import run_as_user, venv_script  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_SPEC = REPO / "dags" / "specs" / "example_pipeline.yaml"
DAG_ID = "pglogical_bench_dag_apply"
DAG_FILE = f'''"""Benchmark DAG: the pipeline of the spec named by PGLOGICAL_BENCH_SPEC (benchmarks/dag_apply.py)."""
import os

from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag

dag = build_pipeline_dag(os.environ["PGLOGICAL_BENCH_SPEC"], dag_id="{DAG_ID}")
'''
SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers,
                     amount numeric(12,2) NOT NULL, region text NOT NULL, note text);
CREATE UNIQUE INDEX orders_identity ON orders (id, amount, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_identity;
INSERT INTO customers SELECT g, 'customer ' || g FROM generate_series(1, 20) g;
"""
# What the apache-spark provider's SparkSubmitHook logs before it starts spark-submit: one line per JVM.
SUBMIT_LINE = "Spark-Submit cmd"


def changes(dsn: str, round_: int) -> None:
    """100 changes, each key once: 60 orders inserted, 25 of the previous round's updated and 15 deleted."""
    base, previous = round_ * 1000, (round_ - 1) * 1000
    execute(dsn, f"INSERT INTO orders SELECT {base} + g, 1 + g % 20, (g * 37) % 400, "
                 f"CASE WHEN g % 3 = 0 THEN 'US' ELSE 'EU' END, 'short' FROM generate_series(1, 60) g",
            f"UPDATE orders SET note = 'updated' WHERE id BETWEEN {previous + 1} AND {previous + 25}",
            f"DELETE FROM orders WHERE id BETWEEN {previous + 41} AND {previous + 55}")


def spec_of(kind: str, in_worker: bool, slot: str, staging: Path) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE_SPEC.read_text())
    spec["source"].update({"conn_id": "bench_source", "slot": slot, "publication": f"{slot}_pub"})
    spec["target"]["conn_id"] = "bench_target"
    spec["staging"] = {"uri": str(staging)}
    if kind == "plain":
        spec["tables"] = {"public.orders": {}, "public.customers": {}}
    if not in_worker:  # the default left unsaid: a tree without the key (``--code``) reads the spec too
        spec["spark"] = {"apply_in_worker": False}
    return spec


def dags_test(env: dict[str, str], home: Path) -> dict[str, Any]:
    """One ``airflow dags test``: its wall and CPU seconds and the spark-submits its output logs."""
    started, cpu_before = time.monotonic(), children_cpu_s()
    result = run_as_user([venv_script("airflow"), "dags", "test", DAG_ID], env, home=home, timeout=1800)
    seconds = round(time.monotonic() - started, 1)
    cpu_s = round(children_cpu_s() - cpu_before, 1)
    output = result.stdout + result.stderr
    if result.returncode != 0 or "state=success" not in output:
        raise SystemExit(f"airflow dags test failed:\n{output[-4000:]}")
    return {"seconds": seconds, "cpu_s": cpu_s, "spark_submits": output.count(SUBMIT_LINE)}


def children_cpu_s() -> float:
    """User and system CPU seconds of this process's waited-for children so far (their own waited children in)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def variant(server: PgServer, airflow_env: dict[str, str], work: Path, name: str, repeat: int) -> dict[str, Any]:
    kind, route = name.split("-")
    src, dw = make_database(server), make_database(server)
    slot = f"bench_{kind}_{route}"
    execute(server.dsn(src), SCHEMA)
    spec = work / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(spec_of(kind, route == "on", slot, work / f"staging-{name}"), sort_keys=False))
    env = {**airflow_env, "PGLOGICAL_BENCH_SPEC": str(spec), "AIRFLOW_CONN_BENCH_SOURCE": server.uri(src),
           "AIRFLOW_CONN_BENCH_TARGET": server.uri(dw)}
    home = work / "user"
    dags_test(env, home)  # creates publication and slot
    changes(server.dsn(src), 0)
    dags_test(env, home)  # the first batch creates the target tables
    runs: dict[str, list[dict[str, Any]]] = {"empty": [], "batch_100": []}
    for i in range(1, repeat + 1):
        runs["empty"].append(dags_test(env, home))
        changes(server.dsn(src), i)
        runs["batch_100"].append(dags_test(env, home))
    return {name: {"median_s": statistics.median(r["seconds"] for r in rs),
                   "median_cpu_s": statistics.median(r["cpu_s"] for r in rs), "runs": rs} for name, rs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--variants", default="example-on,example-off,plain-on,plain-off")
    parser.add_argument("--json", default=None)
    parser.add_argument("--code", default=None, help="PYTHONPATH of the Airflow commands (another checkout)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pglogical-bench-dag-"))
    dags = work / "dags"
    dags.mkdir()
    (dags / "bench_dag.py").write_text(DAG_FILE)
    airflow_env = airflow_vars(work / "airflow", dags,
                               {"PYTHONPATH": str(Path(args.code).resolve())} if args.code else None)
    try:
        migrate(airflow_env, user_home=work / "user")
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None
    server = start_server()
    load_before = os.getloadavg()[0]
    try:
        results = {name: variant(server, airflow_env, work, name, args.repeat) for name in args.variants.split(",")}
    finally:
        stop_server(server)
    out: dict[str, Any] = {"code": args.code or str(REPO),
                           "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)], **results}
    for kind in ("example", "plain"):
        on, off = results.get(f"{kind}-on"), results.get(f"{kind}-off")
        if on and off:
            out[f"{kind}_ratio"] = {run: round(on[run]["median_s"] / off[run]["median_s"], 2) for run in on}
            out[f"{kind}_cpu_ratio"] = {run: round(on[run]["median_cpu_s"] / off[run]["median_cpu_s"], 2)
                                        for run in on}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
