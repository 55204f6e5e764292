"""Delta and Iceberg targets on GCS and Azure: ``pglogical run`` of a lake on an emulator, equal to the source.

Each lake is reached the ways a user has: the environment's variables (``STORAGE_EMULATOR_HOST``,
``AZURE_STORAGE_*``: the CLI's route) or an Airflow connection named by ``target.conn_id`` alone (a ``wasb``
one, a ``google_cloud_platform`` one), resolved as staging's are. The staging area is local: what is on trial is
the lake. Delta goes through delta-rs (``object_store``), Iceberg's files through staging's own filesystems
(``apply/targets/iceberg/fileio.py``); both are read back here with deltalake and pyiceberg.

The test process's Azurite (``shared_azurite``) and one GCS emulator (started when a test first needs it) serve the
whole module; each test gets a container or bucket of its own, so what it finds on the store is its own.

Delta on GCS has no end-to-end case: ``object_store`` speaks GCS's XML API (``PUT``/``GET /<bucket>/<object>``,
``GET /<bucket>?list-type=2``), which gcp-storage-emulator does not serve (501). What can be tested is that its
options send delta-rs to the emulator rather than to Google (the last test), and the options themselves
(``tests/unit/staging/test_lake_store_options.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation, open_table
from scripts.harness.pgserver import execute, query
from scripts.harness.userenv import default_home, user_env
from tests.integration.test_cli import pglogical
from tests.support.cli import create_replication
from tests.support.objstores import (
    AZURITE_ACCOUNT,
    STORAGE_VARIABLES,
    AzuriteServer,
    GcsServer,
    gcs_connection,
    gcs_server,
    wasb_connection,
)
from tests.support.spark import TEST_SPARK_CONF

DDL = "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(12,2))"

STORES: dict[str, tuple[str, Callable[[Any], str]]] = {  # store → (its server, the lake's root on it)
    "azure-abfss": ("azure", lambda s: f"abfss://{s.container}@{AZURITE_ACCOUNT}.dfs.core.windows.net/lake"),
    "azure-az": ("azure", lambda s: f"az://{s.container}/lake"),
    "gcs": ("gcs", lambda s: f"gs://{s.bucket}/lake"),
}
CONNECTIONS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "azure-abfss": wasb_connection, "azure-az": wasb_connection, "gcs": gcs_connection}


@pytest.fixture(scope="module")
def stores(shared_azurite: AzuriteServer) -> Iterator[Callable[[str], Any]]:
    """``store`` → a running server of that store with a new container or bucket: the process's Azurite, and a GCS
    emulator started on its first use in this module."""
    started: dict[str, AzuriteServer | GcsServer] = {"azure": shared_azurite}
    with ExitStack() as stack:
        def fresh(store: str) -> Any:
            kind = STORES[store][0]
            if kind not in started:
                started[kind] = stack.enter_context(gcs_server())
            return started[kind].fresh()

        yield fresh


@contextmanager
def variables(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process while the lake is read back (the route the CLI's run took)."""
    with monkeypatch.context() as m:
        for name, value in env.items():
            m.setenv(name, value)
        yield


def target_section(kind: str, root: str, tmp_path: Path) -> dict[str, Any]:
    if kind == "delta":
        return {"kind": "delta", "uri": root}
    return {"kind": "iceberg", "namespace": "lake",
            "catalog": {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": root}}


def lake_rows(kind: str, target: dict[str, Any]) -> list[tuple[Any, ...]]:
    if kind == "delta":
        location = DeltaLocation(target["uri"])
        table = DeltaTable(location.table_uri("public.items"), storage_options=location.options).to_pyarrow_table()
    else:
        iceberg = IcebergLocation(dict(target["catalog"]), target["namespace"])
        loaded = open_table(iceberg.connect(), iceberg, "public.items")
        assert loaded is not None
        table = loaded.scan().to_arrow()
    return sorted((r["id"], r["name"], r["price"]) for r in table.select(["id", "name", "price"]).to_pylist())


def run_and_compare(kind: str, target: dict[str, Any], env: dict[str, str], read_env: dict[str, str],
                    pg_server, pg_dsn: str, pg_dbname: str, tmp_path: Path, monkeypatch) -> None:
    execute(pg_dsn, DDL)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": "lake_pub", "slot": "lake_slot", "create": True},
        "staging": {"uri": str(tmp_path / "staging")}, "target": target, "tables": {"public.items": {}},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)}}))
    create_replication(spec)  # what a first run would create, before the source changes
    execute(pg_dsn, "INSERT INTO items SELECT g, 'item ' || g, g * 1.25 FROM generate_series(1, 40) g; "
                    "UPDATE items SET name = 'renamed', price = NULL WHERE id <= 4; DELETE FROM items WHERE id > 30")
    second = pglogical("run", "--spec", str(spec), extra=env)
    assert second.returncode == 0, second.stderr[-3000:]
    execute(pg_dsn, "UPDATE items SET price = 9.99 WHERE id = 5; DELETE FROM items WHERE id = 6")
    third = pglogical("run", "--spec", str(spec), extra=env)
    assert third.returncode == 0, third.stderr[-3000:]
    source = [(i, n, Decimal(p) if p is not None else None) for i, n, p in
              query(pg_dsn, "SELECT id, name, price FROM items ORDER BY id")]
    with variables(monkeypatch, read_env):
        assert lake_rows(kind, target) == source and len(source) == 29
    status = pglogical("status", "--spec", str(spec), extra=env)
    assert status.returncode == 0, status.stderr[-3000:]
    report = json.loads(status.stdout)
    assert report["target"]["watermarks"]["public.items"] == report["staging"]["last_end_lsn"]


@pytest.mark.parametrize(("kind", "store"), [("delta", "azure-abfss"), ("iceberg", "gcs"), ("iceberg", "azure-abfss")])
def test_run_applies_into_a_lake_on_the_store_from_environment_variables(kind, store, stores, pg_server, pg_dsn,
                                                                         pg_dbname, tmp_path, monkeypatch):
    server = stores(store)
    target = target_section(kind, STORES[store][1](server), tmp_path)
    run_and_compare(kind, target, server.env(), server.env(), pg_server, pg_dsn, pg_dbname, tmp_path, monkeypatch)
    assert any("items" in k for k in server.keys("lake/")), server.keys("")  # the tables are on the store


@pytest.mark.parametrize(("kind", "store"), [("delta", "azure-az"), ("iceberg", "gcs"), ("iceberg", "azure-az")])
def test_run_applies_into_a_lake_on_the_store_through_the_targets_airflow_connection_alone(
        kind, store, stores, pg_server, pg_dsn, pg_dbname, tmp_path, monkeypatch):
    server = stores(store)
    target = {**target_section(kind, STORES[store][1](server), tmp_path), "conn_id": "lake_store"}
    env = {"AIRFLOW_CONN_LAKE_STORE": json.dumps(CONNECTIONS[store](server))}
    assert not any(name.startswith(STORAGE_VARIABLES) for name in user_env(default_home(), env))
    read_back = {k: v for k, v in target.items() if k != "conn_id"}
    run_and_compare(kind, target, env, server.env(), pg_server, pg_dsn, pg_dbname, tmp_path, monkeypatch)
    with variables(monkeypatch, server.env()):
        assert len(lake_rows(kind, read_back)) == 29


def test_delta_options_on_gcs_send_delta_rs_to_the_emulator_not_to_google(stores, monkeypatch):
    """gcp-storage-emulator answers object_store's XML API with 501: the error names the emulator's URL, so the
    request went there (without the options it would go to storage.googleapis.com, which this machine cannot
    reach, and to Google's OAuth endpoint first)."""
    server = stores("gcs")
    with variables(monkeypatch, {**server.env(), "GOOGLE_CLOUD_PROJECT": "p"}):
        location = DeltaLocation(f"gs://{server.bucket}/lake")
        options = dict(location.options or {}, max_retries="0")
        with pytest.raises(Exception) as raised:  # noqa: PT011 (delta-rs raises its own OSError / DeltaError)
            DeltaTable(location.table_uri("public.items"), storage_options=options)
        assert server.endpoint in str(raised.value) and "501" in str(raised.value), str(raised.value)[:2000]
