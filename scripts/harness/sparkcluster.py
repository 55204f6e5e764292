"""A Spark standalone cluster on 127.0.0.1: one master and N workers, each its own JVM (``spark-class``) with its
own working directory, started in sessions of their own so that a worker and the executors it launched can be
killed together. Shared by the tests (``tests/support/cluster.py``) and ``benchmarks/cluster.py``.

A worker's environment is what its executors inherit: its Python (this venv's ``bin`` first on PATH, and
``PYSPARK_PYTHON``) and whatever credentials the cluster's hosts hold (``env``), none of which the driver needs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from scripts.harness.ports import free_port, wait_for_port

SPARK_HOME = Path(pyspark.__file__).parent
VENV_BIN = Path(sys.executable).parent
# JVM options of the cluster's daemons and executors: C1 only and the serial collector (tests/support/spark.py
# says why: short-lived JVMs running small jobs).
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
RUNNING_TASK = re.compile(r"Running task (\d+)\.(\d+) in stage (\d+)\.(\d+)")
FINISHED_TASK = re.compile(r"Finished task (\d+)\.(\d+) in stage (\d+)\.(\d+)")


def _daemon(args: list[str], log: Path, env: dict[str, str], jvm_options: str) -> subprocess.Popen[bytes]:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SPARK_", "PYSPARK_"))},
            "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1", "SPARK_DAEMON_JAVA_OPTS": jvm_options,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", **env}
    with log.open("wb") as out:
        return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=full, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


@dataclass
class Worker:
    work_dir: Path
    process: subprocess.Popen[bytes]

    def _logs(self, app_id: str) -> str:
        return "".join(log.read_text(errors="replace") for log in (self.work_dir / app_id).glob("*/stderr"))

    def task_attempts(self, app_id: str) -> list[tuple[int, int]]:
        """(task index, attempt) of every task the app's executors on this worker started (their log lines)."""
        return [(int(m[1]), int(m[2])) for m in RUNNING_TASK.finditer(self._logs(app_id))]

    def running_tasks(self, app_id: str) -> int:
        """Tasks of the app that an executor on this worker started and has not finished."""
        logs = self._logs(app_id)
        started = {m.group(0).split(" ", 2)[2] for m in RUNNING_TASK.finditer(logs)}
        finished = {m.group(0).split(" ", 2)[2] for m in FINISHED_TASK.finditer(logs)}
        return len(started - finished)

    def kill(self) -> None:
        """SIGKILL the worker JVM and everything it started (executors, their Python workers): a host lost."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@dataclass
class StandaloneCluster:
    master_url: str  # spark://127.0.0.1:port
    ui_port: int  # the master's web UI (its /json/ status)
    master: subprocess.Popen[bytes]
    workers: list[Worker] = field(default_factory=list)

    def apps(self) -> set[str]:
        """The ids of every application that ran an executor on a worker of this cluster."""
        return {path.name for worker in self.workers for path in worker.work_dir.glob("app-*")}

    def alive_workers(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return int(json.load(r).get("aliveworkers", 0))

    def wait_for_workers(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.alive_workers() >= count:
                    return
            except (OSError, ValueError):  # not listening yet, or its UI still serving the page it starts with
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{count} standalone workers did not register with {self.master_url} in {timeout} s")

    def stop(self) -> None:
        for proc in [w.process for w in self.workers] + [self.master]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in [w.process for w in self.workers] + [self.master]:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def start_cluster(root: Path, *, workers: int = 2, cores: int = 2, memory: str = "1200m",
                  env: dict[str, str] | None = None, wait: bool = True,
                  jvm_options: str = JVM_OPTIONS) -> StandaloneCluster:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) under ``root`` (logs, work dirs), every
    worker with ``env`` in its environment, the master's and workers' JVMs with ``jvm_options``; returns once all workers have registered, or with ``wait`` false as
    soon as the master listens and the workers are started (``wait_for_workers``: an application may be started
    meanwhile, its executors come as the workers register).

    The workers start once the master listens: a worker that finds no master retries only seconds later (and an
    application's driver 20 s later)."""
    root.mkdir(parents=True, exist_ok=True)
    port, ui = free_port(), free_port()
    master = _daemon(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                      "--webui-port", str(ui)], root / "master.log", {}, jvm_options)
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", ui, master)
    try:
        wait_for_port(port, master, "the Spark master")
        for i in range(1, workers + 1):
            work = root / f"worker{i}"
            work.mkdir(parents=True, exist_ok=True)
            process = _daemon(["org.apache.spark.deploy.worker.Worker", cluster.master_url, "--host", "127.0.0.1",
                               "--cores", str(cores), "--memory", memory, "--webui-port", str(free_port()),
                               "--work-dir", str(work)], root / f"worker{i}.log", env or {}, jvm_options)
            cluster.workers.append(Worker(work, process))
        if wait:
            cluster.wait_for_workers(workers)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def app_conf(executors: int = 2, executor_memory: str = "512m") -> dict[str, str]:
    """What an application needs on this cluster: ``executors`` 1-core executors (the master spreads them over the
    workers), all registered before the first job; the driver on loopback, the executors' JVM options. The executors' Python is
    the workers' (``python3`` on their PATH: this venv's), as the driver names no other (no ``PYSPARK_PYTHON``)."""
    return {"spark.executor.cores": "1", "spark.cores.max": str(executors), "spark.executor.memory": executor_memory,
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.extraJavaOptions": JVM_OPTIONS}
