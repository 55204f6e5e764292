"""The harness is real: a pgoutput slot on the suite's server returns binary-mode changes; a service's port is
waited for until it listens."""

import socket
import subprocess
import sys

import pytest

from scripts.harness.ports import free_port, wait_for_port


def test_pgoutput_slot_returns_begin_relation_insert_commit_rows(pg_conn):
    cur = pg_conn.cursor()
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    cur.execute("CREATE PUBLICATION p FOR TABLE t")
    cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    cur.execute("INSERT INTO t VALUES (1, 'x')")
    cur.execute(
        "SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL,"
        " 'proto_version', '1', 'publication_names', 'p', 'binary', 'true')"
    )
    kinds = [bytes(row[2][:1]).decode() for row in cur.fetchall()]
    assert kinds == ["B", "R", "I", "C"]


def test_a_service_port_is_waited_for_until_it_listens_or_its_process_exits():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", "import socket, time; s = socket.socket(); "
                               f"s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)"])
    try:
        wait_for_port(port, server, "the listener", timeout=60)
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        server.kill()
        server.wait()
    quitter = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match=f"the quitter exited with 3 before listening on {port}"):
        wait_for_port(port, quitter, "the quitter", timeout=60)
