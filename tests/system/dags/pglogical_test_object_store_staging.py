"""Test DAG: the pipeline of the spec named by PGLOGICAL_TEST_SPEC (tests/system/test_object_store_staging.py)."""

from __future__ import annotations

import os

from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag

if os.environ.get("PGLOGICAL_TEST_SPEC"):
    dag = build_pipeline_dag(os.environ["PGLOGICAL_TEST_SPEC"], dag_id="pglogical_test_object_store_staging")
