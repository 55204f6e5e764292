"""Reads of an Airflow home's SQLite metadata database (``airflow.db``) that the system tests check a DAG run by:
what ``airflow dags list-runs`` lists, and the XComs a task returned, without an Airflow process of their own."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any


def dag_runs(home: Path, dag_id: str) -> list[str]:
    """The logical dates of ``dag_id``'s runs (UTC, ISO 8601, as ``airflow dags test`` takes them), oldest first."""
    with closing(sqlite3.connect(Path(home) / "airflow.db")) as db:
        found = db.execute("SELECT logical_date FROM dag_run WHERE dag_id = ? ORDER BY logical_date",
                           (dag_id,)).fetchall()
    return [f"{value.replace(' ', 'T')}+00:00" for (value,) in found]


def task_returns(home: Path, dag_id: str, task_id: str) -> list[Any]:
    """The values ``task_id`` of ``dag_id`` returned (its ``return_value`` XComs), oldest first."""
    with closing(sqlite3.connect(Path(home) / "airflow.db")) as db:
        found = db.execute("SELECT value FROM xcom WHERE dag_id = ? AND task_id = ? AND key = 'return_value' "
                           "ORDER BY timestamp", (dag_id, task_id)).fetchall()
    values = [json.loads(v) for (v,) in found]
    return [json.loads(v) if isinstance(v, str) else v for v in values]
