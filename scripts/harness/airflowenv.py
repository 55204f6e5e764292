"""The Airflow environment of the commands a user types (``airflow db migrate``, ``airflow dags test``, the
services): the one place the suite and the benchmarks build it.

:func:`airflow_vars` is what such a user exports: AIRFLOW_HOME, the DAGs folder, no example DAGs and the Spark
connection the pipeline DAGs' apply tasks submit to (``local[2]``). :func:`migrate` gives a home on SQLite (Airflow's
default) its metadata database: ``airflow db migrate`` runs once per Airflow installation into a template kept in
the temp directory, and every home gets a copy of it (milliseconds instead of the migration's seconds), each home
still its own database.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tempfile
from collections.abc import Mapping
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


def migrate(env: Mapping[str, str], *, user_home: Path, timeout: float = 900) -> None:
    """The SQLite metadata database of ``env``'s AIRFLOW_HOME, as ``airflow db migrate`` leaves it: a copy of the
    template database of this venv's Airflow (migrated on first use). Raises RuntimeError naming the command's
    last output when the migration fails."""
    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template(env, user_home, timeout), home / DB_FILE)


def _template(env: Mapping[str, str], user_home: Path, timeout: float) -> Path:
    # One template per venv and Airflow version: another venv (another worktree) or an upgrade migrates its own.
    key = hashlib.sha256(f"{VENV_BIN.resolve()}|{version('apache-airflow-core')}".encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / "pglogical-airflow-db"
    cache.mkdir(exist_ok=True)
    template = cache / f"{key}.db"
    with (cache / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers: one migrates, the others wait for its template
        if not template.exists():
            scratch = Path(tempfile.mkdtemp(prefix="migrate-", dir=cache))
            try:
                result = run_as_user([venv_script("airflow"), "db", "migrate"], {**env, "AIRFLOW_HOME": str(scratch)},
                                     home=user_home, timeout=timeout)
                if result.returncode != 0:
                    raise RuntimeError(f"airflow db migrate failed: {result.stderr[-3000:]}")
                (scratch / DB_FILE).replace(template)  # whole or absent, never half-written
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return template
