"""An Airflow Azure storage connection (``wasb``, ``adls``) as credentials of an ``abfs://`` / ``az://`` staging root.

The connection's fields are read as the Microsoft provider's hooks read them, without needing the provider:

* ``wasb``: ``login`` the storage account, ``password`` its key; with extra ``tenant_id``, ``login`` and
  ``password`` are a service principal's client id and secret, and the account comes from ``host`` (the account
  URL). ``adls``: ``host`` the account name, ``password`` its key or (with ``tenant_id``) the client secret.
* either: extras ``connection_string`` (``AccountName``, ``AccountKey``, ``SharedAccessSignature``,
  ``BlobEndpoint``), ``sas_token``, ``shared_access_key``, ``account_url``.

An account URL outside ``core.windows.net`` (Azurite's ``http://127.0.0.1:10000/devstoreaccount1``) becomes the
blob endpoint; with no secret at all pyarrow uses ``DefaultAzureCredential`` (a managed identity, the CLI's login).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging.credentials import AzureCredentials

CONN_TYPES = ("wasb", "adls")


def _connection_string(text: str | None) -> dict[str, str]:
    """``Key=Value;…`` of an Azure storage connection string (a value may itself hold ``=``: a SAS)."""
    pairs = (part.split("=", 1) for part in (text or "").split(";") if "=" in part)
    return {key.strip(): value.strip() for key, value in pairs}


def _url_account(url: str) -> str | None:
    """The account of an account URL: ``https://<account>.blob.core.windows.net`` or path-style
    ``http://127.0.0.1:10000/<account>`` (an emulator)."""
    parts = urlsplit(url)
    if parts.hostname and parts.hostname.endswith(".core.windows.net"):
        return parts.hostname.split(".", 1)[0]
    return parts.path.strip("/").split("/", 1)[0] or None


def storage_credentials(conn_id: str) -> AzureCredentials:
    """The storage credentials of Airflow Azure connection ``conn_id``."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    if conn.conn_type not in CONN_TYPES:
        raise StagingError(f"staging connection {conn_id} is a {conn.conn_type} connection; an abfs:// or az:// "
                           f"root takes a wasb or adls connection")
    extra = conn.extra_dejson or {}

    def get(name: str) -> Any:
        return extra.get(name) or extra.get(f"extra__{conn.conn_type}__{name}") or None

    parsed = _connection_string(get("connection_string"))
    host = conn.host or None
    url = get("account_url") or parsed.get("BlobEndpoint") or (host if host and "://" in host else None)
    tenant = get("tenant_id")
    account = (parsed.get("AccountName") or (_url_account(url) if url else None)
               or (host if host and "://" not in host else None) or (None if tenant else conn.login or None))
    endpoint = url if url and not (urlsplit(url).hostname or "").endswith(".core.windows.net") else None
    if endpoint:
        endpoint = f"{urlsplit(endpoint).scheme}://{urlsplit(endpoint).netloc}"
    return AzureCredentials(
        account_name=account,
        account_key=parsed.get("AccountKey") or get("shared_access_key") or (None if tenant else conn.password or None),
        sas_token=parsed.get("SharedAccessSignature") or get("sas_token"),
        client_id=(conn.login or None) if tenant else None, client_secret=(conn.password or None) if tenant else None,
        tenant_id=tenant, endpoint_url=endpoint)
