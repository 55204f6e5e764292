"""Example: tear the example pipeline down (its slot, publication and bookkeeping), triggered by hand with
``confirm`` set to the slot's name."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow_provider_pglogical.pipeline.dag_factory import build_teardown_dag

SPEC = Path(__file__).parent / "specs" / "example_pipeline.yaml"

dag = build_teardown_dag(SPEC, dag_id="pglogical_example_teardown", start_date=datetime(2026, 1, 1))
