"""A Delta target's object-store credentials from an Airflow connection or the environment.

Credentials never travel in the spec, a URI, argv or Spark conf: an AWS-type Airflow connection, resolved by
``hooks/aws_connection.py`` (the Amazon provider's ``AwsBaseHook`` when installed: keys, assumed roles, session
tokens; else the connection's login, password and extras ``region_name``, ``endpoint_url``, ``aws_session_token``),
becomes the standard ``AWS_*`` environment variables of the process that applies, which pyarrow (staging) and
deltalake (target) both read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from airflow_provider_pglogical.hooks.aws_connection import storage_credentials


def connection_env(conn_id: str) -> dict[str, str]:
    """``AWS_*`` variables of Airflow AWS connection ``conn_id``."""
    return storage_credentials(conn_id).environment()


@contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set in this process for the block (the in-process apply of the CLI), restored afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
