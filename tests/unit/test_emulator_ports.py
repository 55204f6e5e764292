"""The object-store emulators' start (``tests/support/objstores.py``): a port another process took first is not
mistaken for the emulator's."""

from __future__ import annotations

import socket
import sys
import urllib.request

from scripts.harness.ports import free_port
from tests.support.objstores import _emulator


def test_an_emulator_whose_port_another_process_answers_on_starts_on_another_port():
    with socket.socket() as taken:  # the winner of a race for one free port: it answers, but is not the emulator
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        first = taken.getsockname()[1]
        server = lambda port: [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]  # noqa: E731
        with _emulator(server, "http.server", grace=0, ports=iter([first, free_port()])) as port:
            assert port != first
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as response:
                assert response.status == 200
