"""An Airflow Google Cloud connection (``google_cloud_platform``) as credentials of a ``gs://`` staging root.

Anonymous access (the connection's ``is_anonymous`` extra: an emulator, a public bucket) needs nothing else. A
service account's key (``keyfile_dict``: the JSON itself; ``key_path``: a file on the worker) is read as the
Google provider reads it, without needing the provider: staging's filesystem gets tokens signed with it
(``staging/google_key.py``), a Delta target hands it to delta-rs, which signs its own. Other credentials —
workload identity, impersonation, ``key_secret_name`` — are the Google provider's to resolve (``pip install
airflow-provider-pglogical[google]``): ``GoogleBaseHook`` gives them, and they are turned into an OAuth access
token once, with its expiry, which pyarrow's GCS filesystem takes. Our own
extra ``endpoint_url`` points at an emulator or a private endpoint (the connection type has no host for it).
"""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path
from typing import Any

from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging.credentials import GcsCredentials
from airflow_provider_pglogical.staging.google_key import parse_key

CONN_TYPES = ("google_cloud_platform",)


def _extra(conn: Any, name: str) -> Any:
    """A connection extra, under its name or the ``extra__google_cloud_platform__`` prefix older UIs wrote."""
    extra = conn.extra_dejson or {}
    return extra.get(name) or extra.get(f"extra__google_cloud_platform__{name}") or None


def storage_credentials(conn_id: str) -> GcsCredentials:
    """The GCS credentials of Airflow Google Cloud connection ``conn_id``."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    if conn.conn_type not in CONN_TYPES:
        raise StagingError(f"staging connection {conn_id} is a {conn.conn_type} connection; a gs:// root takes a "
                           f"google_cloud_platform connection")
    project, endpoint = _extra(conn, "project"), _extra(conn, "endpoint_url")
    if _extra(conn, "is_anonymous"):
        return GcsCredentials(anonymous=True, project_id=project, endpoint_url=endpoint)
    key = _service_account_key(conn_id, _extra(conn, "keyfile_dict"), _extra(conn, "key_path"))
    if key is not None:
        return GcsCredentials(service_account_key=key, project_id=project or parse_key(key).get("project_id"),
                              endpoint_url=endpoint)
    try:
        from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
        from google.auth.transport.requests import Request
    except ImportError:
        raise StagingError(f"Google Cloud connection {conn_id}: credentials other than is_anonymous are resolved by "
                           f"the Google provider: pip install 'airflow-provider-pglogical[google]'") from None
    credentials, hook_project = GoogleBaseHook(gcp_conn_id=conn_id).get_credentials_and_project_id()
    credentials.refresh(Request())
    expiry = credentials.expiry.replace(tzinfo=UTC) if credentials.expiry else None  # google-auth: naive UTC
    return GcsCredentials(access_token=credentials.token, token_expiry=expiry, project_id=project or hook_project,
                          endpoint_url=endpoint)


def _service_account_key(conn_id: str, keyfile_dict: Any, key_path: Any) -> str | None:
    """The connection's service account key as JSON text: ``keyfile_dict`` (JSON text or an object) or the file
    ``key_path`` names; None when it has neither."""
    if keyfile_dict:
        text = keyfile_dict if isinstance(keyfile_dict, str) else json.dumps(keyfile_dict)
    elif key_path:
        if str(key_path).endswith(".p12"):
            raise StagingError(f"Google Cloud connection {conn_id}: a .p12 key_path is not supported; use the "
                               f"service account's JSON key")
        try:
            text = Path(key_path).read_text()
        except OSError as exc:
            raise StagingError(f"Google Cloud connection {conn_id}: key_path {key_path} cannot be read: "
                               f"{exc.strerror}") from None
    else:
        return None
    try:
        parse_key(text)
    except StagingError as exc:
        raise StagingError(f"Google Cloud connection {conn_id}: {exc}") from None
    return text
