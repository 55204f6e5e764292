"""A local Spark Connect server: pyspark's own ``SparkConnectServer`` (the ``spark-connect`` jar pyspark ships)
started with ``spark-submit`` on 127.0.0.1 and a free port, local executors. Shared by the tests and
``benchmarks/small_run.py --connect``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Spark Connect server exited with {process.returncode}: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"Spark Connect server did not listen on {port} within {timeout} s")


def start_server(env: dict[str, str], log: Path, *, master: str = "local[2]",
                 conf: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """``spark-submit`` of pyspark's Connect server; its Python workers run this interpreter (and this package).
    ``master`` may be a cluster's (``spark://…``), ``conf`` the server application's further settings."""
    port = _free_port()
    args = [str(VENV_BIN / "spark-submit"), "--class", SERVER_CLASS, "--name", "pglogical-test-connect",
            "--master", master,
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
            "--conf", "spark.sql.session.timeZone=UTC",
            *[arg for key, value in (conf or {}).items() for arg in ("--conf", f"{key}={value}")], "spark-internal"]
    full = {**{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SPARK_CONNECT", "SPARK_REMOTE"))},
            "PYSPARK_PYTHON": sys.executable, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", **env}
    out = log.open("wb")
    process = subprocess.Popen(args, env=full, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, process, log)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, f"sc://127.0.0.1:{port}"


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
