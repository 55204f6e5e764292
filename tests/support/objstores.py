"""Real GCS and Azure storage servers for tests, on 127.0.0.1 and a free port, one bucket / container each.

* Azure: Azurite's blob service (npm ``azurite``, installed into ``.cache/azurite`` by ``make azurite``), with its
  well-known development account and key.
* GCS: ``gcp-storage-emulator`` (PyPI), in memory; it takes no credentials (reached anonymously, as Google's own
  clients reach an emulator named by ``STORAGE_EMULATOR_HOST``).

Both are reached by pyarrow's own filesystems (``pyarrow.fs.AzureFileSystem``, ``pyarrow.fs.GcsFileSystem``), the
ones staging uses.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from scripts.harness.ports import free_port, wait_for_port

REPO_ROOT = Path(__file__).resolve().parents[2]
AZURITE = REPO_ROOT / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's fixed development account (public, documented by Microsoft; not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
GCS_PROJECT = "pglogical-test"
# Prefixes of the variables that reach a store: a connection-only test's environment holds none of them.
STORAGE_VARIABLES = ("AWS_", "AZURE_", "GOOGLE_", "STORAGE_EMULATOR_HOST")


def _stop(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds (0: SIGKILL at once)."""
    if grace:
        process.terminate()
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            pass
    process.kill()
    process.wait()


def keys(fs: pafs.FileSystem, root: str, prefix: str) -> list[str]:
    """Every object under ``root/prefix``, relative to ``root``."""
    base = f"{root}/{prefix}".rstrip("/")
    if fs.get_file_info(base).type == pafs.FileType.NotFound:
        return []
    return [i.path[len(root) + 1:] for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
            if i.type == pafs.FileType.File]


@dataclass(frozen=True)
class AzuriteServer:
    endpoint: str  # the blob service: http://127.0.0.1:<port>
    container: str

    @property
    def account_url(self) -> str:
        return f"{self.endpoint}/{AZURITE_ACCOUNT}"

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
                "AZURE_STORAGE_ENDPOINT": self.endpoint}

    def filesystem(self) -> pafs.FileSystem:
        authority = self.endpoint.split("://", 1)[1]
        return pafs.AzureFileSystem(AZURITE_ACCOUNT, account_key=AZURITE_KEY, blob_storage_authority=authority,
                                    blob_storage_scheme="http", dfs_storage_authority=authority,
                                    dfs_storage_scheme="http")

    def keys(self, prefix: str) -> list[str]:
        return keys(self.filesystem(), self.container, prefix)

    def fresh(self) -> AzuriteServer:
        """This server with a new empty container of its own (tests sharing one server each get one)."""
        server = dataclasses.replace(self, container=f"stage{uuid.uuid4().hex[:12]}")
        server.filesystem().create_dir(server.container)
        return server


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on TCP ``port`` (Linux's ``/proc/net``; none elsewhere)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for fields in (row.split() for row in rows):
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                out.add(fields[9])
    return out


def _owns_listener(process: subprocess.Popen[bytes], port: int) -> bool | None:
    """Whether ``process`` holds the socket listening on ``port`` (None: this system cannot tell)."""
    fds = Path(f"/proc/{process.pid}/fd")
    if not fds.is_dir():
        return None
    held = set()
    for fd in fds.iterdir():
        try:
            link = os.readlink(fd)
        except OSError:  # closed since listed
            continue
        if link.startswith("socket:["):
            held.add(link[len("socket:["):-1])
    return bool(held & _listening_inodes(port))


def _start_listening(command: Callable[[int], list[str]], what: str, ports: Iterator[int],
                     timeout: float) -> tuple[subprocess.Popen[bytes], int]:
    """``command(port)`` started and listening on ``port``, the port taken from ``ports``. A free port is released
    before the service binds it, so another test process may bind it first: then the port answers for that
    process's service while ours exits with EADDRINUSE. The port counts only once our process holds its listening
    socket; otherwise the next port is tried (three in all)."""
    failures = []
    for port in itertools.islice(ports, 3):
        process = subprocess.Popen(command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port, process, what, timeout=timeout)
            deadline = time.monotonic() + timeout
            while (owned := _owns_listener(process, port)) is False and process.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            if owned is not False:
                return process, port
            failures.append(f"port {port} answered for another process ({what}: exit code {process.poll()})")
        except RuntimeError as exc:
            failures.append(str(exc))
        _stop(process, 0)
    raise RuntimeError(f"{what} did not start: " + "; ".join(failures))


@contextmanager
def _emulator(command: Callable[[int], list[str]], what: str, grace: float = 10,
              ports: Iterator[int] | None = None) -> Iterator[int]:
    """``command(port)`` running until the block ends, once it listens on the port it yields (``_start_listening``);
    stopped as ``_stop`` does."""
    process, port = _start_listening(command, what, ports or iter(free_port, None), timeout=60)
    try:
        yield port
    finally:
        _stop(process, grace)


@contextmanager
def azurite_server(workdir: Path) -> Iterator[AzuriteServer]:
    """Azurite's blob service with one empty container, its data under ``workdir`` (pytest's temporary directory
    keeps it after the test, as it keeps any). Killed at the end: on SIGTERM it waits for its clients' keep-alive
    connections to close (pyarrow's in this process keep theirs), 10 s a stop."""
    if not AZURITE.exists():
        pytest.fail("Azurite missing: run `make azurite`")
    workdir.mkdir(parents=True, exist_ok=True)
    with _emulator(lambda port: [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                                 "--location", str(workdir), "--skipApiVersionCheck", "--silent"],
                   "azurite", grace=0) as port:
        yield AzuriteServer(f"http://127.0.0.1:{port}", "").fresh()


@pytest.fixture(scope="session")
def shared_azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    """One Azurite for every module of a test process that needs one (its start costs ~3 CPU-seconds and, under
    load, ~20 s): each module or test takes a container of its own (``fresh``), so none sees another's objects."""
    with azurite_server(tmp_path_factory.mktemp("azurite")) as server:
        yield server


@dataclass(frozen=True)
class GcsServer:
    endpoint: str  # http://127.0.0.1:<port>
    bucket: str

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": GCS_PROJECT}

    def filesystem(self) -> pafs.FileSystem:
        return pafs.GcsFileSystem(anonymous=True, project_id=GCS_PROJECT, scheme="http",
                                  endpoint_override=self.endpoint.split("://", 1)[1])

    def keys(self, prefix: str) -> list[str]:
        return keys(self.filesystem(), self.bucket, prefix)

    def fresh(self) -> GcsServer:
        """This server with a new empty bucket of its own (tests sharing one server each get one)."""
        server = dataclasses.replace(self, bucket=f"stage-{uuid.uuid4().hex[:12]}")
        server.filesystem().create_dir(server.bucket)
        return server


@contextmanager
def gcs_server() -> Iterator[GcsServer]:
    """gcp-storage-emulator, in memory, with one empty bucket."""
    with _emulator(lambda port: [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                                 "--port", str(port), "--in-memory"], "gcp-storage-emulator") as port:
        yield GcsServer(f"http://127.0.0.1:{port}", "").fresh()


def gcs_connection(server: GcsServer) -> dict[str, Any]:
    """An Airflow ``google_cloud_platform`` connection (as ``AIRFLOW_CONN_*`` JSON) reaching the emulator."""
    return {"conn_type": "google_cloud_platform",
            "extra": {"is_anonymous": True, "project": GCS_PROJECT, "endpoint_url": server.endpoint}}


def wasb_connection(server: AzuriteServer) -> dict[str, Any]:
    """An Airflow ``wasb`` connection (as ``AIRFLOW_CONN_*`` JSON) with Azurite's account and key."""
    return {"conn_type": "wasb", "login": AZURITE_ACCOUNT, "password": AZURITE_KEY, "host": server.account_url}
