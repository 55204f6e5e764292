"""Which schema holds a PostgreSQL target's bookkeeping (progress, rejects, per-batch staging tables).

A loader role that owns only its own schema cannot create anything in ``public`` (PostgreSQL
15's default), so the bookkeeping goes to a schema the role can create in: the configured one,
else the schema already holding ``pglogical_progress`` (existing installations keep their
watermarks), else the first target table's schema the role has CREATE on, else the session's
current schema. The apply and every reader of watermarks then use the names qualified with it.
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from airflow_provider_pglogical.apply.targets.postgres.progress import PROGRESS_TABLE
from airflow_provider_pglogical.exceptions import PrivilegeError
from airflow_provider_pglogical.hooks.cursor import one_row


def resolve_schema(conn: psycopg2.extensions.connection, configured: str | None, target_tables: Iterable[str],
                   progress_table: str = PROGRESS_TABLE) -> str:
    """The bookkeeping schema for this role and these targets (see the module docstring)."""
    with conn.cursor() as cur:
        if configured:
            cur.execute("SELECT has_schema_privilege(%s, 'CREATE') FROM pg_namespace WHERE nspname = %s",
                        (configured, configured))
            row = cur.fetchone()
            if row is None or not row[0]:
                raise PrivilegeError(
                    f"the bookkeeping schema {configured!r} does not exist or the role lacks CREATE on it; "
                    f"CREATE SCHEMA {configured} AUTHORIZATION <role>, or GRANT USAGE, CREATE ON SCHEMA",
                    privilege=f"CREATE ON SCHEMA {configured}")
            return configured
        cur.execute("SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.oid = to_regclass(%s)", (sql.Identifier(progress_table).as_string(conn),))
        row = cur.fetchone()
        if row is not None:
            return str(row[0])
        candidates = list(dict.fromkeys([t.partition(".")[0] for t in target_tables if "." in t]))
        cur.execute("SELECT current_schema(), current_user")
        current, user = one_row(cur)
        if current is not None:
            candidates.append(current)
        for schema in dict.fromkeys(candidates):
            cur.execute("SELECT has_schema_privilege(%s, 'CREATE') FROM pg_namespace WHERE nspname = %s",
                        (schema, schema))
            ok = cur.fetchone()
            if ok is not None and ok[0]:
                return schema
    conn.rollback()
    tried = ", ".join(dict.fromkeys(candidates)) or "(none)"
    first = candidates[0] if candidates else "public"
    raise PrivilegeError(
        f"role {user} may create tables in none of the schemas {tried}, so the bookkeeping tables "
        f"({progress_table}, rejects, staging) have nowhere to go; GRANT CREATE ON SCHEMA {first} TO {user}, "
        "or set the target's bookkeeping_schema to a schema the role owns", privilege=f"CREATE ON SCHEMA {first}")


def qualified(schema: str, name: str) -> str:
    """``schema.name`` as the target modules spell qualified names (bare names mean ``public``)."""
    return name if "." in name else f"{schema}.{name}"


def resolve_for_dsn(dsn: str, configured: str | None, target_tables: Iterable[str],
                    progress_table: str = PROGRESS_TABLE) -> str:
    """:func:`resolve_schema` on a short-lived connection to ``dsn``."""
    conn = psycopg2.connect(dsn)
    try:
        return resolve_schema(conn, configured, target_tables, progress_table)
    finally:
        conn.close()
