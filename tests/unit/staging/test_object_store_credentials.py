"""GCS and Azure staging credentials: from Airflow connections, from the environment, and handed on to helper
processes and Spark executors as variables (no services: the filesystems are built, not used)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pyarrow.fs as pafs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.executor_reads import storage_env
from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.hooks.storage_connection import connection_credentials, staging_connection
from airflow_provider_pglogical.staging.credentials import (
    AzureCredentials,
    GcsCredentials,
    azure_environment,
    gcs_environment,
    object_path,
    process_environment,
    use_credentials,
)
from airflow_provider_pglogical.staging.layout import resolve_filesystem

AZURITE_URL = "http://127.0.0.1:10000/devstoreaccount1"


def connection(monkeypatch, conn_id: str, **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


@pytest.mark.parametrize(("uri", "path"), [
    ("s3://bucket/staging/", "bucket/staging"),
    ("gs://bucket/staging/slot", "bucket/staging/slot"),
    ("az://container/staging", "container/staging"),
    ("abfs://container@acct.dfs.core.windows.net/staging", "container/staging"),
    ("abfss://container@acct.dfs.core.windows.net/", "container"),
])
def test_an_object_store_uri_becomes_the_path_pyarrow_opens(uri, path):
    assert object_path(uri) == path


def test_a_wasb_connection_gives_the_account_its_key_and_an_emulators_endpoint(monkeypatch):
    connection(monkeypatch, "blob", conn_type="wasb", login="devstoreaccount1", password="the-key", host=AZURITE_URL)
    creds = connection_credentials("az://staging/root", "blob")
    assert creds == AzureCredentials(account_name="devstoreaccount1", account_key="the-key",
                                     endpoint_url="http://127.0.0.1:10000")
    assert "the-key" not in repr(creds)


def test_a_connection_string_and_a_service_principal_are_read_as_the_azure_provider_reads_them(monkeypatch):
    connection(monkeypatch, "lake", conn_type="adls", extra={"connection_string": (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a+b/c==;BlobEndpoint={AZURITE_URL};")})
    assert connection_credentials("abfs://c@devstoreaccount1.dfs.core.windows.net/x", "lake") == AzureCredentials(
        account_name="devstoreaccount1", account_key="a+b/c==", endpoint_url="http://127.0.0.1:10000")
    connection(monkeypatch, "sp", conn_type="adls", host="prodacct", login="app-id", password="app-secret",
               extra={"tenant_id": "tenant"})
    assert connection_credentials("az://c/x", "sp") == AzureCredentials(
        account_name="prodacct", client_id="app-id", client_secret="app-secret", tenant_id="tenant")
    connection(monkeypatch, "sas", conn_type="wasb", host="https://prodacct.blob.core.windows.net",
               extra={"sas_token": "?sv=2024&sig=x"})
    sas = connection_credentials("az://c/x", "sas")
    assert sas == AzureCredentials(account_name="prodacct", sas_token="?sv=2024&sig=x")
    assert isinstance(sas.filesystem(), pafs.AzureFileSystem)  # the token without its leading "?"


def test_an_anonymous_google_connection_reaches_an_emulator_without_the_google_provider(monkeypatch):
    connection(monkeypatch, "gcs", conn_type="google_cloud_platform",
               extra={"is_anonymous": True, "project": "p1", "endpoint_url": "http://127.0.0.1:4443"})
    creds = connection_credentials("gs://bucket/staging", "gcs")
    assert creds == GcsCredentials(anonymous=True, project_id="p1", endpoint_url="http://127.0.0.1:4443")
    assert isinstance(creds.filesystem(), pafs.GcsFileSystem)
    assert creds.environment() == {"GOOGLE_CLOUD_PROJECT": "p1", "STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443"}


def test_a_google_connection_without_a_key_needs_the_google_provider_and_says_so(monkeypatch):
    pytest.importorskip("airflow.sdk")
    try:
        import airflow.providers.google  # noqa: F401
        pytest.skip("the Google provider is installed")
    except ImportError:
        pass
    # no key: workload identity, impersonation, a key in a secret manager are the provider's to resolve
    connection(monkeypatch, "gcs", conn_type="google_cloud_platform", extra={"project": "p1"})
    with pytest.raises(StagingError, match=r"Google Cloud connection gcs: credentials other than is_anonymous are "
                                           r"resolved by the Google provider: pip install "
                                           r"'airflow-provider-pglogical\[google\]'"):
        connection_credentials("gs://bucket/staging", "gcs")


def test_a_connection_of_another_store_or_a_local_root_is_refused(monkeypatch):
    connection(monkeypatch, "aws", conn_type="aws", login="k", password="s")
    with pytest.raises(StagingError, match="staging connection aws is a aws connection; an abfs:// or az:// root "
                                           "takes a wasb or adls connection"):
        connection_credentials("az://c/x", "aws")
    with pytest.raises(StagingError, match="staging connection aws is for an object store .*; /data is a local path"):
        connection_credentials("/data", "aws")
    with pytest.raises(StagingError, match="for gs/gcs:// roots; s3://b/x is s3://"):
        with use_credentials("s3://b/x", GcsCredentials(anonymous=True)):
            pass


def test_the_environment_route_builds_gcs_and_azure_filesystems(monkeypatch):
    for name, value in {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443", "GOOGLE_CLOUD_PROJECT": "p1",
                        "AZURE_STORAGE_ACCOUNT_NAME": "devstoreaccount1", "AZURE_STORAGE_ACCOUNT_KEY": "a2V5",
                        "AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:10000"}.items():
        monkeypatch.setenv(name, value)
    fs, path = resolve_filesystem("gs://bucket/staging/")
    assert isinstance(fs, pafs.GcsFileSystem) and path == "bucket/staging"
    fs, path = resolve_filesystem("abfs://c@devstoreaccount1.dfs.core.windows.net/staging")
    assert isinstance(fs, pafs.AzureFileSystem) and path == "c/staging"
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME")
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
    with pytest.raises(StagingError, match="Azure storage needs a storage account"):
        resolve_filesystem("az://c/staging")


def test_registered_credentials_reach_the_executors_and_helper_processes_as_variables(monkeypatch):
    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("UNRELATED", "x")
    creds = AzureCredentials(account_name="acct", account_key="k", endpoint_url="http://127.0.0.1:10000")
    with use_credentials("az://c/staging", creds):
        fs, path = resolve_filesystem("az://c/staging/slot/batches")
        assert isinstance(fs, pafs.AzureFileSystem) and path == "c/staging/slot/batches"
        shipped = storage_env("az://c/staging/slot/batches/0-1")
        assert shipped == {"AWS_REGION": "eu-west-1", "AZURE_STORAGE_ACCOUNT_NAME": "acct",
                           "AZURE_STORAGE_ACCOUNT_KEY": "k", "AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:10000"}
        assert process_environment("az://c/staging")["UNRELATED"] == "x"
    assert "AZURE_STORAGE_ACCOUNT_KEY" not in storage_env("az://c/staging/slot")


def test_staging_connection_registers_the_connections_credentials_for_the_block(monkeypatch):
    connection(monkeypatch, "blob", conn_type="wasb", login="acct", password="k", host="http://127.0.0.1:10000/acct")
    with staging_connection("az://c/staging", "blob"):
        assert storage_env("az://c/staging")["AZURE_STORAGE_ACCOUNT_KEY"] == "k"
    with staging_connection("az://c/staging", None):
        assert "AZURE_STORAGE_ACCOUNT_KEY" not in storage_env("az://c/staging")


_text = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)


@given(account=_text, key=st.one_of(st.none(), _text), sas=st.one_of(st.none(), _text),
       endpoint=st.one_of(st.none(), st.just("http://127.0.0.1:10000")))
def test_azure_credentials_survive_the_trip_through_a_helpers_environment(account, key, sas, endpoint):
    creds = AzureCredentials(account_name=account, account_key=key, sas_token=sas, endpoint_url=endpoint)
    assert azure_environment(creds.environment()) == creds


@given(token=st.one_of(st.none(), _text), key=st.one_of(st.none(), _text), project=st.one_of(st.none(), _text),
       endpoint=st.one_of(st.none(), st.just("http://127.0.0.1:4443")))
def test_gcs_credentials_survive_the_trip_through_a_helpers_environment(token, key, project, endpoint):
    creds = GcsCredentials(access_token=token, service_account_key=key,
                           anonymous=endpoint is not None and token is None and key is None,
                           project_id=project, endpoint_url=endpoint)
    assert gcs_environment(creds.environment()) == creds


def test_an_access_token_without_its_expiry_is_given_googles_hour():
    fs = GcsCredentials(access_token="tok", token_expiry=datetime(2030, 1, 1, tzinfo=UTC)).filesystem()
    assert isinstance(fs, pafs.GcsFileSystem)
    assert isinstance(GcsCredentials(access_token="tok").filesystem(), pafs.GcsFileSystem)
