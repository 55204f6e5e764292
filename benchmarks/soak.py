"""Benchmark: the example pipeline run many times on a changing source, with and without staging retention.

Two copies of the example pipeline (``dags/specs/example_pipeline.yaml``: its tables, row filter, column list and
renamed target) read one source, each with its own slot, staging area and target database: one with
``staging.retention: {keep_batches: K}``, one without. Each of the ``--runs`` iterations changes the source a
little (a few customers and orders inserted, updated and deleted: one small batch) and runs both pipelines' run
steps — decode, apply, prune: what ``pglogical run`` does — in this process with one Spark session kept warm
(as a long-lived scheduler worker would not, but a cold JVM per run only adds the same seconds to both).

Reported side by side: staged batches and bytes of each staging area over the runs, and at the end the wall time
of ``pglogical status`` (the real console script: summary, and with ``--batches``) on each, and whether each
target equals the source.

Usage: python benchmarks/soak.py [--runs 200] [--keep-batches 10] [--json FILE]
Prints one JSON object as the last lines of stdout and, with ``--json``, writes it to FILE.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow.fs as pafs  # noqa: E402
import yaml  # noqa: E402

from scripts.harness.pgserver import (  # noqa: E402
    execute,
    make_database,  # noqa: E402
    query,
    start_server,
    stop_server,
)
from scripts.harness.userenv import run_as_user, venv_script  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "dags" / "specs" / "example_pipeline.yaml"
SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers,
                     amount numeric(12,2) NOT NULL, region text NOT NULL, note text);
CREATE UNIQUE INDEX orders_identity ON orders (id, amount, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_identity;
"""
CHECKS = {"orders": ("SELECT id, amount, region, note FROM orders WHERE amount > 100 AND region = 'EU' ORDER BY id",
                     "SELECT id, amount, region, note FROM orders_eu ORDER BY id"),
          "customers": ("SELECT id, name FROM customers ORDER BY id", "SELECT id, name FROM customers ORDER BY id")}


def change_source(dsn: str, i: int) -> None:
    """One small transaction: a customer and five orders inserted, two orders updated (one across the row
    filter), one deleted."""
    base = 10 * i
    execute(dsn, f"""BEGIN;
INSERT INTO customers VALUES ({i}, 'customer {i}');
INSERT INTO orders SELECT g, {i}, 50 + (g * 37) % 300, CASE WHEN g % 3 = 0 THEN 'US' ELSE 'EU' END, 'note ' || g
                   FROM generate_series({base}, {base + 4}) g;
UPDATE orders SET amount = amount + 60 WHERE id IN ({base}, {base - 9});
UPDATE customers SET name = name || '+' WHERE id = {max(i - 1, 1)};
DELETE FROM orders WHERE id = {base - 8};
COMMIT;""")


def write_spec(path: Path, server: Any, source: str, target: str, slot: str, staging: Path,
               keep_batches: int | None) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["source"] = {**doc["source"], "dsn": server.uri(source), "slot": slot, "publication": f"{slot}_pub"}
    doc["source"].pop("conn_id")
    doc["target"] = {"kind": "postgres", "dsn": server.uri(target)}
    doc["staging"] = {"uri": str(staging)}
    if keep_batches is not None:
        doc["staging"]["retention"] = {"keep_batches": keep_batches}
    doc["spark"] = {"master": "local[2]"}
    path.write_text(yaml.safe_dump(doc))
    return path


def staging_size(root: Path) -> tuple[int, int]:
    """(visible batches, bytes of every file) under a staging root."""
    fs = pafs.LocalFileSystem()
    infos = fs.get_file_info(pafs.FileSelector(str(root), recursive=True, allow_not_found=True))
    size = sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)
    return sum(1 for i in infos if i.base_name == "_manifest.json" and "/batches/" in i.path), size


def timed_status(spec: Path, *extra: str) -> float:
    t0 = time.monotonic()
    done = run_as_user([venv_script("pglogical"), "status", "--spec", str(spec), *extra], None, timeout=600)
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"pglogical status failed: {done.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--keep-batches", type=int, default=10)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    from airflow_provider_pglogical.pipeline.retention import prune
    from airflow_provider_pglogical.pipeline.runs import SparkStarter, apply_pending, decode_pending, silence_spark_logs
    from airflow_provider_pglogical.pipeline.spec import load_spec

    silence_spark_logs()
    server = start_server()
    work = Path(tempfile.mkdtemp(prefix="pglogical-soak-"))
    starter = SparkStarter("local[2]")
    try:
        source = make_database(server)
        execute(server.dsn(source), SCHEMA)
        pipelines = {}
        for name, keep in (("retention", args.keep_batches), ("no_retention", None)):
            target = make_database(server)
            spec_path = write_spec(work / f"{name}.yaml", server, source, target, f"soak_{name}",
                                   work / f"staging-{name}", keep)
            pipelines[name] = {"spec_path": spec_path, "spec": load_spec(str(spec_path)), "target": server.dsn(target),
                               "staging": work / f"staging-{name}", "sizes": []}
            decode_pending(pipelines[name]["spec"])  # creates publication and slot before the first change
        execute(server.dsn(source), "INSERT INTO customers VALUES (0, 'customer 0')")
        run_seconds: dict[str, list[float]] = {name: [] for name in pipelines}
        for i in range(1, args.runs + 1):
            change_source(server.dsn(source), i)
            for name, p in pipelines.items():
                t0 = time.monotonic()
                decode_pending(p["spec"])
                apply_pending(p["spec"], spark=starter)
                prune(p["spec"])
                run_seconds[name].append(time.monotonic() - t0)
                p["sizes"].append(staging_size(p["staging"]))
            if i % 10 == 0 or i == args.runs:
                print(f"run {i}: " + ", ".join(f"{n} {p['sizes'][-1][0]} batches {p['sizes'][-1][1]} bytes"
                                               for n, p in pipelines.items()), file=sys.stderr, flush=True)
        starter.stop()
        result: dict[str, Any] = {"runs": args.runs, "keep_batches": args.keep_batches}
        for name, p in pipelines.items():
            batches, size = p["sizes"][-1]
            equal = all(query(server.dsn(source), s) == query(p["target"], t) for s, t in CHECKS.values())
            rows = {table: len(query(p["target"], t)) for table, (_s, t) in CHECKS.items()}
            result[name] = {"batches": batches, "staging_bytes": size,
                            "staging_bytes_at": {str(r): p["sizes"][r - 1][1] for r in
                                                 sorted({max(args.runs // 4, 1), max(args.runs // 2, 1), args.runs})},
                            "run_s_median": round(sorted(run_seconds[name])[len(run_seconds[name]) // 2], 2),
                            "status_s": round(timed_status(p["spec_path"]), 2),
                            "status_batches_s": round(timed_status(p["spec_path"], "--batches"), 2),
                            "target_rows": rows, "target_equals_source": equal}
        r, n = result["retention"], result["no_retention"]
        result["ratios"] = {"staging_bytes": round(n["staging_bytes"] / max(r["staging_bytes"], 1), 2),
                            "status_s": round(n["status_s"] / max(r["status_s"], 0.01), 2)}
        text = json.dumps(result, indent=2)
        print(text)
        if args.json:
            Path(args.json).write_text(text + "\n")
        return 0 if r["target_equals_source"] and n["target_equals_source"] else 1
    finally:
        starter.stop()
        stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
