"""GCS and Azure staging: ``pglogical run`` staging to an emulator and applying into PostgreSQL, equal to the source.

Each store is reached both ways a user has: the environment's variables (``STORAGE_EMULATOR_HOST``,
``AZURE_STORAGE_*``: the CLI's route) and an Airflow connection named by ``staging.conn_id`` (a
``google_cloud_platform`` connection, a ``wasb`` one; an ``adls`` one's fields are read the same way:
``tests/unit/staging/test_object_store_credentials.py``), with no storage variable at all. The decoder
writes through pyarrow's GCS / Azure filesystems and the apply reads them with a local master: this process reads
the files of a batch the direct path covers through the staging area's filesystem (``batches.readable_here``), and
Spark reads those of a batch that needs it.
The servers are real (``tests/support/objstores.py``): Azurite and gcp-storage-emulator. Nothing here runs
without the emulator's variables or connection: pyarrow would then look for the real services (Google's
metadata server, ``<account>.blob.core.windows.net``), which this machine must not reach.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from airflow_provider_pglogical.apply.targets.postgres.snapshot import RESYNC, read_failure
from airflow_provider_pglogical.lsn import parse_lsn
from airflow_provider_pglogical.pipeline.runs import decode_pending
from airflow_provider_pglogical.pipeline.spec import load_spec
from airflow_provider_pglogical.staging.layout import StagingLayout, make_dirs, move_file
from scripts.harness.pgserver import drop_database, execute, make_database, query
from scripts.harness.userenv import default_home, user_env
from tests.integration.test_cli import pglogical
from tests.support.cli import create_replication, run_ok
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


def gcs_root(server: GcsServer) -> str:
    return f"gs://{server.bucket}/staging"


def azure_root(server: AzuriteServer) -> str:
    return f"abfs://{server.container}@{AZURITE_ACCOUNT}.dfs.core.windows.net/staging"


# Each store's server (its module-scoped fixture, below), staging root and Airflow connection.
STORES: dict[str, tuple[str, Callable[[Any], str], Callable[[Any], dict[str, Any]]]] = {
    "gcs": ("gcs", gcs_root, gcs_connection),
    "azure-wasb": ("azurite", azure_root, wasb_connection),
}


# One server of each store for the module (Azurite, which takes seconds of CPU to start, is the process's:
# ``shared_azurite``, a container of the module's own): every test stages under its own slot's prefix
# (``staging/<slot>/``) and reads back only that prefix, so the tests sharing it see none of each other's objects.
@pytest.fixture(scope="module")
def gcs() -> Iterator[GcsServer]:
    with gcs_server() as server:
        yield server


@pytest.fixture(scope="module")
def azurite(shared_azurite: AzuriteServer) -> AzuriteServer:
    return shared_azurite.fresh()


@pytest.fixture
def databases(pg_server, pg_dsn) -> Iterator[str]:
    """The source (the test's database) with a table, and an empty target database with the same table."""
    target = make_database(pg_server)
    ddl = "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(12,2))"
    execute(pg_dsn, ddl)
    execute(pg_server.dsn(target), ddl)
    try:
        yield target
    finally:
        drop_database(pg_server, target)


def write_spec(path: Path, pg_server, pg_dbname: str, target: str, root: str, conn_id: str | None,
               slot: str, retention: dict[str, int] | None = None) -> str:
    staging: dict[str, Any] = {"uri": root, **({"retention": retention} if retention else {})}
    if conn_id:
        staging["conn_id"] = conn_id
    path.write_text(yaml.safe_dump({
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": f"{slot}_pub", "slot": slot, "create": True},
        "staging": staging, "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
        "tables": {"public.items": {}}, "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)}}))
    return str(path)


def run_twice_and_compare(spec: str, env: dict[str, str], pg_server, pg_dsn: str, target: str, server: Any,
                          slot: str) -> None:
    create_replication(spec)  # what a first run would create, before the source changes
    execute(pg_dsn, "INSERT INTO items SELECT g, 'item ' || g, g * 1.25 FROM generate_series(1, 40) g; "
                    "UPDATE items SET name = 'renamed', price = NULL WHERE id <= 4; DELETE FROM items WHERE id > 30")
    second = pglogical("run", "--spec", spec, extra=env)
    assert second.returncode == 0, second.stderr[-3000:]
    staged = server.keys(f"staging/{slot}/batches/")
    assert any(k.endswith("/_manifest.json") for k in staged), staged
    assert not any("/_partial" in k for k in staged), staged
    got = query(pg_server.dsn(target), "SELECT * FROM items ORDER BY id")
    assert got == query(pg_dsn, "SELECT * FROM items ORDER BY id") and len(got) == 30, (second.stdout + second.stderr)[-5000:]
    status = pglogical("status", "--spec", spec, extra=env)
    assert status.returncode == 0, status.stderr[-3000:]


@pytest.mark.parametrize("store", ["gcs", "azure-wasb"])
def test_run_stages_to_the_store_from_environment_variables_and_applies_equal_to_the_source(
        store, request, pg_server, pg_dsn, pg_dbname, databases, tmp_path):
    fixture, root, _ = STORES[store]
    server = request.getfixturevalue(fixture)
    slot = f"env_{store.replace('-', '_')}"
    spec = write_spec(tmp_path / "spec.yaml", pg_server, pg_dbname, databases, root(server), None, slot)
    run_twice_and_compare(spec, server.env(), pg_server, pg_dsn, databases, server, slot)


@pytest.mark.parametrize("store", ["gcs", "azure-wasb"])
def test_run_stages_to_the_store_through_an_airflow_connection_alone(store, request, pg_server, pg_dsn, pg_dbname,
                                                                     databases, tmp_path):
    fixture, root, connection = STORES[store]
    server = request.getfixturevalue(fixture)
    slot = f"conn_{store.replace('-', '_')}"
    spec = write_spec(tmp_path / "spec.yaml", pg_server, pg_dbname, databases, root(server), "staging_store", slot)
    env = {"AIRFLOW_CONN_STAGING_STORE": json.dumps(connection(server))}
    assert not any(name.startswith(STORAGE_VARIABLES) for name in user_env(default_home(), env))
    run_twice_and_compare(spec, env, pg_server, pg_dsn, databases, server, slot)


def test_a_connection_of_another_store_is_a_one_line_error_naming_it(pg_server, pg_dbname, tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", pg_server, pg_dbname, "unused", "gs://bucket/staging", "staging_store",
                      "wrong_slot")
    env = {"AIRFLOW_CONN_STAGING_STORE": json.dumps({"conn_type": "wasb", "login": "acct", "password": "key"})}
    result = pglogical("status", "--spec", spec, extra=env)
    assert result.returncode != 0
    assert "staging connection staging_store is a wasb connection; a gs:// root takes a google_cloud_platform " \
           "connection" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_staged_file_moves_on_an_azure_account_without_a_hierarchical_namespace(azurite, monkeypatch):
    """Azurite, like a flat Azure account, has no rename: a finished batch still reaches its final name."""
    server = azurite
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    layout = StagingLayout.from_uri(azure_root(server), "slot")
    fs = layout.fs
    src, dst = layout.partial_dir(0), layout.batch_dir(0, 1)
    pq.write_table(pa.table({"a": [1, 2]}), f"{src}/tables/x.parquet", filesystem=fs)
    layout.move_tree(src, dst, ["tables/x.parquet"])
    assert server.keys("staging/slot/batches/") == [f"{dst}/tables/x.parquet".split("/", 1)[1]]
    move_file(fs, f"{dst}/tables/x.parquet", f"{dst}/tables/y.parquet")
    assert pq.read_table(f"{dst}/tables/y.parquet", filesystem=fs).column("a").to_pylist() == [1, 2]


@pytest.mark.parametrize("store", ["gcs", "azure-wasb"])
def test_a_staged_file_gone_or_damaged_on_the_store_calls_for_a_resync(store, request):
    """The errors pyarrow's GCS and Azure filesystems raise for a file missing, deleted after it was opened (Azure:
    a plain OSError naming ``[BlobNotFound] 404``) or damaged are each read as a file that fails every rerun."""
    server = request.getfixturevalue(STORES[store][0])
    fs, root = server.filesystem(), f"{getattr(server, 'bucket', '') or server.container}/failures"
    pq.write_table(pa.table({"a": list(range(40_000))}), f"{root}/f.parquet", filesystem=fs, row_group_size=10_000)
    with fs.open_output_stream(f"{root}/damaged.parquet") as out:
        out.write(b"not a parquet file")
    opened = pq.ParquetFile(fs.open_input_file(f"{root}/f.parquet"))
    fs.delete_file(f"{root}/f.parquet")
    failures: list[BaseException] = []
    for read in (lambda: opened.read_row_group(3), lambda: pq.read_table(f"{root}/f.parquet", filesystem=fs),
                 lambda: pq.read_table(f"{root}/damaged.parquet", filesystem=fs)):
        with pytest.raises((OSError, pa.ArrowException)) as raised:
            read()
        failures.append(raised.value)
    assert [read_failure(f) for f in failures] == [RESYNC] * 3, [f"{type(f).__name__}: {f}" for f in failures]


@pytest.mark.parametrize("store", ["gcs", "azure-wasb"])
def test_a_batch_moves_to_its_final_name_on_a_store_without_directory_markers(store, request, monkeypatch):
    """GCS has no directories: ``make_dirs`` writes no marker object there, and a finished batch whose partial
    directory holds no marker still moves whole, leaving nothing under its partial name. Azure keeps pyarrow's markers
    (an account with a hierarchical namespace needs a rename's destination directory)."""
    fixture, root, _ = STORES[store]
    server = request.getfixturevalue(fixture)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    layout = StagingLayout.from_uri(root(server), f"markers_{store.replace('-', '_')}")
    src, dst = layout.partial_dir(0), layout.batch_dir(0, 1)
    make_dirs(layout.fs, f"{src}/tables")
    assert layout.exists(f"{src}/tables") is (store != "gcs")
    for name in ("tables/x.parquet", "tables/y.parquet", "transactions.parquet"):
        pq.write_table(pa.table({"a": [1, 2]}), f"{src}/{name}", filesystem=layout.fs)
    layout.move_tree(src, dst, ["tables/x.parquet", "tables/y.parquet", "transactions.parquet"])
    prefix = f"staging/{layout.slot}/batches/"
    assert sorted(k.removeprefix(prefix) for k in server.keys(prefix)) == [
        f"{dst.rsplit('/', 1)[1]}/{name}" for name in ("tables/x.parquet", "tables/y.parquet", "transactions.parquet")]
    assert not layout.exists(src) and [d for _s, _e, d in layout.list_batch_dirs()] == [dst]


def test_directories_without_markers_are_deleted_on_gcs(gcs, pg_server, pg_dsn, pg_dbname, databases, tmp_path,
                                                       monkeypatch):
    """Every directory staging deletes on GCS holds objects and no marker, which pyarrow's ``delete_dir`` raises on
    after deleting the objects: a drain's crashed partial batch, a batch retention prunes, and the whole staging area
    ``pglogical drop --staging`` removes each go without an error."""
    for name, value in gcs.env().items():
        monkeypatch.setenv(name, value)
    slot = "unmarked_gcs"
    spec = write_spec(tmp_path / "spec.yaml", pg_server, pg_dbname, databases, gcs_root(gcs), None, slot,
                      {"keep_batches": 1})
    create_replication(spec)
    (start,) = query(pg_dsn, f"SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'")[0]
    layout = StagingLayout.from_uri(gcs_root(gcs), slot)
    leftover = f"{layout.partial_dir(parse_lsn(str(start)))}/tables/x.parquet"  # a drain that died mid-batch
    pq.write_table(pa.table({"a": [1]}), leftover, filesystem=layout.fs)
    for i in (1, 2):  # two batches (drained in this process): retention keeps the newest one
        execute(pg_dsn, f"INSERT INTO items VALUES ({i}, 'n{i}', {i})")
        assert decode_pending(load_spec(spec))["changes"] == 1
    assert not any("/_partial" in k for k in gcs.keys(f"staging/{slot}/")), gcs.keys(f"staging/{slot}/")
    applied = run_ok("apply", "--spec", spec, extra=gcs.env())
    assert applied["retention"]["pruned_batches"] == 1 and len(layout.list_batch_dirs()) == 1, applied
    run_ok("drop", "--spec", spec, "--yes", "--staging", extra=gcs.env())
    assert gcs.keys(f"staging/{slot}/") == []
