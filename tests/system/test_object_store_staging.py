"""GCS and Azure staging roots reached through Airflow connections alone in a real ``airflow dags test``.

The servers are real emulators on 127.0.0.1 (``tests/support/objstores.py``: gcp-storage-emulator, Azurite). The
Airflow process has no storage variable at all: the decode task reaches the store only through the connection
named by ``staging.conn_id`` (``google_cloud_platform``, ``wasb``), and the apply's spark-submit process, whose
executors read the staged files themselves, only through the variables the apply operator gives it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scripts.harness.pgserver import drop_database, execute, make_database
from scripts.harness.pgserver import query as rows
from tests.integration.test_object_store_staging import STORAGE_VARIABLES, STORES

TEST_DAGS = Path(__file__).parent / "dags"
DAG_ID = "pglogical_test_object_store_staging"


@pytest.mark.parametrize("store", ["gcs", "azure-wasb"])
def test_a_pipeline_dag_stages_to_the_store_and_applies_from_it_with_only_an_airflow_connection(
        store, pg_server, airflow, tmp_path):
    start, root, connection = STORES[store]
    src, dw = make_database(pg_server), make_database(pg_server)
    slot = f"dag_{store.replace('-', '_')}"
    try:
        with start(tmp_path) as server:
            spec = tmp_path / "spec.yaml"
            spec.write_text(yaml.safe_dump({
                "source": {"conn_id": "pgl_source", "publication": f"{slot}_pub", "slot": slot, "create": True},
                "staging": {"uri": root(server), "conn_id": "staging_store"},
                "target": {"kind": "postgres", "conn_id": "pgl_target"},
                "tables": {"public.items": {}}}))
            env = {"AIRFLOW_CONN_PGL_SOURCE": pg_server.uri(src), "AIRFLOW_CONN_PGL_TARGET": pg_server.uri(dw),
                   "AIRFLOW_CONN_STAGING_STORE": json.dumps(connection(server)),
                   "PGLOGICAL_TEST_SPEC": str(spec), "AIRFLOW__CORE__DAGS_FOLDER": str(TEST_DAGS)}
            assert not any(k.startswith(STORAGE_VARIABLES) for k in {**airflow.env, **env})
            execute(pg_server.dsn(src), "CREATE TABLE items (id int PRIMARY KEY, name text)")
            execute(pg_server.dsn(dw), "CREATE TABLE items (id int PRIMARY KEY, name text)")
            first = airflow.run("dags", "test", DAG_ID, env=env, timeout=1200)  # publication and slot
            assert first.returncode == 0 and "state=success" in first.stdout + first.stderr, \
                (first.stdout + first.stderr)[-6000:]
            execute(pg_server.dsn(src), "INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 50) g; "
                                        "UPDATE items SET name = 'renamed' WHERE id <= 5; DELETE FROM items WHERE id > 45")
            second = airflow.run("dags", "test", DAG_ID, env=env, timeout=1200)
            output = second.stdout + second.stderr
            assert second.returncode == 0 and "state=success" in output, output[-6000:]
            staged = server.keys(f"staging/{slot}/batches/")
            assert any(k.endswith("/_manifest.json") for k in staged), staged
            assert rows(pg_server.dsn(dw), "SELECT * FROM items ORDER BY id") == \
                rows(pg_server.dsn(src), "SELECT * FROM items ORDER BY id")
            assert len(rows(pg_server.dsn(dw), "SELECT * FROM items")) == 45
    finally:
        drop_database(pg_server, dw)
        drop_database(pg_server, src)
