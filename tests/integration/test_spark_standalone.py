"""The same operator against a Spark standalone cluster on 127.0.0.1 (the suite's two-worker one,
tests/support/cluster.py): every batch through spark-submit to the cluster's master (``apply_in_worker=False``),
its Spark transforms forced (``PGLOGICAL_APPLY_DIRECT=0``: the small batch would otherwise be applied without a
Spark job), so the application's tasks run on the cluster's executors."""

from __future__ import annotations

import json
import sys

from airflow_provider_pglogical.apply.direct import ENV_SWITCH
from airflow_provider_pglogical.operators.apply import PgLogicalApplyOperator
from scripts.harness.pgserver import make_target
from scripts.harness.pgserver import query as rows
from tests.integration.test_apply_operator import stage_orders, target_connection
from tests.support.cluster import spark_cluster  # noqa: F401 (fixture)
from tests.support.spark import TEST_JVM_OPTIONS, TEST_SPARK_CONF


def test_the_apply_operator_runs_unchanged_on_a_standalone_cluster(
        spark_cluster, monkeypatch, pg_server, tmp_path):  # noqa: F811 (the fixture imported above)
    dbname, dsn = make_target(pg_server)
    stage_orders(tmp_path / "staging")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STANDALONE",
                       json.dumps({"conn_type": "spark", "host": spark_cluster.spark.master_url}))
    monkeypatch.setenv(ENV_SWITCH, "0")  # inherited by spark-submit's driver
    # spark-submit finds pyspark through the driver's Python (the venv is not on the test's PATH; a cluster master
    # gets no interpreter from the package, as the workers' own serves the executors)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    target_connection(monkeypatch, pg_server, dbname)
    apps_before = spark_cluster.spark.apps()
    op = PgLogicalApplyOperator(task_id="apply", slot="slot_a", staging_uri=str(tmp_path / "staging"),
                                target_conn_id="pg_target", conn_id="spark_standalone", python=sys.executable,
                                apply_in_worker=False,
                                conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                      "spark.driver.host": "127.0.0.1", "spark.executor.memory": "512m",
                                      "spark.cores.max": "1", **TEST_SPARK_CONF,
                                      "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS})
    op.execute(context={})
    assert rows(dsn, "SELECT id, amount::text FROM orders") == [(2, "20.00")]
    assert rows(dsn, "SELECT end_lsn::text FROM pglogical_progress WHERE slot = 'slot_a'") == [("0/200",)]
    # The application ran on the cluster: its executor ran tasks there.
    (app,) = spark_cluster.spark.apps() - apps_before
    assert sum(len(w.task_attempts(app)) for w in spark_cluster.spark.workers) > 0
