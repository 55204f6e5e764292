"""An Airflow AWS connection as object-store credentials (staging, a Delta target on S3).

With the Amazon provider installed (``pip install airflow-provider-pglogical[amazon]``) the connection goes
through ``AwsBaseHook``: whatever it supports — keys, ``role_arn`` (assumed role), a profile, session tokens —
ends as frozen keys, with the connection's region and its S3 endpoint URL. Without it, only the connection's
own fields are read: ``login`` (access key id), ``password`` (secret key), extras ``region_name``,
``endpoint_url``, ``aws_session_token``.
"""

from __future__ import annotations

from airflow_provider_pglogical.staging.credentials import StorageCredentials


def storage_credentials(conn_id: str) -> StorageCredentials:
    """The credentials of Airflow AWS connection ``conn_id``."""
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError:
        return _plain_connection(conn_id)
    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    keys = hook.get_credentials()
    return StorageCredentials(access_key=keys.access_key, secret_key=keys.secret_key, session_token=keys.token,
                              region=hook.conn_region_name, endpoint_url=hook.conn_config.get_service_endpoint_url("s3"))


def _plain_connection(conn_id: str) -> StorageCredentials:
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    extra = conn.extra_dejson or {}
    return StorageCredentials(access_key=conn.login or None, secret_key=conn.password or None,
                              session_token=extra.get("aws_session_token") or None,
                              region=extra.get("region_name") or None, endpoint_url=extra.get("endpoint_url") or None)
