"""The Airflow environment of the commands a user types (``airflow db migrate``, ``airflow dags test``, the
services): the one place the suite and the benchmarks build it.

:func:`airflow_vars` is what such a user exports: AIRFLOW_HOME, the DAGs folder, no example DAGs and the Spark
connection the pipeline DAGs' apply tasks submit to (``local[2]``). :func:`migrate` gives a home on SQLite (Airflow's
default) its metadata database: ``airflow db migrate`` runs once per Airflow installation into a template kept in
a private folder of the user's in the temp directory, and every home gets a copy of it (milliseconds instead of the
migration's seconds), each home still its own database.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Mapping
from contextlib import closing
from importlib.metadata import version
from pathlib import Path

from scripts.harness.userenv import VENV_BIN, run_as_user, venv_script

SPARK_DEFAULT = json.dumps({"conn_type": "spark", "host": "local[2]"})
DB_FILE = "airflow.db"  # the default sql_alchemy_conn's SQLite file in AIRFLOW_HOME


def airflow_vars(home: Path, dags_folder: Path | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables an Airflow user exports for a command on ``home`` (``dags_folder``: the DAGs folder, default
    Airflow's ``home/dags``), plus ``extra`` (connections, a staging root, ...)."""
    return {"AIRFLOW_HOME": str(home),
            **({"AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder)} if dags_folder is not None else {}),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW_CONN_SPARK_DEFAULT": SPARK_DEFAULT,
            **(extra or {})}


def migrate(env: Mapping[str, str], *, user_home: Path, timeout: float = 900, cache: Path | None = None) -> None:
    """The SQLite metadata database of ``env``'s AIRFLOW_HOME, as ``airflow db migrate`` leaves it: a copy of the
    template database of this venv's Airflow (migrated on first use, in ``cache``, default :func:`cache_dir`).
    Raises RuntimeError naming the command's last output when the migration fails.

    The template is migrated with Airflow's defaults, not ``env``'s ``AIRFLOW__*`` settings: its key names only the
    venv and the Airflow version, so what it holds must not depend on which caller migrated it first."""
    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template(cache or cache_dir(), user_home, timeout), home / DB_FILE)


def cache_dir() -> Path:
    """The templates' folder: in the shared temp directory, so named per user, created private (0o700), and refused
    (RuntimeError) when another user owns it or others may write to it (a planted template would be every home's
    database)."""
    return private_dir(Path(tempfile.gettempdir()) / f"pglogical-airflow-db-{os.getuid()}")


def private_dir(path: Path) -> Path:
    """``path`` as a folder only this user can write to, created so when absent (RuntimeError otherwise)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    status = path.lstat()
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid() or status.st_mode & 0o022:
        raise RuntimeError(f"{path} is not a folder of user {os.getuid()} closed to others (owner {status.st_uid}, "
                           f"mode {stat.filemode(status.st_mode)}): remove it, or set TMPDIR to a folder of your own")
    return path


def template_key() -> str:
    """The template's name: one per venv and Airflow version (another venv, another worktree's, or an upgrade
    migrates its own)."""
    return hashlib.sha256(f"{VENV_BIN.resolve()}|{version('apache-airflow-core')}".encode()).hexdigest()[:16]


def _template(cache: Path, user_home: Path, timeout: float) -> Path:
    key = template_key()
    template = cache / f"{key}.db"
    with (cache / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers: one migrates, the others wait for its template
        if not template.exists():
            for leftover in cache.glob(f"migrate-{key}-*"):  # a killed migration's (only this key's: we hold its lock)
                shutil.rmtree(leftover, ignore_errors=True)
            scratch = Path(tempfile.mkdtemp(prefix=f"migrate-{key}-", dir=cache))
            try:
                # Nothing of the caller's Airflow configuration: the defaults are what every caller gets.
                result = run_as_user([venv_script("airflow"), "db", "migrate"],
                                     {"AIRFLOW_HOME": str(scratch), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"},
                                     home=user_home, timeout=timeout)
                if result.returncode != 0:
                    raise RuntimeError(f"airflow db migrate failed: {result.stderr[-3000:]}")
                publish(scratch / DB_FILE, template)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return template


def publish(database: Path, target: Path) -> None:
    """Move the SQLite ``database`` to ``target`` whole or not at all: its write-ahead log (Airflow runs SQLite in WAL
    mode) is checkpointed into the file first, as a rename would leave the log's pages behind. Raises RuntimeError
    when a non-empty log remains (a process still reading or writing it)."""
    with closing(sqlite3.connect(database)) as connection:
        busy, pages, moved = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    wal = database.with_name(database.name + "-wal")
    if busy or (wal.exists() and wal.stat().st_size):
        raise RuntimeError(f"{database}'s write-ahead log still holds {pages} page(s) ({moved} checkpointed): "
                           "another process has the database open; not published")
    database.replace(target)  # whole or absent, never half-written
