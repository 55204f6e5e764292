"""A throwaway PostgreSQL server (the tests, the benchmarks, the demo): initdb into a temp dir, wal_level=logical;
fresh databases on it, dropped with their slots.

initdb and pg_ctl refuse to run as root, so when the suite runs as root the data directory is
handed to the ``postgres`` OS user and the binaries run through ``runuser``.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.harness.ports import free_port

DEFAULT_BIN_DIR = "/usr/lib/postgresql/15/bin"
SERVER_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "64",
    "max_wal_senders": "64",
    "max_logical_replication_workers": "32",
    "max_worker_processes": "48",
    "max_connections": "200",
    "fsync": "off",
    # synchronous_commit stays on: the SQL decoding functions stop at the WAL *flush* position.
    "full_page_writes": "off",
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "logical_decoding_work_mem": "64kB",
    "wal_sender_timeout": "0",
    "log_min_messages": "warning",
}


@dataclass
class PgServer:
    bin_dir: Path
    data_dir: Path
    port: int
    host: str = "127.0.0.1"
    superuser: str = "postgres"
    version_num: int = 0

    def dsn(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        parts = [f"host={self.host}", f"port={self.port}", f"dbname={dbname}", f"user={user or self.superuser}"]
        if password:
            parts.append(f"password={password}")
        return " ".join(parts)

    def uri(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        auth = user or self.superuser
        if password:
            auth += f":{password}"
        return f"postgresql://{auth}@{self.host}:{self.port}/{dbname}"


def _as_owner(cmd: list[str], owner: str | None) -> list[str]:
    return ["runuser", "-u", owner, "--", *cmd] if owner else cmd


def _runnable_by(owner: str | None, bin_dir: Path) -> Path:
    """Return a bin dir ``owner`` can execute: a checkout under /root is not traversable by the
    postgres user, so an installation there (the npm PostgreSQL 17) is copied to /tmp once."""
    if owner is None:
        return bin_dir
    probe = subprocess.run(_as_owner(["test", "-x", str(bin_dir / "initdb")], owner), capture_output=True)
    if probe.returncode == 0:
        return bin_dir
    install_root = bin_dir.parent
    copy = Path(tempfile.gettempdir()) / f"pglogical-pgbin-{hashlib.sha1(str(install_root).encode()).hexdigest()[:12]}"
    if not (copy / "bin" / "initdb").exists():
        # Copied aside and renamed into place: parallel test workers (pytest -n) may race here.
        scratch = copy.with_name(f"{copy.name}.{os.getpid()}")
        shutil.copytree(install_root, scratch, symlinks=True, dirs_exist_ok=True)
        scratch.chmod(0o755)
        try:
            scratch.rename(copy)
        except OSError:  # another worker got there first (or a stale partial copy exists)
            shutil.rmtree(scratch, ignore_errors=True)
            if not (copy / "bin" / "initdb").exists():
                shutil.rmtree(copy, ignore_errors=True)
                return _runnable_by(owner, bin_dir)
    return copy / bin_dir.name


def start_server(bin_dir: str | os.PathLike[str] | None = None, settings: dict[str, str] | None = None) -> PgServer:
    """initdb + start; the caller must call ``stop_server`` (use the pytest fixtures)."""
    bin_dir = Path(bin_dir or os.environ.get("PGLOGICAL_TEST_PG_BIN", DEFAULT_BIN_DIR))
    if not (bin_dir / "initdb").exists():
        raise RuntimeError(f"no initdb in {bin_dir}; run `make test` (installs postgresql-15) or set PGLOGICAL_TEST_PG_BIN")
    owner = "postgres" if os.geteuid() == 0 else None
    bin_dir = _runnable_by(owner, bin_dir)
    base = Path(tempfile.mkdtemp(prefix="pglogical-test-"))
    data_dir = base / "data"
    if owner:
        pw = pwd.getpwnam(owner)
        os.chown(base, pw.pw_uid, pw.pw_gid)
    subprocess.run(
        _as_owner([str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "postgres", "-A", "trust",
                   "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"], owner),
        check=True, capture_output=True,
    )
    with open(data_dir / "pg_hba.conf", "w") as f:
        f.write("host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n")
    with open(data_dir / "postgresql.auto.conf", "a") as f:
        for key, value in {**SERVER_SETTINGS, **(settings or {})}.items():
            f.write(f"{key} = {value}\n")
    for attempt in range(3):
        # free_port() releases the port before the server binds it: a parallel test worker can
        # take it in between, so a failed start is retried on another port (the last line wins).
        port = free_port()
        with open(data_dir / "postgresql.auto.conf", "a") as f:
            f.write(f"port = {port}\n")
        started = subprocess.run(
            _as_owner([str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-l", str(base / "server.log"), "-w", "-t", "60", "start"], owner),
            capture_output=True,
        )
        if started.returncode == 0:
            break
        if attempt == 2:
            raise RuntimeError(f"PostgreSQL did not start in {data_dir}: {started.stderr.decode(errors='replace')}")
    server = PgServer(bin_dir=bin_dir, data_dir=data_dir, port=port)
    import psycopg2

    with psycopg2.connect(server.dsn()) as conn, conn.cursor() as cur:
        cur.execute("SHOW server_version_num")
        (version,) = cur.fetchone() or ("0",)
        server.version_num = int(version)
    conn.close()
    return server


def stop_server(server: PgServer) -> None:
    owner = "postgres" if os.geteuid() == 0 else None
    subprocess.run(
        _as_owner([str(server.bin_dir / "pg_ctl"), "-D", str(server.data_dir), "-m", "immediate", "-w", "stop"], owner),
        capture_output=True,
    )
    shutil.rmtree(server.data_dir.parent, ignore_errors=True)


def crash_and_restart(server: PgServer) -> None:
    """Stop the server as a crash would (``-m immediate``: no shutdown checkpoint), then start it again; what was
    not yet on disk comes back as recovery finds it."""
    owner = "postgres" if os.geteuid() == 0 else None
    for mode in (["-m", "immediate", "-w", "stop"], ["-l", str(server.data_dir.parent / "server.log"), "-w", "-t",
                                                      "60", "start"]):
        subprocess.run(_as_owner([str(server.bin_dir / "pg_ctl"), "-D", str(server.data_dir), *mode], owner),
                       check=True, capture_output=True)


def execute(dsn: str, *statements: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> None:
    """Run each statement on an autocommit connection (so CREATE/DROP DATABASE work too)."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement, params or None)
    finally:
        conn.close()


def query(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """All rows of one query, on an autocommit connection."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params or None)
            return cur.fetchall()
    finally:
        conn.close()


def make_database(server: PgServer) -> str:
    """A fresh database on ``server`` (a random name); ``drop_database`` removes it."""
    dbname = f"t_{uuid.uuid4().hex[:12]}"
    execute(server.dsn(), f'CREATE DATABASE "{dbname}"')
    return dbname


def drop_database(server: PgServer, dbname: str) -> None:
    """Drop ``dbname`` with its inactive slots (an active one would keep WAL and a backend alive)."""
    execute(server.dsn(),
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %(db)s AND NOT active",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %(db)s AND pid <> pg_backend_pid()",
            f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)', params={"db": dbname})


APPLIER = "pglogical_applier"


def make_target(server: PgServer) -> tuple[str, str]:
    """(dbname, DSN as the non-superuser applier) of a fresh database the applier owns: an apply target."""
    dbname = make_database(server)
    import psycopg2

    admin = psycopg2.connect(server.dsn())
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APPLIER,))
            if cur.fetchone() is None:
                cur.execute(f"CREATE ROLE {APPLIER} LOGIN NOSUPERUSER")
            cur.execute(f'ALTER DATABASE "{dbname}" OWNER TO {APPLIER}')
    finally:
        admin.close()
    return dbname, server.dsn(dbname, user=APPLIER)
