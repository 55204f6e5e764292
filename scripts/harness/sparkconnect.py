"""A local Spark Connect server: pyspark's own ``SparkConnectServer`` (the ``spark-connect`` jar pyspark ships)
started with ``spark-submit`` on 127.0.0.1 and a free port, local executors. Shared by the tests and
``benchmarks/small_run.py --connect``."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from scripts.harness.ports import free_port, wait_for_port

VENV_BIN = Path(sys.executable).parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass(frozen=True)
class ConnectServer:
    """A Connect server started (``launch_server``), listening once ``wait`` returns."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 180) -> str:
        """Until the server listens (its Spark application started: on a cluster, its executors registered, as
        ``spark.scheduler.minRegisteredResourcesRatio`` says); its URL. The process is killed if it never does."""
        try:
            wait_for_port(self.port, self.process, "Spark Connect server", timeout)
        except RuntimeError as exc:
            stop(self.process)
            raise RuntimeError(f"{exc}: {self.log.read_text(errors='replace')[-2000:]}") from None
        except BaseException:
            stop(self.process)
            raise
        return self.url


def launch_server(env: dict[str, str], log: Path, *, master: str = "local[2]",
                  conf: dict[str, str] | None = None) -> ConnectServer:
    """``spark-submit`` of pyspark's Connect server, not waited for; its Python workers run this interpreter (and
    this package). ``master`` may be a cluster's (``spark://…``, listening already), ``conf`` the server
    application's further settings."""
    port = free_port()
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
    with log.open("wb") as out:
        process = subprocess.Popen(args, env=full, stdout=out, stderr=subprocess.STDOUT)
    return ConnectServer(process, port, log)


def start_server(env: dict[str, str], log: Path, *, master: str = "local[2]",
                 conf: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """``launch_server``, then ``wait``: the server's process and URL once it listens."""
    server = launch_server(env, log, master=master, conf=conf)
    return server.process, server.wait()


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
