"""Test DAG: the pipeline of the PostgreSQL-target spec named by PGLOGICAL_TEST_IN_WORKER_SPEC
(tests/system/test_dag_apply_in_worker.py)."""

from __future__ import annotations

import os

from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag

if os.environ.get("PGLOGICAL_TEST_IN_WORKER_SPEC"):
    dag = build_pipeline_dag(os.environ["PGLOGICAL_TEST_IN_WORKER_SPEC"], dag_id="pglogical_test_in_worker")
