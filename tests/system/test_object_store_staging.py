"""GCS and Azure object stores reached through Airflow connections alone in a real ``airflow dags test``.

The servers are real emulators on 127.0.0.1 (``tests/support/objstores.py``: gcp-storage-emulator, Azurite). The
Airflow process has no storage variable at all: the decode task reaches the store only through the connection
named by ``staging.conn_id`` (``google_cloud_platform``, ``wasb``), and the apply's spark-submit process, whose
executors read the staged files themselves, only through the variables the apply operator gives it. A lake
target (Delta on Azure) reaches its tables only through ``target.conn_id``, in the worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from scripts.harness.pgserver import drop_database, execute, make_database
from scripts.harness.pgserver import query as rows
from tests.integration.test_object_store_staging import STORES
from tests.support.objstores import (
    AZURITE_ACCOUNT,
    STORAGE_VARIABLES,
    gcs_server,
    wasb_connection,
)
from tests.support.staging_dags import ITEMS, dag_env, run_dag_after_workload, source_items

TEST_DAGS = Path(__file__).parent / "dags"
DAG_ID = "pglogical_test_object_store_staging"


@pytest.fixture
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The parametrized store's server: gcp-storage-emulator of its own, or a container of its own (``fresh``) on
    the test process's Azurite (``shared_azurite``: its start costs seconds of CPU)."""
    if STORES[request.param][0] == "azurite":
        yield request.getfixturevalue("shared_azurite").fresh()
    else:
        with gcs_server() as server:
            yield server


@pytest.mark.parametrize("store", ["gcs", "azure-wasb"], indirect=True)
def test_a_pipeline_dag_stages_to_the_store_and_applies_from_it_with_only_an_airflow_connection(
        request, store, pg_server, airflow, tmp_path):
    name = request.node.callspec.params["store"]
    _, root, connection = STORES[name]
    src, dw = make_database(pg_server), make_database(pg_server)
    slot = f"dag_{name.replace('-', '_')}"
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump({
            "source": {"conn_id": "pgl_source", "publication": f"{slot}_pub", "slot": slot, "create": True},
            "staging": {"uri": root(store), "conn_id": "staging_store"},
            "target": {"kind": "postgres", "conn_id": "pgl_target"},
            "tables": {"public.items": {}}}))
        env = dag_env(pg_server, src, dw, spec, "staging_store", connection(store), TEST_DAGS)
        assert not any(k.startswith(STORAGE_VARIABLES) for k in {**airflow.env, **env})
        execute(pg_server.dsn(dw), ITEMS)
        run_dag_after_workload(airflow, DAG_ID, env, pg_server.dsn(src), spec)
        staged = store.keys(f"staging/{slot}/batches/")
        assert any(k.endswith("/_manifest.json") for k in staged), staged
        assert rows(pg_server.dsn(dw), "SELECT * FROM items ORDER BY id") == source_items(pg_server.dsn(src))
    finally:
        drop_database(pg_server, dw)
        drop_database(pg_server, src)


def test_a_pipeline_dag_applies_into_delta_on_azure_with_only_the_targets_airflow_connection(
        shared_azurite, pg_server, airflow, tmp_path, monkeypatch):
    src = make_database(pg_server)
    try:
        server = shared_azurite.fresh()
        lake = f"abfss://{server.container}@{AZURITE_ACCOUNT}.dfs.core.windows.net/lake"
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump({
            "source": {"conn_id": "pgl_source", "publication": "lake_pub", "slot": "dag_lake", "create": True},
            "staging": {"uri": str(tmp_path / "staging")},
            "target": {"kind": "delta", "uri": lake, "conn_id": "lake_store"},
            "tables": {"public.items": {}}}))
        env = dag_env(pg_server, src, None, spec, "lake_store", wasb_connection(server), TEST_DAGS)
        assert not any(k.startswith(STORAGE_VARIABLES) for k in {**airflow.env, **env})
        output = run_dag_after_workload(airflow, DAG_ID, env, pg_server.dsn(src), spec)
        assert wasb_connection(server)["password"] not in output
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        location = DeltaLocation(lake)
        table = DeltaTable(location.table_uri("public.items"), storage_options=location.options)
        got = sorted((r["id"], r["name"]) for r in table.to_pyarrow_table().select(["id", "name"]).to_pylist())
        assert got == source_items(pg_server.dsn(src))
    finally:
        drop_database(pg_server, src)
