"""Airflow sees the provider through its entry point and runs DAGs from the repo's dags/."""

import subprocess
import sys
from typing import Any

import pyspark
import pytest

from scripts.harness.userenv import venv_script
from tests.support.classarchive import ensure_archive
from tests.support.spark import TEST_JVM_OPTIONS


def test_airflow_lists_the_provider_through_its_entry_point(airflow):
    result = airflow.run("providers", "list", "--output", "json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "airflow-provider-pglogical" in result.stdout


def test_pyspark_python_files_match_the_bundled_spark_jars():
    # pyspark-client overwrites pyspark's Python files when their versions differ.
    import pathlib

    jars = pathlib.Path(pyspark.__file__).parent / "jars"
    core = [j.name for j in jars.glob("spark-core_*.jar")]
    assert core, "pyspark ships no spark-core jar"
    assert core[0].rsplit("-", 1)[1].removesuffix(".jar") == pyspark.__version__


@pytest.fixture(scope="module")
def probe(airflow, tmp_path_factory) -> dict[str, Any]:
    """One spark-submit of a probe in the Airflow environment, as the example DAGs' tasks submit (their specs carry no
    Spark settings): its driver prints its JVM's arguments, and every JVM of the command (spark-submit's launcher,
    then its driver) logs where each class came from. Both tests below read this one submit."""
    assert ensure_archive(wait=True) is not None, "no class archive written: is java or pyspark missing?"
    where = tmp_path_factory.mktemp("probe")
    script = where / "probe.py"
    script.write_text("from pyspark.sql import SparkSession\n"
                      "spark = SparkSession.builder.getOrCreate()\n"
                      "assert spark.range(3).count() == 3\n"
                      "bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()\n"
                      "print('jvm:', *bean.getInputArguments())\n"
                      "spark.stop()\n")
    logs = where / "logs"
    logs.mkdir()
    result = subprocess.run([venv_script("spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                             "--conf", "spark.driver.host=127.0.0.1", str(script)],
                            env={**airflow.env, "PYSPARK_PYTHON": sys.executable,
                                 "JAVA_TOOL_OPTIONS": f"-Xlog:class+load=info:file={logs}/load-%p.log"},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"stdout": result.stdout, "logs": logs}


def test_a_spark_submit_in_the_airflow_environment_starts_its_driver_with_the_suites_jvm_options(probe):
    """The example DAGs' specs carry no Spark settings: their tasks' spark-submit JVMs get the suite's JVM options
    from the environment's SPARK_SUBMIT_OPTS (tests/support/spark.py)."""
    [line] = [ln for ln in probe["stdout"].splitlines() if ln.startswith("jvm:")]
    # JAVA_TOOL_OPTIONS (the probe's class-load log) adds its own -Xlog option only: the suite's come from elsewhere.
    assert set(TEST_JVM_OPTIONS.split()) <= set(line.split()[1:]), line


def test_a_spark_submit_in_the_airflow_environment_maps_sparks_classes_from_the_class_archive(probe):
    """The tasks' spark-submit JVMs load Spark's classes from the suite's class archive (tests/support/classarchive.py),
    which they only can with pyspark's jars alone on their class path (no configuration directory before them)."""
    loads = [line for log in probe["logs"].glob("load-*.log") for line in log.read_text().splitlines()
             if " org.apache.spark.SparkContext " in line]
    assert loads, "no JVM loaded SparkContext"
    assert all("source: shared objects file (top)" in line for line in loads), loads
