"""The apply's ``session_replication_role``: set on every session that writes target tables, and the ways out of a
batch refused by a foreign key.

A native subscriber's apply and table-sync workers run with ``session_replication_role = replica``: foreign keys
(triggers) and ordinary triggers of the target do not fire, ``ENABLE REPLICA`` / ``ENABLE ALWAYS`` triggers do. A
child row whose parent predates the slot is applied all the same. ``target.session_replication_role: replica``
does the same here; the default ``origin`` keeps the target's foreign keys and triggers active, and a batch that
breaks one stops (``foreign_key_error``) naming the ways out.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg2
import psycopg2.extensions

from airflow_provider_pglogical.exceptions import ConstraintViolationError, PrivilegeError

ORIGIN, REPLICA = "origin", "replica"
FOREIGN_KEY_VIOLATION = "23503"
INSUFFICIENT_PRIVILEGE = "42501"
PRIVILEGE = "SET ON PARAMETER session_replication_role"


def set_replication_role(conn: psycopg2.extensions.connection, role: str) -> None:
    """``SET session_replication_role`` for the session (committed, so no later rollback undoes it); nothing for
    ``origin``, the server default, which needs no privilege.

    Raises ``PrivilegeError`` when the role may not set it: superusers may, and on PostgreSQL 15+ a role granted
    ``SET ON PARAMETER session_replication_role``."""
    if role == ORIGIN:
        return
    try:
        with conn.cursor() as cur:
            cur.execute("SET session_replication_role = replica")
        conn.commit()
    except psycopg2.Error as exc:
        conn.rollback()
        if exc.pgcode != INSUFFICIENT_PRIVILEGE:
            raise
        user = conn.info.user
        raise PrivilegeError(
            f"role {user} may not set session_replication_role (target.session_replication_role: replica): "
            f"GRANT {PRIVILEGE} TO {user} (PostgreSQL 15+; before 15 only a superuser may), or leave the option "
            "unset", privilege=PRIVILEGE) from None


def referenced_table(conn: psycopg2.extensions.connection, table: str, constraint: str) -> str | None:
    """The table a foreign key ``constraint`` of ``table`` (``schema.table``) references, or None."""
    schema, _, name = table.rpartition(".")
    with conn.cursor() as cur:
        cur.execute("SELECT pn.nspname || '.' || p.relname FROM pg_constraint k "
                    "JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace cn ON cn.oid = c.relnamespace "
                    "JOIN pg_class p ON p.oid = k.confrelid JOIN pg_namespace pn ON pn.oid = p.relnamespace "
                    "WHERE k.contype = 'f' AND k.conname = %s AND cn.nspname = %s AND c.relname = %s",
                    (constraint, schema or "public", name))
        found = cur.fetchone()
    conn.rollback()
    return str(found[0]) if found else None


def foreign_key_error(conn: psycopg2.extensions.connection, error: ConstraintViolationError,
                      sources: Mapping[str, str]) -> ConstraintViolationError:
    """``error`` (a batch refused by a foreign key of the target, rolled back) with its ways out: a resync of the
    referenced table together with the referencing one (tables linked by a foreign key load at one LSN), or
    applying like a native subscriber. ``sources``: target table → its source table (the resync's names).

    A child row whose parent the target never received (changes from before the slot, no initial snapshot)
    is what a native subscriber applies anyway; any other error is returned as it is."""
    if error.sqlstate != FOREIGN_KEY_VIOLATION or not error.table or not error.constraint:
        return error
    parent = referenced_table(conn, error.table, error.constraint)
    tables = [sources.get(t, t) for t in dict.fromkeys([parent, error.table]) if t]
    resync = "pglogical resync " + " ".join(f"--table {t}" for t in tables)
    message = (f"{error}; the target's rows and the batch's changes disagree on a foreign key (typically a referenced "
               f"row written before the slot, without a snapshot): resync the tables linked by it ({resync}), or "
               "apply like a native subscriber with "
               "target.session_replication_role: replica (the target's foreign keys and ordinary triggers then do "
               "not fire)")
    return ConstraintViolationError(message, table=error.table, lsn=error.lsn, constraint=error.constraint,
                                    sqlstate=error.sqlstate)
