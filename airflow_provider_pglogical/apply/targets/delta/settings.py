"""A Delta target's object-store credentials from an Airflow connection or the environment.

Credentials never travel in the spec, a URI, argv or Spark conf: an AWS-type Airflow connection
(``login`` = access key id, ``password`` = secret key, extras ``region_name``, ``endpoint_url``,
``aws_session_token`` — nothing else is read) becomes the standard ``AWS_*`` environment variables of
the process that applies, which pyarrow (staging) and deltalake (target) both read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

EXTRA_TO_ENV = {"region_name": "AWS_REGION", "endpoint_url": "AWS_ENDPOINT_URL",
                "aws_session_token": "AWS_SESSION_TOKEN"}


def connection_env(conn_id: str) -> dict[str, str]:
    """``AWS_*`` variables from an Airflow connection (allow-listed fields only)."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    env = {}
    if conn.login:
        env["AWS_ACCESS_KEY_ID"] = conn.login
    if conn.password:
        env["AWS_SECRET_ACCESS_KEY"] = conn.password
    extra = conn.extra_dejson or {}
    env.update({var: str(extra[key]) for key, var in EXTRA_TO_ENV.items() if extra.get(key)})
    if env.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        env["AWS_ALLOW_HTTP"] = "true"
    return env


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
