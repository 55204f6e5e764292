"""Example: a scheduled pipeline (decode the slot, apply to the warehouse) built from dags/specs/example_pipeline.yaml."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow_provider_pglogical.operators.slot_health import log_slot_alert
from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag

SPEC = Path(__file__).parent / "specs" / "example_pipeline.yaml"


def alert_on_slot_risk(context: Any) -> None:
    """Called when the slot-health or WAL-retention check fails: the slot is at risk of (or past) invalidation.

    Replace the body with your pager, e-mail or chat call; ``context["exception"]`` is the typed error whose
    message names the slot, its figures and the way out (docs/operations.md#alerting-before-the-slot-is-lost).
    """
    log_slot_alert(context)


dag = build_pipeline_dag(
    SPEC,
    dag_id="pglogical_example_pipeline",
    schedule=timedelta(minutes=15),
    start_date=datetime(2026, 1, 1),
    # The factory's defaults, spelled out: one reader per slot, no backlog of empty intervals.
    max_active_runs=1,
    catchup=False,
    alert_callback=alert_on_slot_risk,
)
