"""Benchmark: requests a staged batch's files cost on GCS and Azure — each file written after ``make_dirs`` of its
directory, as the staging writer does, then the batch moved out of its ``_partial-`` directory (``move_tree``).

The stores are the tests' emulators, started here on 127.0.0.1 (gcp-storage-emulator from PyPI, in memory; Azurite's
blob service from ``.cache/azurite``, ``make azurite``), reached through a proxy in this process that counts each HTTP request by method. Each variant runs in a child
process of its own: this checkout, and with ``--code DIR`` DIR's package (``PYTHONPATH=DIR``, e.g. ``git worktree
add /tmp/base main``) alternately, each on a slot of its own, side by side.

Usage: python benchmarks/staging_requests.py [--tables 4] [--repeat 2] [--code DIR]
Prints one JSON object: per store and variant, the requests of each repeat (total and by method).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if "--child" not in sys.argv:  # a child imports the package of the tree its PYTHONPATH names first
    sys.path.insert(0, str(ROOT))

REQUEST_LINE = re.compile(rb"(GET|PUT|POST|DELETE|HEAD|PATCH) \S+ HTTP/1\.1\r\n")
AZURITE = ROOT / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's fixed development account (public, documented by Microsoft; not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class CountingProxy:
    """A TCP proxy to ``upstream`` on 127.0.0.1 counting the HTTP request lines its clients send."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.server.accept()
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if count:
                    with self.lock:
                        self.counts.update(m.group(1).decode() for m in REQUEST_LINE.finditer(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def take(self) -> dict[str, int]:
        with self.lock:
            out = dict(self.counts)
            self.counts.clear()
        return out


def child(store: str, port: int, bucket: str, slot: str, tables: int) -> None:
    """The staging writer's sequence for one batch, through the package on ``sys.path``."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from airflow_provider_pglogical.staging.layout import StagingLayout, make_dirs, table_file

    if store == "gcs":
        fs: pafs.FileSystem = pafs.GcsFileSystem(anonymous=True, project_id="bench", scheme="http",
                                                 endpoint_override=f"127.0.0.1:{port}")
    else:
        fs = pafs.AzureFileSystem(AZURITE_ACCOUNT, account_key=AZURITE_KEY, blob_storage_authority=f"127.0.0.1:{port}",
                                  blob_storage_scheme="http", dfs_storage_authority=f"127.0.0.1:{port}",
                                  dfs_storage_scheme="http")
    layout = StagingLayout(fs, f"{bucket}/staging", slot)
    src, dst = layout.partial_dir(0), layout.batch_dir(0, 1)
    names = [table_file("public", f"t{i}", 1) for i in range(tables)]
    names += ["transactions.parquet", "messages.parquet", "relations.parquet"]
    for name in names:
        make_dirs(fs, f"{src}/{name}".rsplit("/", 1)[0])
        pq.write_table(pa.table({"a": [1, 2, 3]}), f"{src}/{name}", filesystem=fs)
    layout.move_tree(src, dst, names)


@contextmanager
def emulator(command: list[str], port: int, what: str) -> Iterator[None]:
    """``command`` running until the block ends, once it listens on ``port``."""
    from scripts.harness.ports import wait_for_port

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process, what)
        yield
    finally:
        process.kill()
        process.wait()


@contextmanager
def stores() -> Iterator[dict[str, tuple[int, str]]]:
    """Each store's emulator port and an empty bucket / container (both created here)."""
    import tempfile

    import pyarrow.fs as pafs

    from scripts.harness.ports import free_port

    gcs, azure = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp, \
            emulator([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(gcs),
                      "--in-memory"], gcs, "gcp-storage-emulator"), \
            emulator([str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(azure), "--location", tmp,
                      "--skipApiVersionCheck", "--silent"], azure, "azurite"):
        pafs.GcsFileSystem(anonymous=True, project_id="bench", scheme="http",
                           endpoint_override=f"127.0.0.1:{gcs}").create_dir("bench")
        pafs.AzureFileSystem(AZURITE_ACCOUNT, account_key=AZURITE_KEY, blob_storage_authority=f"127.0.0.1:{azure}",
                             blob_storage_scheme="http", dfs_storage_authority=f"127.0.0.1:{azure}",
                             dfs_storage_scheme="http").create_dir("bench")
        yield {"gcs": (gcs, "bench"), "azure": (azure, "bench")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--code", help="another tree whose package runs alternately with this one")
    parser.add_argument("--child", nargs=4, metavar=("STORE", "PORT", "BUCKET", "SLOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        store, port, bucket, slot = args.child
        child(store, int(port), bucket, slot, args.tables)
        return
    variants = {"this": str(ROOT), **({"code": str(Path(args.code).resolve())} if args.code else {})}
    out: dict[str, Any] = {"tables": args.tables, "runs": {}}
    with stores() as found:
        for store, (port, bucket) in found.items():
            proxy = CountingProxy(port)
            for i in range(args.repeat):
                for name, tree in variants.items():
                    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}"}
                    proxy.take()
                    subprocess.run([sys.executable, __file__, "--tables", str(args.tables), "--child", store,
                                    str(proxy.port), bucket, f"{name}_{i}"], env=env, check=True)
                    counts = proxy.take()
                    out["runs"].setdefault(store, {}).setdefault(name, []).append(
                        {"requests": sum(counts.values()), **dict(sorted(counts.items()))})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
