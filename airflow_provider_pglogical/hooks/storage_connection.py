"""A staging root's ``conn_id`` resolved by the root's store: an AWS connection for ``s3://``, a Google Cloud one
for ``gs://``, an Azure one (``wasb``, ``adls``) for ``abfs://`` and ``az://`` (``aws_connection.py``,
``gcp_connection.py``, ``azure_connection.py``), and registered for the root in this process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging.credentials import (
    AZURE_SCHEMES,
    GCS_SCHEMES,
    S3_SCHEMES,
    ObjectStoreCredentials,
    use_credentials,
)

OBJECT_STORE_SCHEMES = S3_SCHEMES + GCS_SCHEMES + AZURE_SCHEMES


def connection_credentials(uri: str, conn_id: str) -> ObjectStoreCredentials:
    """The credentials of Airflow connection ``conn_id`` for the store ``uri`` lies on."""
    scheme = urlsplit(uri).scheme
    if scheme in GCS_SCHEMES:
        from airflow_provider_pglogical.hooks.gcp_connection import storage_credentials as gcs
        return gcs(conn_id)
    if scheme in AZURE_SCHEMES:
        from airflow_provider_pglogical.hooks.azure_connection import storage_credentials as azure
        return azure(conn_id)
    if scheme in S3_SCHEMES:
        from airflow_provider_pglogical.hooks.aws_connection import storage_credentials as aws
        return aws(conn_id)
    raise StagingError(f"staging connection {conn_id} is for an object store (s3://, gs://, abfs://, az://); {uri} "
                       f"is {scheme + '://' if scheme else 'a local path'}: drop the conn_id")


@contextmanager
def staging_connection(uri: str, conn_id: str | None) -> Iterator[None]:
    """The staging root ``uri`` reached, in this process during the block, with the credentials of connection
    ``conn_id`` (``staging/credentials.py``); without one, from the environment."""
    if conn_id is None:
        yield
        return
    with use_credentials(uri, connection_credentials(uri, conn_id)):
        yield
