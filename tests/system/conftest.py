"""An Airflow home on SQLite, migrated once per run, whose DAGs folder is the repo's ``dags/``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


class AirflowCli:
    """Runs the real ``airflow`` command line against a throwaway AIRFLOW_HOME."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "SPARK_LOCAL_IP": "127.0.0.1",
            # spark-submit and airflow must resolve from this venv.
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(VENV_BIN / "airflow"), *args],
            env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout,
        )


@pytest.fixture(scope="session")
def airflow() -> Iterator[AirflowCli]:
    home = Path(tempfile.mkdtemp(prefix="pglogical-airflow-"))
    cli = AirflowCli(home)
    result = cli.run("db", "migrate")
    assert result.returncode == 0, result.stderr[-4000:]
    try:
        yield cli
    finally:
        shutil.rmtree(home, ignore_errors=True)
