"""A lake target's object-store credentials from an Airflow connection or the environment.

Credentials never travel in the spec, a URI, argv or Spark conf: the Airflow connection, resolved by the store of
the lake's URI as a staging root's is (``hooks/storage_connection.py``: an AWS connection through
``hooks/aws_connection.py``, a Google Cloud one, a ``wasb`` / ``adls`` one), becomes the environment variables of
the process that applies — the standard ``AWS_*`` ones pyarrow and deltalake both read, the GCS and Azure ones
``staging/credentials.py`` reads back into delta-rs options and the Iceberg target's filesystems.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from airflow_provider_pglogical.hooks.aws_connection import storage_credentials
from airflow_provider_pglogical.hooks.storage_connection import OBJECT_STORE_SCHEMES, connection_credentials


def connection_env(uri: str, conn_id: str) -> dict[str, str]:
    """The variables of Airflow connection ``conn_id`` for the store ``uri`` lies on; an AWS connection's
    ``AWS_*`` ones when ``uri`` names no object store (an Iceberg REST catalog's own warehouse)."""
    if urlsplit(uri).scheme in OBJECT_STORE_SCHEMES:
        return connection_credentials(uri, conn_id).environment()
    return storage_credentials(conn_id).environment()
