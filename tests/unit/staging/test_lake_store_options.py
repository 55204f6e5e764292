"""The lake targets' object-store options from the credentials staging resolves: delta-rs (``object_store``)
options for GCS and Azure, and the Iceberg catalog's FileIO for a GCS or Azure warehouse (no services: the
emulator cases are ``tests/integration/test_lake_object_stores.py``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.iceberg.catalog import STORE_IO_IMPL, IcebergLocation
from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging.credentials import (
    AzureCredentials,
    GcsCredentials,
    StorageCredentials,
    azure_environment,
    gcs_environment,
)

STORE_VARIABLES = ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT", "GOOGLE_OAUTH_ACCESS_TOKEN",
                   "GOOGLE_SERVICE_ACCOUNT_KEY", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
                   "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ENDPOINT", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET",
                   "AZURE_TENANT_ID")


@pytest.fixture
def clean_env(monkeypatch):
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_azure_credentials_give_delta_rs_the_same_secret_and_azurite_path_style():
    assert AzureCredentials(account_name="devstoreaccount1", account_key="k",
                            endpoint_url="http://127.0.0.1:10000").delta_options() == {
        "azure_storage_account_name": "devstoreaccount1", "azure_storage_account_key": "k",
        "azure_storage_endpoint": "http://127.0.0.1:10000/devstoreaccount1", "allow_http": "true"}
    assert AzureCredentials(account_name="prod", sas_token="?sv=1&sig=x").delta_options() == {
        "azure_storage_account_name": "prod", "azure_storage_sas_key": "sv=1&sig=x"}
    assert AzureCredentials(account_name="prod", client_id="app", client_secret="s", tenant_id="t").delta_options() \
        == {"azure_storage_account_name": "prod", "azure_storage_client_id": "app",
            "azure_storage_client_secret": "s", "azure_storage_tenant_id": "t"}
    assert AzureCredentials(account_name="prod").delta_options() == {"azure_storage_account_name": "prod"}
    with pytest.raises(StagingError, match="Azure storage needs a storage account"):
        AzureCredentials(account_key="k").delta_options()


def test_gcs_credentials_give_delta_rs_a_key_with_the_emulators_base_url():
    emulator = json.loads(GcsCredentials(anonymous=True, endpoint_url="http://127.0.0.1:4443")
                          .delta_options()["google_service_account_key"])
    assert emulator == {"client_email": "", "private_key": "", "private_key_id": "", "disable_oauth": True,
                        "gcs_base_url": "http://127.0.0.1:4443"}
    key = json.dumps({"type": "service_account", "client_email": "sa@p.iam.gserviceaccount.com", "private_key": "pem"})
    assert GcsCredentials(service_account_key=key).delta_options() == {"google_service_account_key": json.dumps(
        json.loads(key))}
    both = GcsCredentials(service_account_key=key, endpoint_url="127.0.0.1:4443").delta_options()
    assert json.loads(both["google_service_account_key"]) == {**json.loads(key), "gcs_base_url": "http://127.0.0.1:4443"}
    assert both["allow_http"] == "true"
    assert GcsCredentials().delta_options() == {}  # object_store's own default credentials
    with pytest.raises(StagingError, match="a Delta table on gs:// takes a service account's key .* not an OAuth "
                                           "access token"):
        GcsCredentials(access_token="tok").delta_options()
    assert StorageCredentials(access_key="a", secret_key="s").delta_options() == {}  # AWS_* variables instead


def test_a_delta_location_on_gcs_or_azure_takes_its_options_from_the_environment(clean_env):
    clean_env.setenv("AZURE_STORAGE_ACCOUNT_KEY", "k")
    clean_env.setenv("AZURE_STORAGE_ENDPOINT", "http://127.0.0.1:10000")
    abfss = DeltaLocation("abfss://lake@devstoreaccount1.dfs.core.windows.net/tables", {"timeout": "120s"})
    assert abfss.options == {"azure_storage_account_name": "devstoreaccount1", "azure_storage_account_key": "k",
                             "azure_storage_endpoint": "http://127.0.0.1:10000/devstoreaccount1",
                             "allow_http": "true", "timeout": "120s"}
    clean_env.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    gcs = DeltaLocation("gs://bucket/tables").options or {}
    assert json.loads(gcs["google_service_account_key"])["gcs_base_url"] == "http://127.0.0.1:4443"
    assert DeltaLocation("/local/tables").options is None


def test_an_iceberg_warehouse_on_gcs_or_azure_goes_through_stagings_filesystems():
    for warehouse in ("gs://bucket/wh", "abfss://c@acct.dfs.core.windows.net/wh", "az://c/wh"):
        assert IcebergLocation({"type": "sql", "warehouse": warehouse}).catalog_properties()["py-io-impl"] == \
            STORE_IO_IMPL
    for warehouse in ("s3://bucket/wh", "/local/wh"):
        assert "py-io-impl" not in IcebergLocation({"type": "sql", "warehouse": warehouse}).catalog_properties()
    assert IcebergLocation({"type": "sql", "warehouse": "gs://b/wh", "py-io-impl": "mine.FileIO"}) \
        .catalog_properties()["py-io-impl"] == "mine.FileIO"


def test_the_store_fileio_opens_azure_paths_by_container_and_other_schemes_as_pyiceberg_does(clean_env):
    pytest.importorskip("pyiceberg")
    import pyarrow.fs as pafs

    from airflow_provider_pglogical.apply.targets.iceberg.fileio import StoreFileIO

    assert StoreFileIO.parse_location("abfss://c@acct.dfs.core.windows.net/wh/t/m.json") == (
        "abfss", "c@acct.dfs.core.windows.net", "c/wh/t/m.json")
    assert StoreFileIO.parse_location("gs://b/wh/x") == ("gs", "b", "b/wh/x")
    assert StoreFileIO.parse_location("s3://b/wh/x") == ("s3", "b", "b/wh/x")
    clean_env.setenv("AZURE_STORAGE_ACCOUNT_KEY", "a2V5")
    clean_env.setenv("AZURE_STORAGE_ENDPOINT", "http://127.0.0.1:10000")
    io = StoreFileIO({})
    assert isinstance(io.fs_by_scheme("abfss", "c@acct.dfs.core.windows.net"), pafs.AzureFileSystem)
    clean_env.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    assert isinstance(io.fs_by_scheme("gs", "b"), pafs.GcsFileSystem)


_text = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)


@given(account=_text, key=st.one_of(st.none(), _text), sas=st.one_of(st.none(), _text),
       endpoint=st.one_of(st.none(), st.just("http://127.0.0.1:10000")))
def test_delta_options_are_the_same_from_a_connection_and_from_the_variables_it_becomes(account, key, sas,
                                                                                        endpoint):
    """A DAG task's route (the connection's credentials set as variables) and the CLI's (variables read back) give
    delta-rs the same options."""
    creds = AzureCredentials(account_name=account, account_key=key, sas_token=sas, endpoint_url=endpoint)
    assert azure_environment(creds.environment()).delta_options() == creds.delta_options()
    gcs = GcsCredentials(service_account_key=json.dumps({"client_email": account, "private_key": key or "k"}),
                         endpoint_url=endpoint)
    assert gcs_environment(gcs.environment()).delta_options() == gcs.delta_options()
