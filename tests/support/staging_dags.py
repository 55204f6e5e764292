"""A pipeline DAG run by ``airflow dags test`` whose object store is reached only through an Airflow connection:
the source and target connections, the store's connection, the spec, and a run after a workload compared with the
source (the system tests of S3, GCS and Azure staging, and of a lake target on a store)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

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


def create_replication(spec: Path, source_dsn: str) -> None:
    """What a first run of the spec's DAG does on the source (``source.create``): the publication and the slot,
    created here by the same code (``ensure_replication``) on ``source_dsn`` instead of the DAG's connection."""
    from airflow_provider_pglogical.pipeline.source import ensure_replication, source_client
    from airflow_provider_pglogical.pipeline.spec import parse_spec

    doc = yaml.safe_load(spec.read_text())
    source = {**{k: v for k, v in doc["source"].items() if k != "conn_id"}, "dsn": source_dsn}
    parsed = parse_spec({**doc, "source": source}, origin=str(spec), env={})
    client = source_client(parsed)
    try:
        ensure_replication(parsed, client)
    finally:
        client.close()


def run_dag_after_workload(airflow: Any, dag_id: str, env: dict[str, str], source_dsn: str, spec: Path) -> str:
    """``items``, the spec's publication and slot (as the DAG's first run would leave them), the workload on
    ``items``, then one DAG run that stages and applies all of it; that run's output.

    One ``airflow dags test``, not two: a first run on the empty slot would only create what
    :func:`create_replication` creates (the example DAGs' tests run ``source.create`` through a DAG)."""
    execute(source_dsn, ITEMS)
    create_replication(spec, source_dsn)
    execute(source_dsn, WORKLOAD)
    result = airflow.run("dags", "test", dag_id, env=env, timeout=1200)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "state=success" in output, output[-6000:]
    return output


def source_items(source_dsn: str) -> list[tuple[Any, ...]]:
    """The source's ``items`` as the target must end: 45 rows after the workload."""
    got = rows(source_dsn, "SELECT * FROM items ORDER BY id")
    assert len(got) == 45
    return got
