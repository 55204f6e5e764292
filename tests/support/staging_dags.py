"""A pipeline DAG run by ``airflow dags test`` whose object store is reached only through an Airflow connection:
the source and target connections, the store's connection, the spec, and two runs compared with the source
(the system tests of S3, GCS and Azure staging, and of a lake target on a store)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scripts.harness.pgserver import execute
from scripts.harness.pgserver import query as rows

ITEMS = "CREATE TABLE items (id int PRIMARY KEY, name text)"
WORKLOAD = ("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 50) g; "
            "UPDATE items SET name = 'renamed' WHERE id <= 5; DELETE FROM items WHERE id > 45")


def dag_env(pg_server: Any, source_db: str, target_db: str | None, spec: Path, store_conn_id: str,
            connection: dict[str, Any], dags_folder: Path) -> dict[str, str]:
    """The variables of the ``airflow dags test`` process: connections ``pgl_source``, ``pgl_target`` (a
    PostgreSQL target) and ``store_conn_id``, the spec the test DAG reads, the DAGs folder."""
    env = {"AIRFLOW_CONN_PGL_SOURCE": pg_server.uri(source_db),
           f"AIRFLOW_CONN_{store_conn_id.upper()}": json.dumps(connection),
           "PGLOGICAL_TEST_SPEC": str(spec), "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder)}
    if target_db is not None:
        env["AIRFLOW_CONN_PGL_TARGET"] = pg_server.uri(target_db)
    return env


def run_dag_twice(airflow: Any, dag_id: str, env: dict[str, str], source_dsn: str) -> str:
    """The DAG once (publication and slot), the workload on ``items``, the DAG again; the second run's output."""
    execute(source_dsn, ITEMS)
    first = airflow.run("dags", "test", dag_id, env=env, timeout=1200)
    assert first.returncode == 0 and "state=success" in first.stdout + first.stderr, \
        (first.stdout + first.stderr)[-6000:]
    execute(source_dsn, WORKLOAD)
    second = airflow.run("dags", "test", dag_id, env=env, timeout=1200)
    output = second.stdout + second.stderr
    assert second.returncode == 0 and "state=success" in output, output[-6000:]
    return output


def source_items(source_dsn: str) -> list[tuple[Any, ...]]:
    """The source's ``items`` as the target must end: 45 rows after the workload."""
    got = rows(source_dsn, "SELECT * FROM items ORDER BY id")
    assert len(got) == 45
    return got
