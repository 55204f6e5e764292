"""Test DAG: the pipeline of the Delta-target spec named by PGLOGICAL_TEST_LAKE_SUBMIT_SPEC, whose Spark is reached by
spark-submit (``spark.conn_id``; tests/system/test_lake_submit_dag.py)."""

from __future__ import annotations

import os

from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag

if os.environ.get("PGLOGICAL_TEST_LAKE_SUBMIT_SPEC"):
    dag = build_pipeline_dag(os.environ["PGLOGICAL_TEST_LAKE_SUBMIT_SPEC"], dag_id="pglogical_test_lake_submit")
