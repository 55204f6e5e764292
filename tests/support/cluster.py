"""A two-worker Spark standalone cluster on 127.0.0.1 with staging on S3 only, and a Spark Connect server whose
application runs on it: one of each per test process, shared by the modules of tests/conftest.py's
``SPARK_CLUSTER_MODULES``.

The workers (and so their executors) hold the S3 key ``EXECUTOR_KEY`` in their environment; the driver (the
``pglogical`` process, or the Connect server's driver) is given ``DRIVER_KEY`` or nothing, and the S3 server's
request log says who read which object (``S3Requests``). No staging path exists on any disk: a worker can only
reach staged data through S3.

The S3 server sees every request first (``ExecutorReadGate``): a test can hold the executors' reads of row-change
files until it has done something to the cluster (killed a worker while its task waits).

Starting the cluster and the Connect server costs JVMs (a master, two workers, the server's driver and its two
executors), so they start on first use (the workers and the Connect server together, once the master listens) and
stay up for every test of those modules: tests/conftest.py hands the
modules to one xdist worker together, back to back, holds this process's ``SharedCluster`` (its session fixture
``shared_cluster``) and stops the servers after the last of those modules. A test that kills a worker leaves a cluster whose Connect application has moved its
executor onto the other worker: the next test to ask for the cluster gets a new one.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scripts.harness.sparkcluster import StandaloneCluster, app_conf, start_cluster
from scripts.harness.sparkconnect import ConnectServer, launch_server, stop
from tests.support.s3server import S3Server, s3_server
from tests.support.spark import TEST_JVM_OPTIONS
from tests.support.sparkconnect import EXECUTOR_KEY, S3Requests, SparkConnect, s3_env

# Each worker holds the Connect application's executor and a run's (512 MB, app_conf's) side by side, never two of
# the Connect application's (Cluster.connect_conf).
WORKER_MEMORY = "1300m"
CONNECT_EXECUTOR_MEMORY = "700m"


class ExecutorReadGate:
    """WSGI middleware in front of the S3 server: while closed, GETs of row-change files (``/tables/``) signed with
    ``EXECUTOR_KEY`` wait until it opens; ``waiting`` counts them."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self.waiting = 0

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if (not self._open.is_set() and environ.get("REQUEST_METHOD") == "GET"
                and "/tables/" in environ.get("PATH_INFO", "")
                and f"Credential={EXECUTOR_KEY}/" in environ.get("HTTP_AUTHORIZATION", "")):
            with self._lock:
                self.waiting += 1
            self._open.wait(timeout=300)
        return self.app(environ, start_response)


@dataclass(frozen=True)
class Cluster:
    spark: StandaloneCluster
    s3: S3Server
    requests: S3Requests
    gate: ExecutorReadGate

    def conf(self) -> dict[str, str]:
        """A spec's ``spark.conf`` for this cluster (no S3 settings: the executors have their own); its driver and
        executors with the suite's JVM options (tests/support/spark.py), no UI and four shuffle partitions (what
        ``pglogical run`` and the Connect server set themselves; a spark-submit of the spec app would otherwise
        start a web UI and plan 200)."""
        return {**app_conf(executors=len(self.spark.workers)), "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
                "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS, "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "4"}

    def connect_conf(self) -> dict[str, str]:
        """The Connect server application's: ``conf`` with executors of more than half a worker's memory, so that
        each worker holds one of them (and one of a run's next to it) even when the application registers while a
        worker is still starting (the master would otherwise give both executors to the first worker)."""
        return {**self.conf(), "spark.executor.memory": CONNECT_EXECUTOR_MEMORY}


class SharedCluster:
    """This process's cluster (with its S3 server) and the Connect server on it, each started on first use."""

    def __init__(self) -> None:
        self._stack: ExitStack | None = None
        self._cluster: Cluster | None = None
        self._connect_url: str | None = None

    def cluster(self) -> Cluster:
        """The running cluster; a new one if a worker of the current one was killed."""
        self._start(connect=False)
        assert self._cluster is not None
        return self._cluster

    def connect_url(self) -> str:
        """The URL of the Connect server whose application runs on the cluster (its driver holds no S3 key)."""
        self._start(connect=True)
        assert self._connect_url is not None
        return self._connect_url

    def _start(self, *, connect: bool) -> None:
        """Start what is missing: the cluster (anew if a worker of the current one was killed), and with
        ``connect`` the Connect server on it, launched as soon as the master listens, so that its JVM starts
        while the workers start and register rather than after."""
        if self._cluster is not None and any(w.process.poll() is not None for w in self._cluster.spark.workers):
            self.close()
        if self._cluster is not None and (self._connect_url is not None or not connect):
            return
        with ExitStack() as stack:
            cluster = self._cluster or stack.enter_context(_cluster())
            server = stack.enter_context(_connect_server(cluster)) if connect else None
            if cluster is not self._cluster:
                cluster.spark.wait_for_workers(len(cluster.spark.workers))
            url = server.wait() if server is not None else None
            if self._stack is None:
                self._stack = stack.pop_all()
            else:  # the Connect server stops before the cluster it runs on
                self._stack.enter_context(stack.pop_all())
        self._cluster, self._connect_url = cluster, url or self._connect_url

    def close(self) -> None:
        """Stop the Connect server, the cluster and the S3 server (the next use starts them again)."""
        stack, self._stack, self._cluster, self._connect_url = self._stack, None, None, None
        if stack is not None:
            stack.close()


@contextmanager
def _cluster() -> Iterator[Cluster]:
    """A master and two workers (2 cores, 1.3 GB each; an application gets one 1-core executor on each), and an
    S3 server whose request log the tests read; yielded once the master listens and the workers are started (they
    register meanwhile: ``wait_for_workers``)."""
    from moto.moto_api import recorder

    root = Path(tempfile.mkdtemp(prefix="pglogical-cluster-"))
    recording = root / "s3-requests.jsonl"
    previous = recorder._location
    recorder._location = str(recording)  # process-wide (moto's recorder writes where this says): given back
    gates: list[ExecutorReadGate] = []

    def gated(app: Any) -> ExecutorReadGate:
        gates.append(ExecutorReadGate(app))
        return gates[0]

    try:
        with s3_server(wrap=gated) as s3:
            # The daemons map Spark's classes from the suite's class archive too (their class path is the one it
            # was written with): a master's or worker's start then loads and verifies fewer of them.
            spark = start_cluster(root, env=s3_env(s3, EXECUTOR_KEY), memory=WORKER_MEMORY, wait=False,
                                  jvm_options=TEST_JVM_OPTIONS)
            try:
                yield Cluster(spark, s3, S3Requests(s3, recording), gates[0])
            finally:
                gates[0].open()
                spark.stop()
    finally:
        recorder._location = previous
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def _connect_server(cluster: Cluster) -> Iterator[ConnectServer]:
    """A Spark Connect server whose application runs on ``cluster``, launched (``ConnectServer.wait``: its URL once
    it listens)."""
    log = Path(tempfile.mkdtemp(prefix="pglogical-cluster-connect-")) / "server.log"
    server = launch_server({}, log, master=cluster.spark.master_url, conf=cluster.connect_conf())
    try:
        yield server
    finally:
        stop(server.process)
        shutil.rmtree(log.parent, ignore_errors=True)


@pytest.fixture
def spark_cluster(shared_cluster: SharedCluster) -> Cluster:
    """The cluster and its S3 server."""
    return shared_cluster.cluster()


@pytest.fixture
def cluster_connect(shared_cluster: SharedCluster) -> str:
    """The URL of a Spark Connect server whose application runs on the cluster (its driver holds no S3 key)."""
    return shared_cluster.connect_url()


@pytest.fixture
def spark_connect(shared_cluster: SharedCluster) -> SparkConnect:
    """The Connect server on the cluster and the cluster's S3 server: the server's executors hold
    ``EXECUTOR_KEY`` for S3, the client is given ``DRIVER_KEY``."""
    url = shared_cluster.connect_url()
    cluster = shared_cluster.cluster()
    return SparkConnect(url, cluster.s3, cluster.requests)
