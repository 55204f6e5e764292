"""Test helper: a target database owned by a non-superuser role, and small query shortcuts."""

from __future__ import annotations

import psycopg2

from tests.conftest import make_database
from tests.pgserver import execute  # noqa: F401  (re-exported for the apply tests)
from tests.pgserver import query as rows  # noqa: F401

APPLIER = "pglogical_applier"


def make_target(server) -> tuple[str, str]:
    """(dbname, DSN as the non-superuser applier) of a fresh database the applier owns."""
    dbname = make_database(server)
    admin = psycopg2.connect(server.dsn())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APPLIER,))
        if cur.fetchone() is None:
            cur.execute(f"CREATE ROLE {APPLIER} LOGIN NOSUPERUSER")
        cur.execute(f'ALTER DATABASE "{dbname}" OWNER TO {APPLIER}')
    admin.close()
    return dbname, server.dsn(dbname, user=APPLIER)
