"""An Airflow PostgreSQL connection as libpq parameters, its credentials resolved as the postgres provider does.

``PostgresHook`` turns a connection whose extras say ``"iam": true`` into a short-lived password: an AWS RDS IAM
token (``aws_conn_id``, through the Amazon provider) or a Microsoft Entra token (``azure_conn_id``), from
``PostgresHook.get_iam_token``. Every DSN this package builds from an Airflow connection (the slot hook, the
pipeline's target, the apply's spark-submit environment, the snapshot readers) comes from here, so such a
connection works everywhere; the extras that reach libpq are still ``hooks/dsn.py``'s allowlist.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from airflow_provider_pglogical.hooks.dsn import connection_params, params_dsn

if TYPE_CHECKING:
    from airflow.providers.postgres.hooks.postgres import PostgresHook


def hook_params(hook: PostgresHook, *, dbname: str | None = None,
                application_name: str | None = None) -> dict[str, Any]:
    """libpq keyword → value for ``hook``'s connection (``connection_params``), with login, password and port
    from ``hook.get_iam_token`` when the connection's extras ask for IAM (``"iam": true``).

    The token is asked for on every call: it is valid for new connections for a short time (15 minutes on RDS),
    so it is taken when a connection is about to be opened, never cached."""
    conn = copy.deepcopy(hook.connection)
    if (conn.extra_dejson or {}).get("iam", False):
        conn.login, conn.password, conn.port = hook.get_iam_token(conn)
    return connection_params(conn, dbname=dbname or hook.database, application_name=application_name)


def connection_dsn(conn_id: str, *, dbname: str | None = None, application_name: str | None = None) -> str:
    """The libpq keyword DSN of Airflow connection ``conn_id``, credentials resolved (``hook_params``)."""
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    return params_dsn(hook_params(PostgresHook(postgres_conn_id=conn_id), dbname=dbname,
                                  application_name=application_name))
