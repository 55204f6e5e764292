"""The interpreter and spark-submit a local Spark started by the package uses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from airflow_provider_pglogical.apply.sparkenv import (
    check_pyspark_install,
    jars_version,
    package_python_env,
    pyspark_mismatch,
    spark_submit_env,
)

VENV_BIN = str(Path(sys.executable).parent)


def test_without_pyspark_variables_workers_and_driver_run_this_interpreter():
    assert package_python_env({}) == {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def test_a_users_pyspark_python_wins_and_the_driver_follows_it():
    assert package_python_env({"PYSPARK_PYTHON": "/opt/py"}) == {"PYSPARK_PYTHON": "/opt/py",
                                                                   "PYSPARK_DRIVER_PYTHON": "/opt/py"}
    assert package_python_env({"PYSPARK_PYTHON": "/opt/py", "PYSPARK_DRIVER_PYTHON": "/d/py"})[
        "PYSPARK_DRIVER_PYTHON"] == "/d/py"
    assert package_python_env({"PYSPARK_PYTHON": "/opt/py"}, python="/op/py")["PYSPARK_PYTHON"] == "/op/py"


def test_spark_submit_comes_from_the_package_interpreter_only_when_path_has_none():
    bare = spark_submit_env("local[2]", environ={"PATH": "/usr/bin:/bin"})
    assert bare["PATH"] == f"/usr/bin:/bin{os.pathsep}{VENV_BIN}"  # after the user's entries
    assert bare["PYSPARK_PYTHON"] == sys.executable
    assert "PATH" not in spark_submit_env("local[2]", environ={"PATH": VENV_BIN})


def test_a_cluster_master_gets_no_local_interpreter():
    env = spark_submit_env("spark://host:7077", environ={"PATH": VENV_BIN})
    assert env == {}


def fake_pyspark(root: Path, jar: str | None) -> Path:
    """A pip-installed pyspark's layout: ``pyspark/jars/spark-core_<scala>-<version>.jar`` (or no jars: the client)."""
    package = root / "pyspark"
    (package / "jars").mkdir(parents=True)
    if jar:
        (package / "jars" / jar).write_bytes(b"")
        (package / "jars" / "spark-sql_2.13-9.9.9.jar").write_bytes(b"")
    return package


def test_pyspark_files_of_another_version_than_its_jars_are_refused_with_the_reinstall_that_repairs_them(tmp_path):
    package = fake_pyspark(tmp_path, "spark-core_2.13-4.3.0.jar")
    assert pyspark_mismatch("4.2.0", package) == (
        "pyspark's Python files are 4.2.0 but its jars are 4.3.0 (pyspark-client 4.2.0 overwrote them): "
        "pip install --force-reinstall --no-deps pyspark==4.3.0")
    assert pyspark_mismatch("4.3.0", package) is None


def test_pyspark_without_jars_is_not_judged(tmp_path):
    """pyspark-client alone (Spark Connect) or a Spark distribution's python/ folder: no jars next to the files."""
    assert jars_version(fake_pyspark(tmp_path, None)) is None
    assert pyspark_mismatch("4.2.0", fake_pyspark(tmp_path / "other", None)) is None


def test_the_installed_pyspark_is_one_spark():
    """What every venv of the tested range must hold (make venv, make venv-spark40); a session start checks it."""
    import pyspark

    assert jars_version(Path(pyspark.__file__).resolve().parent) == pyspark.__version__
    check_pyspark_install()
