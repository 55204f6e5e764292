"""Test DAG: the pipeline of the several-targets spec named by PGLOGICAL_TEST_TARGETS_SPEC
(tests/system/test_targets_dag.py)."""

from __future__ import annotations

import os

from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag

if os.environ.get("PGLOGICAL_TEST_TARGETS_SPEC"):
    dag = build_pipeline_dag(os.environ["PGLOGICAL_TEST_TARGETS_SPEC"], dag_id="pglogical_test_targets")
