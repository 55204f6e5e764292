"""An Airflow home on SQLite (a copy of a migrated database: scripts/harness/airflowenv.py), one per run, whose DAGs
folder is the repo's ``dags/``."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.harness.airflowenv import airflow_vars, migrate
from scripts.harness.userenv import user_env, venv_script
from tests.support.spark import submit_env

REPO_ROOT = Path(__file__).resolve().parents[2]


class AirflowCli:
    """Runs the real ``airflow`` command line against a throwaway AIRFLOW_HOME, as a user would.

    Venv not activated (``.venv/bin/airflow`` by path), nothing exported but AIRFLOW_HOME, the DAGs
    folder, ``load_examples = False``, the Spark connection the example DAGs use and ``SPARK_SUBMIT_OPTS`` giving
    the tasks' spark-submit JVMs the suite's JVM options (tests/support/spark.py; tests add
    the PostgreSQL connections and the staging root per call).
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = user_env(home / "user", airflow_vars(home, REPO_ROOT / "dags", submit_env()))
        (home / "user").mkdir(exist_ok=True)

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [venv_script("airflow"), *args], env={**self.env, **(env or {})}, cwd=self.home / "user",
            capture_output=True, text=True, timeout=timeout,
        )


@pytest.fixture(scope="session")
def airflow() -> Iterator[AirflowCli]:
    home = Path(tempfile.mkdtemp(prefix="pglogical-airflow-"))
    cli = AirflowCli(home)
    migrate(cli.env, user_home=home / "user")  # a copy of the database `airflow db migrate` leaves
    try:
        yield cli
    finally:
        shutil.rmtree(home, ignore_errors=True)
