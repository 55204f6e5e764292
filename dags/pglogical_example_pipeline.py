"""Example: a scheduled pipeline (decode the slot, apply to the warehouse) built from dags/specs/example_pipeline.yaml."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag

SPEC = Path(__file__).parent / "specs" / "example_pipeline.yaml"

dag = build_pipeline_dag(
    SPEC,
    dag_id="pglogical_example_pipeline",
    schedule=timedelta(minutes=15),
    start_date=datetime(2026, 1, 1),
    # The factory's defaults, spelled out: one reader per slot, no backlog of empty intervals.
    max_active_runs=1,
    catchup=False,
)
