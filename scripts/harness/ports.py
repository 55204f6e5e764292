"""Ports on 127.0.0.1 for the services the harness starts: a free one to give a service, and the wait until the
service listens on it."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    """A port no one listens on now (released again before the caller's service binds it: a parallel process may
    take it first, which that service's start then reports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
    """Until something listens on 127.0.0.1:``port`` (polled every 50 ms); RuntimeError naming ``what`` if
    ``process`` exits first or nothing listens within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout:.0f} s")
