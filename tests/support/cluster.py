"""A two-worker Spark standalone cluster on 127.0.0.1 with staging on S3 only, once per test module.

The workers (and so their executors) hold the S3 key ``EXECUTOR_KEY`` in their environment; the driver (the
``pglogical`` process, or the Connect server's driver) is given ``DRIVER_KEY`` or nothing, and the S3 server's
request log says who read which object (``S3Requests``). No staging path exists on any disk: a worker can only
reach staged data through S3.

The S3 server sees every request first (``ExecutorReadGate``): a test can hold the executors' reads of row-change
files until it has done something to the cluster (killed a worker while its task waits).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scripts.harness.sparkcluster import StandaloneCluster, app_conf, start_cluster
from scripts.harness.sparkconnect import start_server, stop
from tests.support.s3server import S3Server, s3_server
from tests.support.sparkconnect import EXECUTOR_KEY, S3Requests, s3_env


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
        """A spec's ``spark.conf`` for this cluster (no S3 settings: the executors have their own)."""
        return app_conf(executors=len(self.spark.workers))


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[Cluster]:
    """A master and two workers (2 cores, 1.2 GB each; an application gets one 1-core executor on each), and an
    S3 server whose request log this module's tests read."""
    from moto.moto_api import recorder

    root = Path(tempfile.mkdtemp(prefix="pglogical-cluster-"))
    recording = root / "s3-requests.jsonl"
    previous = recorder._location
    recorder._location = str(recording)  # process-wide: given back to whoever had it (tests/support/sparkconnect.py)
    gates: list[ExecutorReadGate] = []

    def gated(app: Any) -> ExecutorReadGate:
        gates.append(ExecutorReadGate(app))
        return gates[0]

    try:
        with s3_server(wrap=gated) as s3:
            spark = start_cluster(root, env=s3_env(s3, EXECUTOR_KEY))
            try:
                yield Cluster(spark, s3, S3Requests(s3, recording), gates[0])
            finally:
                gates[0].open()
                spark.stop()
    finally:
        recorder._location = previous
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_connect(spark_cluster: Cluster) -> Iterator[str]:
    """A Spark Connect server whose application runs on the cluster (its driver holds no S3 credentials); its URL."""
    log = Path(tempfile.mkdtemp(prefix="pglogical-cluster-connect-")) / "server.log"
    process, url = start_server({}, log, master=spark_cluster.spark.master_url, conf=spark_cluster.conf())
    try:
        yield url
    finally:
        stop(process)
        shutil.rmtree(log.parent, ignore_errors=True)
