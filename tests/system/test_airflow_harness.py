"""Airflow sees the provider through its entry point and runs DAGs from the repo's dags/."""

import pyspark


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
