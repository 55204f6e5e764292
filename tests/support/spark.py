"""Spark settings of the JVMs the suite starts itself (its session, the crash tests' children, the CLI's specs, the
Airflow tasks' spark-submit).

A test's JVM lives seconds to minutes and runs small batches, where the JIT's optimising tier (C2) and the
parallel collector cost more CPU than they save: C1-compiled code and the serial collector started and ran a
small Spark job with about a third less CPU (24.7 → 16.0 CPU-seconds). Most of what is left of a short JVM's
CPU is loading and verifying Spark's classes, the same ones every time: a class-data-sharing archive of them
(tests/support/classarchive.py, built once per machine) maps them ready-made and halves it again (a local
session and a small job: 9.5 → 5.8 CPU-seconds). Nothing a test checks depends on any of these; the product's own
defaults stay what the demo (`make demo`, tests/system/test_demo.py) runs.
"""

from __future__ import annotations

from typing import Any

from tests.support.classarchive import BASE_JVM_OPTIONS, archive_jvm_options

TEST_JVM_OPTIONS = f"{BASE_JVM_OPTIONS} {archive_jvm_options()}"
# For a spec's ``spark.conf``: what the suite's `pglogical` runs start their JVM with.
TEST_SPARK_CONF = {"spark.driver.extraJavaOptions": TEST_JVM_OPTIONS}


# PySpark's DataFrame debugging records each Column and DataFrame call's Python call site in the JVM, for the query
# context of an error: Py4J round trips (the active session, a setting, the origin) on every call, 30,000 calls of
# it in test_transform_paths.py's 20 examples, whose CPU went 69.9 and 71.9 → 65.0 and 67.1 CPU-seconds without
# it, each way twice, alternating: the CPU of the pytest process and of the JVM it starts (reproduced by
# ``perf stat -e task-clock -- .venv/bin/pytest -q tests/unit/apply/test_transform_paths.py``, which counts both).
# Nothing the suite checks reads that context: an error's first line, which the package shows, is the same.
# PySpark reads the switch once per process, so it is set on the session's builder.
PYTHON_SIDE_CONF = {"spark.python.sql.dataFrameDebugging.enabled": "false"}


def submit_env() -> dict[str, str]:
    """Environment giving the JVMs spark-submit starts the suite's JVM options (``SPARK_SUBMIT_OPTS``).

    For the JVMs an Airflow task starts with spark-submit from a spec the suite does not write (the example DAGs'):
    spark-submit adds the variable to its driver's options as it would a user's own, before the spec's or the
    command line's ``spark.driver.extraJavaOptions`` (so those still win). Unlike a ``SPARK_CONF_DIR`` (which
    spark-submit puts first on the driver's class path), it keeps the class path as the class archive wants it.
    """
    return {"SPARK_SUBMIT_OPTS": TEST_JVM_OPTIONS}


def local_session(app_name: str) -> Any:
    """A local[2] SparkSession configured like the package's own local sessions (its interpreter for Python
    workers, driver on loopback, ``SESSION_CONF``), no UI, four shuffle partitions, the test JVM options."""
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.sparkenv import LOCAL_DRIVER_CONF, SESSION_CONF, use_package_python

    use_package_python()
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config(map=PYTHON_SIDE_CONF)
        .config(map={**SESSION_CONF})
        .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
    )
    for key, value in LOCAL_DRIVER_CONF.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
