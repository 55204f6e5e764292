"""The one way an Airflow connection becomes libpq parameters or a keyword DSN (hook, apply operator, pipeline)."""

from __future__ import annotations

from typing import Any

# Connection extras passed to libpq; anything else in the extras is ignored on purpose (a stray
# extra must not silently become a libpq keyword).
ALLOWED_EXTRAS = frozenset({
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "connect_timeout", "application_name",
    "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "target_session_attrs",
    "options", "gssencmode", "passfile",
})


def connection_params(conn: Any, *, dbname: str | None = None, application_name: str | None = None) -> dict[str, Any]:
    """libpq keyword → value for an Airflow connection: host, port, dbname, user, password and the
    allow-listed extras (``application_name`` is a default that an extra overrides); empty values dropped."""
    params: dict[str, Any] = {"host": conn.host, "port": conn.port, "dbname": dbname or conn.schema,
                              "user": conn.login, "password": conn.password}
    if application_name is not None:
        params["application_name"] = application_name
    extras = conn.extra_dejson or {}
    params.update({k: extras[k] for k in sorted(ALLOWED_EXTRAS) if k in extras})
    return {k: v for k, v in params.items() if v not in (None, "")}


def quote_value(value: Any) -> str:
    """A libpq keyword/value DSN value, always single-quoted (backslash and quote escaped)."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def params_dsn(params: dict[str, Any]) -> str:
    """A libpq keyword DSN of libpq keyword → value ``params`` (every value quoted)."""
    return " ".join(f"{k}={quote_value(v)}" for k, v in params.items())


def libpq_dsn(conn: Any, **kwargs: Any) -> str:
    """A libpq keyword DSN from an Airflow connection (allow-listed extras only); see ``connection_params``.
    Its password is the connection's own: ``hooks/airflow_connection.py`` resolves IAM tokens."""
    return params_dsn(connection_params(conn, **kwargs))
