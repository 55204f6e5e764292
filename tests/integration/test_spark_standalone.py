"""The same operator against a Spark standalone cluster on 127.0.0.1 (the suite's two-worker one,
tests/support/cluster.py)."""

from __future__ import annotations

import json
import sys

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
    target_connection(monkeypatch, pg_server, dbname)
    op = PgLogicalApplyOperator(task_id="apply", slot="slot_a", staging_uri=str(tmp_path / "staging"),
                                target_conn_id="pg_target", conn_id="spark_standalone", python=sys.executable,
                                conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                      "spark.driver.host": "127.0.0.1", "spark.executor.memory": "512m",
                                      "spark.cores.max": "1", **TEST_SPARK_CONF,
                                      "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS})
    op.execute(context={})
    assert rows(dsn, "SELECT id, amount::text FROM orders") == [(2, "20.00")]
    assert rows(dsn, "SELECT end_lsn::text FROM pglogical_progress WHERE slot = 'slot_a'") == [("0/200",)]
