"""Example: rebuild the example pipeline's target tables from the staged log up to a chosen LSN or time."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow_provider_pglogical.pipeline.dag_factory import build_replay_dag

SPEC = Path(__file__).parent / "specs" / "example_pipeline.yaml"

dag = build_replay_dag(SPEC, dag_id="pglogical_example_replay", start_date=datetime(2026, 1, 1))
