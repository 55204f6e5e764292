"""Spark settings of the JVMs the suite starts itself (its session, the crash tests' children, the CLI's specs).

A test's JVM lives seconds to minutes and runs small batches, where the JIT's optimising tier (C2) and the
parallel collector cost more CPU than they save: C1-compiled code and the serial collector started and ran a
small Spark job with about a third less CPU (24.7 → 16.0 CPU-seconds). Nothing a test checks depends on
either; the product's own defaults stay what the example DAGs and the demo run.
"""

from __future__ import annotations

from typing import Any

TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# For a spec's ``spark.conf``: what the suite's `pglogical` runs start their JVM with.
TEST_SPARK_CONF = {"spark.driver.extraJavaOptions": TEST_JVM_OPTIONS}


def local_session(app_name: str) -> Any:
    """A local[2] SparkSession configured like the package's own local sessions (its interpreter for Python
    workers, driver on loopback), UTC, no UI, four shuffle partitions, the test JVM options."""
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.sparkenv import LOCAL_DRIVER_CONF, use_package_python

    use_package_python()
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
    )
    for key, value in LOCAL_DRIVER_CONF.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
