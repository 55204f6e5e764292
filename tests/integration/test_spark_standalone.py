"""The same operator against a Spark standalone master + worker on 127.0.0.1 (started and stopped here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from airflow_provider_pglogical.operators.apply import PgLogicalApplyOperator
from scripts.harness.pgserver import free_port, make_target
from scripts.harness.pgserver import query as rows
from tests.integration.test_apply_operator import stage_orders, target_connection
from tests.support.spark import TEST_JVM_OPTIONS, TEST_SPARK_CONF

SPARK_HOME = Path(pyspark.__file__).parent


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1", "SPARK_DAEMON_JAVA_OPTS": TEST_JVM_OPTIONS}
    return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_worker(ui_port: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
                if json.load(r).get("aliveworkers", 0) >= 1:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError("standalone worker did not register with the master")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("spark-standalone")
    port, ui = free_port(), free_port()
    master = _start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                     "--webui-port", str(ui)], logs / "master.log")
    worker = _start(["org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--cores", "1",
                     "--memory", "1g", "--webui-port", str(free_port()), "--work-dir", str(logs / "work")],
                    logs / "worker.log")
    try:
        _wait_for_worker(ui)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for proc in (worker, master):  # only the processes (sessions) started here
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def test_the_apply_operator_runs_unchanged_on_a_standalone_cluster(standalone, monkeypatch, pg_server, tmp_path):
    dbname, dsn = make_target(pg_server)
    stage_orders(tmp_path / "staging")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STANDALONE", json.dumps({"conn_type": "spark", "host": standalone}))
    target_connection(monkeypatch, pg_server, dbname)
    op = PgLogicalApplyOperator(task_id="apply", slot="slot_a", staging_uri=str(tmp_path / "staging"),
                                target_conn_id="pg_target", conn_id="spark_standalone", python=sys.executable,
                                conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                      "spark.driver.host": "127.0.0.1", "spark.executor.memory": "512m",
                                      "spark.cores.max": "1", **TEST_SPARK_CONF,
                                      "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS})
    op.execute(context={})
    assert rows(dsn, "SELECT id, amount::text FROM orders") == [(2, "20.00")]
    assert rows(dsn, "SELECT end_lsn::text FROM pglogical_progress WHERE slot = 'slot_a'") == [("0/200",)]
