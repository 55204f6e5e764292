"""Object-store credentials of a staging root handed to this process by whoever resolved them, instead of the
environment.

The same credentials reach the lake targets: ``delta_options()`` is what delta-rs (``object_store``) takes for a
Delta table on the store, and an Iceberg table's files go through the filesystem itself
(``apply/targets/iceberg/fileio.py``), so a new store is one class here.

By default a staging root's filesystem is built from the environment: pyarrow's S3 filesystem finds its own
(``AWS_*`` variables, ``~/.aws``), GCS and Azure roots read the variables ``gcs_environment`` and
``azure_environment`` name. That is the CLI's way. An Airflow task resolves the spec's ``staging.conn_id``
(``hooks/storage_connection.py``: an AWS, Google Cloud or Azure connection, by the root's scheme) and registers the
result for the staging root with ``use_credentials``; from then on, in this process, ``staging.layout.
resolve_filesystem`` of any URI under that root builds its filesystem from them. A process started for the apply
(spark-submit) or a snapshot reader gets them as variables of its environment (``environment()``), the same
variables the environment route reads, never on a command line.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging.google_key import parse_key

S3_SCHEMES = ("s3", "s3a")
GCS_SCHEMES = ("gs", "gcs")
AZURE_SCHEMES = ("abfs", "abfss", "az")

# The variables that reach an object store, for helper processes and Spark executors (``storage_env``).
GCS_VARIABLES = ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT", "GOOGLE_OAUTH_ACCESS_TOKEN",
                 "GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_APPLICATION_CREDENTIALS")
AZURE_VARIABLES = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN",
                   "AZURE_STORAGE_ENDPOINT", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID")


class ObjectStoreCredentials(Protocol):
    """What a resolved connection gives: the filesystem of its store, and the variables that say the same."""

    @property
    def schemes(self) -> tuple[str, ...]: ...

    def filesystem(self) -> pafs.FileSystem: ...

    def environment(self) -> dict[str, str]: ...

    def delta_options(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class StorageCredentials:
    """What an S3-compatible store needs: keys (None: pyarrow's own chain), region and a custom endpoint URL."""

    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None
    endpoint_url: str | None = None
    schemes: tuple[str, ...] = field(default=S3_SCHEMES, init=False, repr=False)

    def s3_filesystem(self) -> pafs.S3FileSystem:
        options: dict[str, str] = {}
        if self.access_key and self.secret_key:
            options.update(access_key=self.access_key, secret_key=self.secret_key)
            if self.session_token:
                options["session_token"] = self.session_token
        if self.region:
            options["region"] = self.region
        if self.endpoint_url:
            endpoint = urlsplit(self.endpoint_url)
            options.update(endpoint_override=endpoint.netloc + endpoint.path.rstrip("/"),
                           scheme=endpoint.scheme or "https")
        return pafs.S3FileSystem(**options)

    def filesystem(self) -> pafs.FileSystem:
        return self.s3_filesystem()

    def environment(self) -> dict[str, str]:
        """The standard ``AWS_*`` variables for a process of our own (pyarrow and deltalake both read them)."""
        env = {name: value for name, value in (
            ("AWS_ACCESS_KEY_ID", self.access_key), ("AWS_SECRET_ACCESS_KEY", self.secret_key),
            ("AWS_SESSION_TOKEN", self.session_token), ("AWS_REGION", self.region),
            ("AWS_DEFAULT_REGION", self.region), ("AWS_ENDPOINT_URL", self.endpoint_url)) if value}
        if (self.endpoint_url or "").startswith("http://"):
            env["AWS_ALLOW_HTTP"] = "true"
        return env

    def delta_options(self) -> dict[str, str]:
        """Nothing beyond the ``AWS_*`` variables, which delta-rs reads itself (``delta/location.py``)."""
        return {}


# Google's OAuth access tokens live an hour at most: one handed over without its expiry is taken to have that long.
_GCS_TOKEN_LIFETIME = timedelta(hours=1)


@dataclass(frozen=True)
class GcsCredentials:
    """What Google Cloud Storage needs: an OAuth access token or a service account's JSON key (None of them:
    pyarrow's default credentials, e.g. ``GOOGLE_APPLICATION_CREDENTIALS`` or the metadata server), or anonymous
    access (an emulator, public buckets); the project new buckets go to; a custom endpoint URL (an emulator)."""

    access_token: str | None = field(default=None, repr=False)
    service_account_key: str | None = field(default=None, repr=False)
    token_expiry: datetime | None = None
    anonymous: bool = False
    project_id: str | None = None
    endpoint_url: str | None = None
    schemes: tuple[str, ...] = field(default=GCS_SCHEMES, init=False, repr=False)

    def filesystem(self) -> pafs.FileSystem:
        options: dict[str, object] = {}
        if self.anonymous:
            options["anonymous"] = True
        elif self.access_token:
            options.update(access_token=self.access_token, credential_token_expiration=self.token_expiry or (
                datetime.now(UTC) + _GCS_TOKEN_LIFETIME))
        elif self.service_account_key:
            from airflow_provider_pglogical.staging.google_key import access_token

            token, expiry = access_token(self.service_account_key)
            options.update(access_token=token, credential_token_expiration=expiry)
        if self.project_id:
            options["project_id"] = self.project_id
        if self.endpoint_url:
            endpoint = urlsplit(self.endpoint_url if "://" in self.endpoint_url else "http://" + self.endpoint_url)
            options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme)
        return pafs.GcsFileSystem(**options)

    def environment(self) -> dict[str, str]:
        """The variables ``gcs_environment`` reads back (``STORAGE_EMULATOR_HOST`` is the one Google's own clients
        read for an emulator, which they reach without credentials)."""
        env = {name: value for name, value in (
            ("GOOGLE_CLOUD_PROJECT", self.project_id), ("STORAGE_EMULATOR_HOST", self.endpoint_url)) if value}
        if self.access_token and not self.anonymous:
            env["GOOGLE_OAUTH_ACCESS_TOKEN"] = self.access_token
        if self.service_account_key and not self.anonymous:
            env["GOOGLE_SERVICE_ACCOUNT_KEY"] = self.service_account_key
        return env

    def delta_options(self) -> dict[str, str]:
        """delta-rs's ``object_store`` options: the service account's key (it signs its own tokens), with an
        emulator's URL as the key's ``gcs_base_url`` (an emulator alone: a key with ``disable_oauth``); with
        neither, ``object_store``'s own default credentials. A bare access token it cannot take."""
        key: dict[str, object] | None = dict(parse_key(self.service_account_key)) if self.service_account_key else None
        if self.endpoint_url:
            endpoint = self.endpoint_url if "://" in self.endpoint_url else "http://" + self.endpoint_url
            key = {**(key or {"client_email": "", "private_key": "", "private_key_id": "", "disable_oauth": True}),
                   "gcs_base_url": endpoint.rstrip("/")}
        if key is None:
            if self.access_token and not self.anonymous:
                raise StagingError("a Delta table on gs:// takes a service account's key (the Google Cloud "
                                   "connection's key_path or keyfile_dict) or the machine's default credentials, "
                                   "not an OAuth access token")
            return {}
        options = {"google_service_account_key": json.dumps(key)}
        if str(key.get("gcs_base_url", "")).startswith("http://"):
            options["allow_http"] = "true"
        return options


def gcs_environment(environ: Mapping[str, str]) -> GcsCredentials:
    """GCS credentials from variables: ``STORAGE_EMULATOR_HOST`` (an emulator's URL, reached anonymously),
    ``GOOGLE_OAUTH_ACCESS_TOKEN``, ``GOOGLE_SERVICE_ACCOUNT_KEY`` (a service account's JSON key itself),
    ``GOOGLE_CLOUD_PROJECT``; with none of them, pyarrow's default credentials."""
    emulator = environ.get("STORAGE_EMULATOR_HOST") or None
    token = environ.get("GOOGLE_OAUTH_ACCESS_TOKEN") or None
    key = environ.get("GOOGLE_SERVICE_ACCOUNT_KEY") or None
    return GcsCredentials(access_token=token, service_account_key=key,
                          anonymous=emulator is not None and token is None and key is None,
                          project_id=environ.get("GOOGLE_CLOUD_PROJECT") or None, endpoint_url=emulator)


@dataclass(frozen=True)
class AzureCredentials:
    """What Azure Blob Storage / ADLS Gen2 needs: the account, then an account key, a SAS token or a service
    principal (none of them: pyarrow's ``DefaultAzureCredential``), and a custom blob endpoint URL (Azurite)."""

    account_name: str | None = None
    account_key: str | None = field(default=None, repr=False)
    sas_token: str | None = field(default=None, repr=False)
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    tenant_id: str | None = None
    endpoint_url: str | None = None
    schemes: tuple[str, ...] = field(default=AZURE_SCHEMES, init=False, repr=False)

    def _account(self) -> str:
        if not self.account_name:
            raise StagingError("Azure storage needs a storage account: abfs://<container>@<account>.dfs.core."
                               "windows.net/..., the connection's account or AZURE_STORAGE_ACCOUNT_NAME")
        return self.account_name

    def filesystem(self) -> pafs.FileSystem:
        account = self._account()
        options: dict[str, str] = {}
        if self.account_key:
            options["account_key"] = self.account_key
        elif self.sas_token:
            options["sas_token"] = self.sas_token.lstrip("?")
        elif self.client_id and self.client_secret and self.tenant_id:
            options.update(client_id=self.client_id, client_secret=self.client_secret, tenant_id=self.tenant_id)
        if self.endpoint_url:
            endpoint = urlsplit(self.endpoint_url)
            # Azurite serves blobs and its (flat) DFS alike on the one endpoint
            options.update(blob_storage_authority=endpoint.netloc, blob_storage_scheme=endpoint.scheme or "https",
                           dfs_storage_authority=endpoint.netloc, dfs_storage_scheme=endpoint.scheme or "https")
        return pafs.AzureFileSystem(account, **options)

    def delta_options(self) -> dict[str, str]:
        """delta-rs's ``object_store`` options: the account and the same secret as ``filesystem``; a custom
        endpoint (Azurite) path-style, ``<endpoint>/<account>``."""
        options = {"azure_storage_account_name": self._account()}
        if self.account_key:
            options["azure_storage_account_key"] = self.account_key
        elif self.sas_token:
            options["azure_storage_sas_key"] = self.sas_token.lstrip("?")
        elif self.client_id and self.client_secret and self.tenant_id:
            options.update(azure_storage_client_id=self.client_id, azure_storage_client_secret=self.client_secret,
                           azure_storage_tenant_id=self.tenant_id)
        if self.endpoint_url:
            options["azure_storage_endpoint"] = f"{self.endpoint_url.rstrip('/')}/{options['azure_storage_account_name']}"
            if self.endpoint_url.startswith("http://"):
                options["allow_http"] = "true"
        return options

    def environment(self) -> dict[str, str]:
        """The variables ``azure_environment`` reads back (the ``AZURE_STORAGE_*`` names delta-rs reads too)."""
        return {name: value for name, value in (
            ("AZURE_STORAGE_ACCOUNT_NAME", self.account_name), ("AZURE_STORAGE_ACCOUNT_KEY", self.account_key),
            ("AZURE_STORAGE_SAS_TOKEN", self.sas_token), ("AZURE_STORAGE_ENDPOINT", self.endpoint_url),
            ("AZURE_CLIENT_ID", self.client_id), ("AZURE_CLIENT_SECRET", self.client_secret),
            ("AZURE_TENANT_ID", self.tenant_id)) if value}


def azure_environment(environ: Mapping[str, str], account: str | None = None) -> AzureCredentials:
    """Azure credentials from the ``AZURE_STORAGE_*`` / ``AZURE_CLIENT_*`` variables; ``account`` (the URI's)
    when the variables name none."""
    def get(name: str) -> str | None:
        return environ.get(name) or None

    return AzureCredentials(account_name=get("AZURE_STORAGE_ACCOUNT_NAME") or account,
                            account_key=get("AZURE_STORAGE_ACCOUNT_KEY"), sas_token=get("AZURE_STORAGE_SAS_TOKEN"),
                            client_id=get("AZURE_CLIENT_ID"), client_secret=get("AZURE_CLIENT_SECRET"),
                            tenant_id=get("AZURE_TENANT_ID"), endpoint_url=get("AZURE_STORAGE_ENDPOINT"))


def object_path(uri: str) -> str:
    """The pyarrow path of an object-store URI: ``bucket/key`` (s3, gs), ``container/path`` (``az://container/…``,
    ``abfs://container@account.dfs.core.windows.net/…``)."""
    parts = urlsplit(uri)
    container = parts.netloc.split("@", 1)[0] if parts.scheme in AZURE_SCHEMES else parts.netloc
    return (container + parts.path).rstrip("/")


def uri_account(uri: str) -> str | None:
    """The storage account an ``abfs://container@account.dfs.core.windows.net`` URI names (else None)."""
    netloc = urlsplit(uri).netloc
    return netloc.split("@", 1)[1].split(".", 1)[0] if "@" in netloc else None


def environment_credentials(uri: str, environ: Mapping[str, str] | None = None) -> ObjectStoreCredentials | None:
    """The credentials of a GCS or Azure ``uri`` from the environment's variables (the CLI's route, an executor's,
    and a lake target's, whose connection is set as variables around its work); None for other schemes, whose
    libraries read their variables themselves."""
    scheme = urlsplit(uri).scheme
    env = os.environ if environ is None else environ
    if scheme in GCS_SCHEMES:
        return gcs_environment(env)
    if scheme in AZURE_SCHEMES:
        return azure_environment(env, uri_account(uri))
    return None


def environment_filesystem(uri: str, environ: Mapping[str, str] | None = None) -> tuple[pafs.FileSystem, str] | None:
    """The filesystem and path of a GCS or Azure ``uri`` from the environment's variables; None for other
    schemes, which pyarrow resolves itself."""
    credentials = environment_credentials(uri, environ)
    return None if credentials is None else (credentials.filesystem(), object_path(uri))


_registered: dict[str, ObjectStoreCredentials] = {}
_lock = threading.Lock()


def _root(uri: str) -> str:
    return uri.rstrip("/") + "/"


@contextmanager
def use_credentials(uri: str, credentials: ObjectStoreCredentials) -> Iterator[None]:
    """``credentials`` for every URI under ``uri`` resolved in this process during the block."""
    scheme = urlsplit(uri).scheme
    if scheme not in credentials.schemes:
        raise StagingError(f"staging credentials of this connection are for {'/'.join(credentials.schemes)}:// "
                           f"roots; {uri} is {scheme + '://' if scheme else 'a local path'}: drop the conn_id or "
                           f"name a connection of the root's store")
    key = _root(uri)
    with _lock:
        previous = _registered.get(key)
        _registered[key] = credentials
    try:
        yield
    finally:
        with _lock:
            if previous is None:
                _registered.pop(key, None)
            else:
                _registered[key] = previous


def _registered_for(uri: str) -> ObjectStoreCredentials | None:
    target = _root(uri)
    with _lock:
        roots = [r for r in _registered if target.startswith(r)]
        return _registered[max(roots, key=len)] if roots else None


def process_environment(uri: str) -> dict[str, str]:
    """This process's environment for a helper process of ours that reaches ``uri``: the registered credentials'
    variables on top (the helper has no registry of its own), else the environment as it is."""
    credentials = _registered_for(uri)
    return {**os.environ, **(credentials.environment() if credentials else {})}


def registered_filesystem(uri: str) -> tuple[pafs.FileSystem, str] | None:
    """The filesystem and path of ``uri`` when credentials are registered for a root it lies under, else None."""
    credentials = _registered_for(uri)
    if credentials is None:
        return None
    return credentials.filesystem(), object_path(uri)


def is_storage_variable(name: str) -> bool:
    """Whether environment variable ``name`` is one an object store's filesystem is built from."""
    return name.startswith("AWS_") or name in GCS_VARIABLES or name in AZURE_VARIABLES
