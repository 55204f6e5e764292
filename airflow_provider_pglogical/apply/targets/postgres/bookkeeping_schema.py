"""Which schema holds a PostgreSQL target's bookkeeping (progress, rejects, per-batch staging tables).

The location is fixed per pipeline and never depends on what other pipelines created in the same
database: the configured ``bookkeeping_schema``; else the schema recorded in the pipeline's staging
area by its first apply (``staging/target_record.py``); else — a pipeline's first apply, or one
applied before the record existed — the schema whose progress table already holds this slot's
watermarks, then the first target table's schema the role has CREATE on (a loader role that owns
only its own schema cannot create anything in ``public``, PostgreSQL 15's default), then the
session's current schema. The apply and every reader of watermarks use the names qualified with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from airflow_provider_pglogical.apply.targets.postgres.catalog import ident
from airflow_provider_pglogical.apply.targets.postgres.progress import PROGRESS_TABLE
from airflow_provider_pglogical.exceptions import ApplyError, PrivilegeError, WatermarksMissingError
from airflow_provider_pglogical.hooks.cursor import one_row
from airflow_provider_pglogical.staging.target_record import TargetRecord, read_record, retired_error, write_record

log = logging.getLogger(__name__)


def resolve_schema(conn: psycopg2.extensions.connection, configured: str | None, target_tables: Iterable[str],
                   progress_table: str = PROGRESS_TABLE, *, slot: str | None = None,
                   recorded: str | None = None) -> str:
    """The bookkeeping schema for this pipeline (see the module docstring)."""
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
        if recorded:
            return recorded
        if slot is not None:
            holders = _schemas_holding(cur, progress_table, slot)
            if len(holders) > 1:
                raise ApplyError(
                    f"the progress tables {', '.join(f'{s}.{progress_table}' for s in holders)} all hold watermarks "
                    f"of slot {slot}; set the target's bookkeeping_schema to the one this pipeline applies with")
            if holders:
                return holders[0]
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


def _schemas_holding(cur: psycopg2.extensions.cursor, progress_table: str, slot: str) -> list[str]:
    """Schemas whose readable ``progress_table`` has a row of ``slot`` (this pipeline's own watermarks)."""
    cur.execute("SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relname = %s AND c.relkind IN ('r', 'p') AND has_schema_privilege(n.oid, 'USAGE') "
                "AND has_table_privilege(c.oid, 'SELECT') ORDER BY 1", (progress_table,))
    out = []
    for (schema,) in cur.fetchall():
        cur.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {}.{} WHERE slot = %s)")
                    .format(sql.Identifier(schema), sql.Identifier(progress_table)), (slot,))
        if one_row(cur)[0]:
            out.append(str(schema))
    return out


def qualified(schema: str, name: str) -> str:
    """``schema.name`` as the target modules spell qualified names (bare names mean ``public``)."""
    return name if "." in name else f"{schema}.{name}"


def locate(conn: psycopg2.extensions.connection, configured: str | None, target_tables: Iterable[str], *,
           slot: str, staging_uri: str, progress_table: str = PROGRESS_TABLE) -> str:
    """The pipeline's bookkeeping schema, recorded in its staging area on first use.

    Raises ``WatermarksMissingError`` when the record says batches were applied but the progress
    table there holds no watermark of ``slot``: applying from the first staged batch again would
    apply every batch twice.
    """
    target = target_identity(conn)
    record = read_record(staging_uri, slot, target)
    schema = resolve_schema(conn, configured, target_tables, progress_table, slot=slot,
                            recorded=record.bookkeeping_schema if record else None)
    name = qualified(schema, progress_table)
    applied = has_watermarks(conn, name, slot)
    conn.rollback()
    if record is not None and record.retired and not applied:
        raise retired_error(slot)
    if record is not None and record.applied and not applied:
        raise WatermarksMissingError(
            f"slot {slot} has applied batches to this target (its staging area records it) but {name} holds no "
            f"watermark of it: the progress table was dropped, emptied or moved; applying again from the first "
            f"staged batch would apply batches twice. Restore {name}, "
            "or run `pglogical reset --spec FILE --yes` to empty the target tables and apply the staged log again")
    remember(staging_uri, slot, target, TargetRecord(schema, applied or bool(record and record.applied)), record)
    return schema


def target_identity(conn: psycopg2.extensions.connection) -> str:
    """``postgres/<database>/<oid>``: the database a record is about (dropped and created again, it is another)."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_database(), oid FROM pg_database WHERE datname = current_database()")
        name, oid = one_row(cur)
    return f"postgres/{name}/{oid}"


def remember(staging_uri: str, slot: str, target: str, record: TargetRecord,
             previous: TargetRecord | None = None) -> None:
    """Write ``record`` unless it is what the staging area holds already.

    A staging area this process may only read (an apply with read-only credentials) keeps the run going
    with a warning: the location then still follows the slot's own watermarks (``resolve_schema``).
    """
    if record == previous:
        return
    try:
        write_record(staging_uri, slot, target, record)
    except OSError as exc:
        log.warning("could not record the bookkeeping schema of slot %s in %s: %s", slot, staging_uri,
                    type(exc).__name__)


def has_watermarks(conn: psycopg2.extensions.connection, progress: str, slot: str) -> bool:
    """Whether ``progress`` exists and holds a row of ``slot``."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (ident(progress).as_string(conn),))
        if one_row(cur)[0] is None:
            return False
        cur.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE slot = %s)").format(ident(progress)), (slot,))
        return bool(one_row(cur)[0])


def resolve_for_dsn(dsn: str, configured: str | None, target_tables: Iterable[str],
                    progress_table: str = PROGRESS_TABLE) -> str:
    """:func:`resolve_schema` on a short-lived connection to ``dsn`` (no slot: the rule for a new pipeline)."""
    conn = psycopg2.connect(dsn)
    try:
        return resolve_schema(conn, configured, target_tables, progress_table)
    finally:
        conn.close()


def locate_for_dsn(dsn: str, configured: str | None, target_tables: Iterable[str], *, slot: str,
                   staging_uri: str, progress_table: str = PROGRESS_TABLE) -> str:
    """:func:`locate` on a short-lived connection to ``dsn``."""
    conn = psycopg2.connect(dsn)
    try:
        return locate(conn, configured, target_tables, slot=slot, staging_uri=staging_uri,
                      progress_table=progress_table)
    finally:
        conn.close()
