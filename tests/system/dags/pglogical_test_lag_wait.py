"""Test DAG: a deferrable SlotLagSensor on the slot named by PGLOGICAL_TEST_SLOT (tests/system only)."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_pglogical.sensors.slot_lag import SlotLagSensor

# 1 MiB, not 0: WAL is cluster-wide, and any other writer on the suite's server (checkpoints, other
# tests' databases) would keep a zero-byte bound from ever being met after the slot caught up.
MAX_LAG_BYTES = 1 << 20

with DAG(dag_id="pglogical_test_lag_wait", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    SlotLagSensor(task_id="wait_for_lag", slot=os.environ.get("PGLOGICAL_TEST_SLOT", "test_slot"),
                  max_lag_bytes=MAX_LAG_BYTES, postgres_conn_id="pglogical_source", deferrable=True, poke_interval=1,
                  timeout=300)
