"""The interpreter and spark-submit a local Spark started by the package uses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from airflow_provider_pglogical.apply.sparkenv import package_python_env, spark_submit_env

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
