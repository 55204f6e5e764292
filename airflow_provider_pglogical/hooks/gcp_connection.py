"""An Airflow Google Cloud connection (``google_cloud_platform``) as credentials of a ``gs://`` staging root.

Anonymous access (the connection's ``is_anonymous`` extra: an emulator, a public bucket) needs nothing else. Any
other credentials — a key file (``key_path``, ``keyfile_dict``), workload identity, impersonation — are the Google
provider's to resolve (``pip install airflow-provider-pglogical[google]``): ``GoogleBaseHook`` gives them, and
they are turned into an OAuth access token once, with its expiry, which pyarrow's GCS filesystem takes. Our own
extra ``endpoint_url`` points at an emulator or a private endpoint (the connection type has no host for it).
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging.credentials import GcsCredentials

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
