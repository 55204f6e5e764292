"""The example pipeline DAG on a running Airflow, driven the way users drive it.

Scheduler, API server, dag-processor and triggerer run as separate processes on 127.0.0.1 (as a
user starts them, venv not activated), LocalExecutor, metadata on a database of the suite's
PostgreSQL. Then: a run triggered through the public REST API with the conf the UI's trigger form
sends, ``airflow backfill create`` over several logical dates, and a task cleared through the REST
API (the UI's Clear button) that re-runs. The target must equal the source, every change must be
staged exactly once and every staged batch applied exactly once.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from scripts.harness.airflowenv import airflow_vars
from scripts.harness.pgserver import drop_database, execute, make_database
from scripts.harness.pgserver import query as rows
from scripts.harness.ports import free_port
from scripts.harness.userenv import user_env, venv_script
from tests.support.spark import submit_env

# A real Airflow (api-server, scheduler, dag-processor, triggerer) on SQLite: long, so marked slow.
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "pglogical_example_pipeline"
SLOT = "app_slot"
PROCESSES = {  # name -> arguments of `airflow`; logs are read through files, so no log servers
    "api-server": ["api-server", "--workers", "1"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
}
START_TIMEOUT = 300
RUN_TIMEOUT = 600
# The waits poll the metadata database on one connection (a query costs PostgreSQL and this process well under a
# millisecond; a REST call costs the API server tens of milliseconds of CPU), often, so a wait ends soon after what it
# waits for while the four services keep spending CPU; what a test asserts is then read once through the REST API.
POLL_S = 0.2
SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers,
                     amount numeric(12,2) NOT NULL, region text NOT NULL, note text);
CREATE UNIQUE INDEX orders_identity ON orders (id, amount, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_identity;
"""
PHASE_1 = [
    "INSERT INTO customers SELECT g, 'customer ' || g FROM generate_series(1, 20) g",
    "INSERT INTO orders SELECT g, 1 + g % 20, (g * 37) % 400, CASE WHEN g % 3 = 0 THEN 'US' ELSE 'EU' END, 'n' "
    "FROM generate_series(1, 60) g",
    "UPDATE orders SET note = 'updated' WHERE id % 7 = 0",
    "DELETE FROM orders WHERE id % 11 = 0",
]
PHASE_2 = [
    "UPDATE customers SET name = name || ' (vip)' WHERE id <= 5",
    "UPDATE orders SET region = 'US' WHERE id = 1",
    "INSERT INTO orders SELECT g, 1 + g % 20, 100 + g * 3, 'EU', 'late' FROM generate_series(100, 130) g",
    "DELETE FROM orders WHERE id BETWEEN 40 AND 50",
]
PHASE_3 = [
    "INSERT INTO customers VALUES (500, 'late customer')",
    "INSERT INTO orders VALUES (500, 500, 999, 'EU', 'late order')",
    "UPDATE orders SET amount = amount + 1 WHERE id BETWEEN 100 AND 110",
]
ORDERS_SOURCE = "SELECT id, amount, region, note FROM orders WHERE amount > 100 AND region = 'EU' ORDER BY id"
ORDERS_TARGET = "SELECT id, amount, region, note FROM orders_eu ORDER BY id"
CUSTOMERS = "SELECT id, name FROM customers ORDER BY id"


def run_dml(dsn: str, statements: list[str]) -> int:
    """Run each statement in its own transaction; the number of rows they changed."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    changed = 0
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
                changed += cur.rowcount
    finally:
        conn.close()
    return changed


def wait_for(what: str, check: Callable[[], Any], timeout: float, logs: Callable[[], str]) -> Any:
    """Poll ``check`` until it returns something truthy; fail with the processes' log tails after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except OSError as exc:  # the server is not up yet (URLError and HTTPError are OSErrors)
            last = exc
        else:
            if result:
                return result
            last = result
        time.sleep(POLL_S)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})\n{logs()}")


class RunningAirflow:
    """Airflow's four services as subprocesses, plus its REST API and CLI, all in a user-like environment."""

    def __init__(self, home: Path, env: dict[str, str], port: int, password: str, meta_dsn: str) -> None:
        self.home, self.env, self.port, self.password, self.meta_dsn = home, env, port, password, meta_dsn
        self.procs: dict[str, subprocess.Popen] = {}
        self.token = ""
        self._meta: Any = None  # one connection for the waits' polls, not a server process forked per poll

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([venv_script("airflow"), *args], env=self.env, cwd=self.home, capture_output=True,
                              text=True, timeout=timeout)

    def start(self) -> None:
        for name, args in PROCESSES.items():
            log = (self.home / f"{name}.out").open("wb")
            # A session of its own: stop() kills the service with its task and spark-submit children.
            self.procs[name] = subprocess.Popen([venv_script("airflow"), *args], env=self.env, cwd=self.home,
                                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()

    def stop(self) -> None:
        if self._meta is not None:
            self._meta.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for proc in self.procs.values():  # children left behind by a service that exited first
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def logs(self) -> str:
        tails = []
        for name in PROCESSES:
            path = self.home / f"{name}.out"
            text = path.read_text(errors="replace") if path.exists() else ""
            state = self.procs[name].poll() if name in self.procs else "not started"
            tails.append(f"--- {name} (exit: {state}) ---\n{text[-2500:]}")
        return "\n".join(tails)

    def api(self, method: str, path: str, body: dict | None = None, *, auth: bool = True) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     **({"Authorization": f"Bearer {self.token}"} if auth else {})})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read() or b"null")

    def login(self) -> None:
        """The simple auth manager's token endpoint, with the user and password from its passwords file."""
        self.token = self.api("POST", "/auth/token", {"username": "admin", "password": self.password},
                              auth=False)["access_token"]

    def meta(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of the metadata database (what the waits poll; the REST API is read once they are over)."""
        if self._meta is None:
            self._meta = psycopg2.connect(self.meta_dsn)
            self._meta.autocommit = True  # each poll sees what the services committed since the last
        with self._meta.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    def runs(self) -> list[dict[str, Any]]:
        return self.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=100&order_by=run_after")["dag_runs"]

    def task_instances(self, run_id: str) -> dict[str, dict[str, Any]]:
        tis = self.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti for ti in tis}

    def wait_until_finished(self, run_ids: list[str], timeout: float = RUN_TIMEOUT) -> dict[str, str]:
        """The runs' final states, read through the REST API once the metadata database shows them all finished."""
        def finished() -> bool:
            states = dict(self.meta("SELECT run_id, state FROM dag_run WHERE dag_id = %s", DAG_ID))
            return all(states.get(run_id) in ("success", "failed") for run_id in run_ids)

        wait_for(f"runs {run_ids} to finish", finished, timeout, self.logs)
        return {r["dag_run_id"]: r["state"] for r in self.runs() if r["dag_run_id"] in run_ids}

    def runs_when(self, what: str, sql: str, *params: Any, timeout: float = START_TIMEOUT) -> list[dict[str, Any]]:
        """The DAG's runs through the REST API, once the metadata database query ``sql`` returns a row."""
        wait_for(what, lambda: self.meta(sql, *params), timeout, self.logs)
        return self.runs()


def write_config(home: Path, *, port: int, meta_uri: str, password: str) -> None:
    """airflow.cfg as a user would write it for a single machine whose DAG files do not change (everything else is
    Airflow's default)."""
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    (home / "airflow.cfg").write_text(f"""
[core]
dags_folder = {REPO_ROOT / 'dags'}
executor = LocalExecutor
parallelism = 4
load_examples = False
simple_auth_manager_users = admin:admin
simple_auth_manager_passwords_file = {home / 'passwords.json'}
execution_api_server_url = http://127.0.0.1:{port}/execution/

[database]
sql_alchemy_conn = {meta_uri}

[api]
host = 127.0.0.1
port = {port}
base_url = http://127.0.0.1:{port}
secret_key = {secrets.token_hex(16)}

[api_auth]
jwt_secret = {secrets.token_hex(32)}

[dag_processor]
refresh_interval = 5
# The DAG files do not change during the test: parsed once at the start, not again every 30 s (Airflow's default), each
# parse a process importing the DAG file (seconds of CPU per file and parse, for the whole of the test).
min_file_process_interval = 3600
""")


@pytest.fixture(scope="module")
def airflow_services(pg_server, tmp_path_factory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("airflow-services")
    staging = tmp_path_factory.mktemp("staging")
    src, dw, meta = make_database(pg_server), make_database(pg_server), make_database(pg_server)
    port, password = free_port(), secrets.token_urlsafe(12)
    write_config(home, port=port, meta_uri=pg_server.uri(meta).replace("postgresql://", "postgresql+psycopg2://"),
                 password=password)
    # Exported: only AIRFLOW_HOME, the DAG's three connections, the spec's staging root and SPARK_SUBMIT_OPTS with
    # the suite's JVM options (tests/support/spark.py).
    env = user_env(home / "user", airflow_vars(home, extra={
        "AIRFLOW_CONN_PGLOGICAL_SOURCE": pg_server.uri(src), "AIRFLOW_CONN_PGLOGICAL_TARGET": pg_server.uri(dw),
        "PGLOGICAL_STAGING_URI": str(staging), **submit_env()}))
    (home / "user").mkdir()
    airflow = RunningAirflow(home, env, port, password, pg_server.dsn(meta))
    try:
        migrated = airflow.cli("db", "migrate")
        assert migrated.returncode == 0, migrated.stderr[-4000:]
        airflow.start()
        wait_for("the API server", lambda: airflow.api("GET", "/api/v2/monitor/health", auth=False), START_TIMEOUT,
                 airflow.logs)
        airflow.login()
        wait_for(f"{DAG_ID} to be parsed",
                 lambda: airflow.meta("SELECT 1 FROM serialized_dag WHERE dag_id = %s", DAG_ID), START_TIMEOUT,
                 airflow.logs)
        assert _dag_parsed(airflow)
        yield {"airflow": airflow, "src": pg_server.dsn(src), "dw": pg_server.dsn(dw), "staging": staging}
    finally:
        airflow.stop()
        for db in (src, dw, meta):
            drop_database(pg_server, db)


def _dag_parsed(airflow: RunningAirflow) -> bool:
    try:
        return airflow.api("GET", f"/api/v2/dags/{DAG_ID}")["dag_id"] == DAG_ID
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise


def manifests(staging: Path) -> list[dict[str, Any]]:
    return sorted((json.loads(p.read_text()) for p in staging.glob(f"{SLOT}/batches/*/_manifest.json")),
                  key=lambda m: _lsn(m["end_lsn"]))


def _lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def applied_batches(home: Path) -> list[int]:
    """End LSNs of the batches every apply attempt reported as applied (its JSON summary line)."""
    ends: list[int] = []
    for log in sorted(home.glob(f"logs/dag_id={DAG_ID}/**/task_id=pglogical.apply/attempt=*.log")):
        for line in log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line).get("event", "") if line.startswith("{") else line
            except ValueError:
                event = line
            start = event.find('{"slot": ')
            if start >= 0:
                summary = json.loads(event[start:])
                ends += [int(end, 16) for end in summary["rows"]]
    return ends


def test_ui_trigger_backfill_and_clear_on_a_running_airflow(airflow_services):
    airflow: RunningAirflow = airflow_services["airflow"]
    src, dw, staging = airflow_services["src"], airflow_services["dw"], airflow_services["staging"]
    execute(src, SCHEMA)

    # Unpausing (the UI's toggle) schedules the latest interval: that run creates publication and slot.
    airflow.api("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    first = airflow.runs_when("the scheduled run", "SELECT 1 FROM dag_run WHERE dag_id = %s", DAG_ID)
    assert first
    assert airflow.wait_until_finished([r["dag_run_id"] for r in first]) == {r["dag_run_id"]: "success" for r in first}
    changes = run_dml(src, PHASE_1)

    # (a) The trigger form posts every param of the DAG as conf (here with max_changes changed).
    dag = airflow.api("GET", f"/api/v2/dags/{DAG_ID}/details")
    conf = {name: param["value"] for name, param in dag["params"].items()} | {"max_changes": 500}
    triggered = airflow.api("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": conf})
    assert airflow.wait_until_finished([triggered["dag_run_id"]]) == {triggered["dag_run_id"]: "success"}
    assert rows(dw, ORDERS_TARGET) == rows(src, ORDERS_SOURCE) and rows(src, ORDERS_SOURCE)
    assert rows(dw, CUSTOMERS) == rows(src, CUSTOMERS)

    # (b) A backfill over three logical dates, run by the scheduler one at a time.
    changes += run_dml(src, PHASE_2)
    before = {r["dag_run_id"] for r in airflow.runs()}
    backfill = airflow.cli("backfill", "create", "--dag-id", DAG_ID, "--from-date", "2026-01-01T00:00:00+00:00",
                           "--to-date", "2026-01-01T00:30:00+00:00", "--max-active-runs", "1")
    assert backfill.returncode == 0, (backfill.stdout + backfill.stderr)[-4000:]
    backfill_runs = [r for r in airflow.runs_when("the backfill's runs", "SELECT 1 FROM dag_run WHERE dag_id = %s "
                                                  "AND run_type = 'backfill'", DAG_ID)
                     if r["dag_run_id"] not in before and r["run_type"] == "backfill"]
    assert len(backfill_runs) >= 3, backfill_runs
    states = airflow.wait_until_finished([r["dag_run_id"] for r in backfill_runs])
    assert set(states.values()) == {"success"}, states
    assert rows(dw, ORDERS_TARGET) == rows(src, ORDERS_SOURCE)
    assert rows(dw, CUSTOMERS) == rows(src, CUSTOMERS)

    # (c) Clear the triggered run's decode with its downstream apply (the UI's Clear button): it re-runs
    # and picks up what changed since.
    changes += run_dml(src, PHASE_3)
    run_id = triggered["dag_run_id"]
    tries = {t: ti["try_number"] for t, ti in airflow.task_instances(run_id).items()}
    airflow.api("POST", f"/api/v2/dags/{DAG_ID}/clearTaskInstances",
                {"dag_run_id": run_id, "task_ids": ["pglogical.decode"], "include_downstream": True,
                 "only_failed": False, "dry_run": False})
    wait_for("the cleared decode to run again",
             lambda: airflow.meta("SELECT 1 FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = %s "
                                  "AND try_number > %s", DAG_ID, run_id, "pglogical.decode", tries["pglogical.decode"]),
             RUN_TIMEOUT, airflow.logs)
    assert airflow.task_instances(run_id)["pglogical.decode"]["try_number"] > tries["pglogical.decode"]
    assert airflow.wait_until_finished([run_id]) == {run_id: "success"}
    assert airflow.task_instances(run_id)["pglogical.apply"]["try_number"] > tries["pglogical.apply"]
    assert rows(dw, ORDERS_TARGET) == rows(src, ORDERS_SOURCE)
    assert rows(dw, CUSTOMERS) == rows(src, CUSTOMERS)
    assert (500, "late customer") in rows(dw, CUSTOMERS)

    # Every run succeeded; every change was staged once, in contiguous batches; each batch applied once.
    assert {r["state"] for r in airflow.runs()} == {"success"}
    staged = manifests(staging)
    assert [m["start_lsn"] for m in staged[1:]] == [m["end_lsn"] for m in staged[:-1]]
    assert sum(int(t["rows"]) for m in staged for t in m["tables"].values()) == changes
    applied = applied_batches(airflow.home)
    assert sorted(applied) == [_lsn(m["end_lsn"]) for m in staged]
    marks = dict(rows(dw, "SELECT target_table, end_lsn::text FROM pglogical_progress WHERE slot = %s", (SLOT,)))
    assert set(marks.values()) == {staged[-1]["end_lsn"]}
