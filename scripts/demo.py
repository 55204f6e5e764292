"""`make demo`: a local PostgreSQL 15, a small workload, the example pipeline DAG via `airflow dags test`, the same
staged changes applied into a local Delta Lake target with `pglogical apply`, and a report comparing both with the source."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the throwaway-server helper: scripts/harness/ in the checkout

import psycopg2  # noqa: E402
import yaml  # noqa: E402

from scripts.harness.pgserver import PgServer, start_server, stop_server  # noqa: E402
from scripts.harness.userenv import user_env  # noqa: E402

# PGLOGICAL_DEMO_DIR: where the demo keeps its server, staging and Airflow home (the tests use a temp dir).
DEMO_DIR = Path(os.environ.get("PGLOGICAL_DEMO_DIR") or REPO / ".cache" / "demo").resolve()
STATE = DEMO_DIR / "server.json"
SPEC = REPO / "dags" / "specs" / "example_pipeline.yaml"
DELTA_SPEC = DEMO_DIR / "delta_pipeline.yaml"
LAKE = DEMO_DIR / "lake"
DAG_ID = "pglogical_example_pipeline"
VENV_BIN = Path(sys.executable).parent

SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, country text NOT NULL);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers,
                     amount numeric(12,2) NOT NULL, region text NOT NULL, note text);
-- The row filter uses amount and region: PostgreSQL requires them in the replica identity.
CREATE UNIQUE INDEX orders_identity ON orders (id, amount, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_identity;
-- Store notes out of line uncompressed, so long ones are TOASTed and UPDATEs send them as "unchanged".
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
"""
WORKLOAD = [
    ("insert 50 customers and 400 orders",
     "INSERT INTO customers SELECT g, 'customer ' || g, (ARRAY['DE','FR','US'])[1 + g % 3] FROM generate_series(1, 50) g;"
     "INSERT INTO orders SELECT g, 1 + g % 50, (g * 37) % 500, CASE WHEN g % 4 = 0 THEN 'US' ELSE 'EU' END,"
     " CASE WHEN g % 10 = 0 THEN repeat('long delivery instructions ', 400) ELSE 'ok' END"
     " FROM generate_series(1, 400) g;"),
    ("update 40 orders (TOASTed notes unchanged)", "UPDATE orders SET customer_id = 1 + (customer_id + 1) % 50 WHERE id % 10 = 0;"),
    ("move 30 orders out of the filter", "UPDATE orders SET region = 'US' WHERE id BETWEEN 1 AND 40 AND region = 'EU';"),
    ("delete 36 orders", "DELETE FROM orders WHERE id % 11 = 0;"),
    ("rename 5 customers", "UPDATE customers SET name = name || ' GmbH' WHERE id <= 5;"),
]
WORKLOAD_2 = [
    ("truncate orders", "TRUNCATE orders;"),
    ("insert 120 new orders", "INSERT INTO orders SELECT g, 1 + g % 50, 90 + g % 60, 'EU', 'reordered' "
                              "FROM generate_series(1000, 1119) g;"),
]
CHECKS = [
    ("orders (amount > 100 AND region = 'EU') → orders_eu",
     "SELECT id, amount, region, note FROM orders WHERE amount > 100 AND region = 'EU' ORDER BY id",
     "SELECT id, amount, region, note FROM orders_eu ORDER BY id"),
    ("customers → customers", "SELECT id, name, country FROM customers ORDER BY id",
     "SELECT id, name, country FROM customers ORDER BY id"),
]


def say(text: str = "") -> None:
    print(text, flush=True)


def step(text: str) -> None:
    say(f"\n==> {text}")


def load_state() -> PgServer | None:
    if not STATE.exists():
        return None
    raw = json.loads(STATE.read_text())
    return PgServer(bin_dir=Path(raw["bin_dir"]), data_dir=Path(raw["data_dir"]), port=raw["port"])


def stop() -> None:
    server = load_state()
    if server is not None:
        stop_server(server)
        say(f"stopped the demo PostgreSQL on port {server.port} and removed {server.data_dir.parent}")
    shutil.rmtree(DEMO_DIR, ignore_errors=True)
    say(f"removed {DEMO_DIR}")


def execute(dsn: str, statements: str) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(statements)
    conn.close()


def rows(dsn: str, query: str) -> list[tuple]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(query)
        out = cur.fetchall()
    conn.close()
    return out


def shown(path: Path) -> Path:
    """A path relative to the repository when it is inside it (shorter to read and to copy)."""
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def run(cmd: list[str], env: dict[str, str], log: Path, what: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    offset = log.stat().st_size if log.exists() else 0
    with open(log, "a") as out:
        result = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    with open(log) as f:
        f.seek(offset)
        output = f.read()
    # `airflow dags test` can exit 0 with failed tasks: the DagRun's final state decides.
    if result.returncode != 0 or ("dags" in cmd and "DagRun Finished" in output and "state=success" not in output):
        say(f"    FAILED: {what} (exit {result.returncode}); last lines of {log}:")
        say("".join(log.read_text().splitlines(keepends=True)[-40:]))
        raise SystemExit(1)
    say(f"    {what}: ok in {time.monotonic() - started:.0f}s (log: {shown(log)})")
    return result


def main() -> None:
    if load_state() is not None:
        say("a previous demo is still set up: stopping it first")
        stop()
    DEMO_DIR.mkdir(parents=True)
    airflow_home = DEMO_DIR / "airflow"
    staging = DEMO_DIR / "staging"
    log = DEMO_DIR / "demo.log"

    step("starting PostgreSQL 15 (wal_level=logical)")
    server = start_server()
    STATE.write_text(json.dumps({"bin_dir": str(server.bin_dir), "data_dir": str(server.data_dir),
                                 "port": server.port}))
    for db in ("app", "dw"):
        execute(server.dsn(), f"CREATE DATABASE {db}")
    source, target = server.dsn("app"), server.dsn("dw")
    execute(source, SCHEMA)
    say(f"    source    {server.uri('app')}  (customers, orders → FK customers; TOASTed orders.note)")
    say(f"    warehouse {server.uri('dw')}")

    # The commands run as a user runs them: venv not activated (scripts by path), nothing exported
    # but the Airflow home and DAGs folder, no example DAGs, the three connections and the staging root.
    env = user_env(Path.home(), {
        "AIRFLOW_HOME": str(airflow_home), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_PGLOGICAL_SOURCE": server.uri("app"), "AIRFLOW_CONN_PGLOGICAL_TARGET": server.uri("dw"),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PGLOGICAL_STAGING_URI": str(staging)})
    airflow = str(VENV_BIN / "airflow")

    step("preparing Airflow (SQLite metadata) and creating publication + slot with a first DAG run")
    run([airflow, "db", "migrate"], env, log, "airflow db migrate")
    run([airflow, "dags", "test", DAG_ID], env, log, f"airflow dags test {DAG_ID}")

    step("running the workload on the source")
    for what, statements in WORKLOAD:
        execute(source, statements)
        say(f"    {what}")
    run([airflow, "dags", "test", DAG_ID], env, log, f"airflow dags test {DAG_ID}")
    for what, statements in WORKLOAD_2:
        execute(source, statements)
        say(f"    {what}")
    run([airflow, "dags", "test", DAG_ID], env, log, f"airflow dags test {DAG_ID}")

    step("applying the same staged batches into a local Delta Lake target (pglogical apply)")
    write_delta_spec()
    say(f"    spec {shown(DELTA_SPEC)}: the example pipeline with target kind delta at {shown(LAKE)}")
    pglogical = str(VENV_BIN / "pglogical")
    run([pglogical, "apply", "--spec", str(DELTA_SPEC)], env, log, "pglogical apply (Delta target)")

    status = subprocess.run([pglogical, "status", "--spec", str(SPEC), "--batches"], env=env, capture_output=True, text=True)
    delta_status = subprocess.run([pglogical, "status", "--spec", str(DELTA_SPEC)], env=env, capture_output=True,
                                  text=True)
    for result in (status, delta_status):
        if result.returncode != 0:
            say(f"    pglogical status failed: {result.stderr.strip()}")
            raise SystemExit(1)
    report(json.loads(status.stdout), source, target)
    report_delta(json.loads(delta_status.stdout), source)
    say(f"""
The Delta tables are under {shown(LAKE)}/public/ (any Delta reader: deltalake, DuckDB, Spark with Delta, Polars).
The demo PostgreSQL keeps running so you can look around:
    psql "{server.uri('app')}"      # source
    psql "{server.uri('dw')}"       # warehouse
    env AIRFLOW_CONN_PGLOGICAL_SOURCE={server.uri('app')} AIRFLOW_CONN_PGLOGICAL_TARGET={server.uri('dw')} \\
        PGLOGICAL_STAGING_URI={staging} {VENV_BIN.relative_to(REPO)}/pglogical status --spec {SPEC.relative_to(REPO)}
Stop it and delete everything (server, staging, Airflow home, lake): make demo-stop""")


def write_delta_spec() -> None:
    """The example spec with a Delta target: the same slot's staged batches, applied a second time elsewhere."""
    doc = yaml.safe_load(SPEC.read_text())
    doc["target"] = {"kind": "delta", "uri": str(LAKE)}
    doc["spark"] = {"master": "local[2]"}
    DELTA_SPEC.write_text(yaml.safe_dump(doc, sort_keys=False))


def delta_rows(table: str, columns: str) -> list[tuple]:
    """A Delta table's current rows, read with deltalake and queried with DuckDB (two independent readers)."""
    import duckdb
    from deltalake import DeltaTable

    from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation

    data = DeltaTable(DeltaLocation(str(LAKE)).table_uri(table)).to_pyarrow_table()  # noqa: F841 (read by DuckDB)
    return [tuple(r) for r in duckdb.connect().execute(f"SELECT {columns} FROM data ORDER BY id").fetchall()]


def report(status: dict, source: str, target: str) -> None:
    step("batches staged (LSN ranges and counts)")
    for b in status["staging"]["batches"]:
        tables = ", ".join(f"{name} {n}" for name, n in b["tables"].items()) or "-"
        say(f"    {b['start_lsn']:>12} .. {b['end_lsn']:<12} {b['transactions']:>3} tx  {b['changes']:>4} changes  "
            f"{b['truncates']} truncates  {b['bytes']:>7} bytes   [{tables}]")
    slot = status["source"]["slot"]
    say(f"    slot {slot['slot']}: confirmed_flush_lsn {slot['confirmed_flush_lsn']}, lag {slot['lag_bytes']} bytes, "
        f"wal_status {slot['wal_status']}")

    step("rows applied to the warehouse (watermark = last applied end LSN)")
    for table, lsn in status["target"]["watermarks"].items():
        count = rows(target, f"SELECT count(*) FROM {table}")[0][0]  # names from our own progress table
        say(f"    {table:<22} {count:>5} rows   watermark {lsn}")

    step("source vs warehouse")
    ok = True
    for label, source_query, target_query in CHECKS:
        expected, actual = rows(source, source_query), rows(target, target_query)
        same = expected == actual
        ok &= same
        say(f"    {'OK  ' if same else 'DIFF'} {label}: {len(expected)} rows in source, {len(actual)} in warehouse")
    if not ok:
        raise SystemExit("source and warehouse differ")


def report_delta(status: dict, source: str) -> None:
    step("rows in the Delta tables (watermark = app transaction in each table's Delta log)")
    for table, lsn in status["target"]["watermarks"].items():
        say(f"    {table:<22} {len(delta_rows(table, 'id')):>5} rows   watermark {lsn}")
    step("source vs Delta tables")
    ok = True
    for label, source_query, target_query in CHECKS:
        columns, table = target_query.removeprefix("SELECT ").split(" FROM ")
        table = table.split(" ")[0]
        expected, actual = rows(source, source_query), delta_rows(f"public.{table}", columns)
        same = expected == actual
        ok &= same
        say(f"    {'OK  ' if same else 'DIFF'} {label}: {len(expected)} rows in source, {len(actual)} in Delta")
    if not ok:
        raise SystemExit("source and Delta tables differ")


if __name__ == "__main__":
    if sys.argv[1:] == ["stop"]:
        stop()
    else:
        main()
