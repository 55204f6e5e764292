"""Airflow sees the provider through its entry point and runs DAGs from the repo's dags/."""

import subprocess
import sys

import pyspark

from scripts.harness.userenv import venv_script
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


def test_a_spark_submit_in_the_airflow_environment_starts_its_driver_with_the_suites_jvm_options(airflow, tmp_path):
    """The example DAGs' specs carry no Spark settings: their tasks' spark-submit JVMs get the suite's JVM options
    from the Spark configuration directory the environment names (tests/support/spark.py)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from pyspark.sql import SparkSession\n"
                     "spark = SparkSession.builder.getOrCreate()\n"
                     "bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()\n"
                     "print('jvm:', *bean.getInputArguments())\n"
                     "spark.stop()\n")
    result = subprocess.run([venv_script("spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                             "--conf", "spark.driver.host=127.0.0.1", str(probe)],
                            env={**airflow.env, "PYSPARK_PYTHON": sys.executable}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = [ln for ln in result.stdout.splitlines() if ln.startswith("jvm:")]
    assert set(TEST_JVM_OPTIONS.split()) <= set(line.split()[1:]), line
