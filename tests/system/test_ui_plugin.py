"""The UI view on a real ``airflow api-server``: the plugin found through its entry point, its pages behind Airflow's
login, each pipeline's report drawn from the history a real ``pglogical decode`` wrote."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import yaml

from scripts.harness.pgserver import execute
from scripts.harness.ports import free_port
from scripts.harness.userenv import run_as_user, venv_script

START_TIMEOUT = 180


class ApiServer:
    def __init__(self, port: int, log) -> None:
        self.port, self.log, self.token = port, log, ""

    def get(self, path: str, *, auth: bool = True) -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                         headers={"Authorization": f"Bearer {self.token}"} if auth else {})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def login(self, password: str) -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/auth/token", method="POST",
                                         data=json.dumps({"username": "admin", "password": password}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            self.token = json.loads(response.read())["access_token"]


@pytest.fixture
def pipeline_specs(pg_server, pg_dsn, pg_dbname, tmp_path) -> Iterator[dict[str, str]]:
    """A specs folder with one pipeline whose history holds a real decode, and one spec that does not load."""
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, name text)")
    folder = tmp_path / "specs"
    folder.mkdir()
    doc = {"source": {"dsn": pg_server.uri(pg_dbname), "publication": "ui_pub", "slot": "ui_slot", "create": True},
           "staging": {"uri": str(tmp_path / "staging")},
           "target": {"kind": "postgres", "dsn": pg_server.uri(pg_dbname)}, "tables": {"public.items": {}}}
    (folder / "orders.yaml").write_text(yaml.safe_dump(doc))
    (folder / "broken.yaml").write_text("source: [not, a, mapping]\n")
    for step in range(2):  # the first creates the slot, the second stages what was written since
        if step:
            execute(pg_dsn, "INSERT INTO items SELECT g, 'x' FROM generate_series(1, 100) g")
        decoded = run_as_user([venv_script("pglogical"), "decode", "--spec", str(folder / "orders.yaml")], timeout=300)
        assert decoded.returncode == 0, decoded.stderr[-2000:]
    yield {"folder": str(folder)}
    execute(pg_dsn, "SELECT pg_drop_replication_slot('ui_slot')")


@pytest.fixture
def api_server(airflow, pipeline_specs, tmp_path) -> Iterator[tuple[ApiServer, str]]:
    port, password = free_port(), secrets.token_hex(8)
    (tmp_path / "passwords.json").write_text(json.dumps({"admin": password}))
    env = {**airflow.env, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(tmp_path / "passwords.json"),
           "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16), "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
           "AIRFLOW__PGLOGICAL__SPECS_FOLDER": pipeline_specs["folder"]}
    log_path = tmp_path / "api-server.out"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([venv_script("airflow"), "api-server", "--port", str(port), "--host", "127.0.0.1",
                                 "--workers", "1"], env=env, cwd=airflow.home / "user", stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = ApiServer(port, lambda: log_path.read_text(errors="replace")[-4000:])
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if server.get("/api/v2/monitor/health", auth=False)[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"api-server did not come up (exit {proc.poll()}):\n{server.log()}")
            time.sleep(0.1)  # a refused connection costs nothing: the wait ends within 0.1 s of the server's start
        yield server, password
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_the_api_server_serves_each_pipelines_report_to_logged_in_users_only(api_server):
    server, password = api_server
    status, _body = server.get("/pglogical/", auth=False)
    assert status == 401, server.log()

    server.login(password)
    status, body = server.get("/api/v2/plugins")
    assert status == 200, body
    plugin = next(p for p in json.loads(body)["plugins"] if p["name"] == "pglogical")
    assert [v["href"] for v in plugin["external_views"]] == ["/pglogical/"]

    status, index = server.get("/pglogical/")
    assert status == 200, server.log()
    assert '<a href="report/orders">orders</a> — slot ui_slot → postgres' in index
    assert "broken" in index and "spec not loaded" in index

    status, page = server.get("/pglogical/report/orders")
    assert status == 200, server.log()
    assert page.count('<svg class="chart"') == 4 and page.count('<circle class="point"') > 0
    status, body = server.get("/pglogical/report/orders/json")
    runs = json.loads(body)["runs"]
    assert [(r["kind"], r["outcome"], r["changes"]) for r in runs] == [("decode", "ok", 0), ("decode", "ok", 100)]
    assert json.loads(body)["current"]["health"] == "ok"

    assert server.get("/pglogical/report/nothing")[0] == 404
    status, body = server.get("/pglogical/report/orders?since=soon")
    assert status == 400 and "an age" in body
