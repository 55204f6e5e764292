"""PostgreSQL target catalog: names, connections, table descriptions and creation, foreign keys, the per-slot lock."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from airflow_provider_pglogical.apply.targets.base import TargetTable
from airflow_provider_pglogical.hooks.cursor import one_row

__all__ = ["TargetTable", "connect", "create_table", "describe", "foreign_keys", "ident", "lock_key", "split_name",
           "try_lock_slot"]


def split_name(qualified: str) -> tuple[str, str]:
    schema, _, name = qualified.rpartition(".")
    return (schema or "public", name)


def ident(qualified: str) -> sql.Composable:
    return sql.Identifier(*split_name(qualified))


def connect(dsn: str) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(dsn)
    conn.autocommit = False
    return conn


def lock_key(slot: str) -> str:
    return f"pglogical-apply:{slot}"


def try_lock_slot(conn: psycopg2.extensions.connection, slot: str) -> bool:
    """Session-level advisory lock for a whole run (released when the connection closes)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (lock_key(slot),))
        locked = one_row(cur)[0]
    conn.commit()
    return bool(locked)


def unlock_slot(conn: psycopg2.extensions.connection, slot: str) -> None:
    """Release ``try_lock_slot``'s lock before the connection closes: closing alone releases it only when the
    backend has exited, after ``close()`` returned — a run started right after could find it still held."""
    try:
        conn.rollback()
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (lock_key(slot),))
        conn.commit()
    except psycopg2.Error:  # a broken connection: its backend is gone or going, and the lock with it
        pass


def describe(conn: psycopg2.extensions.connection, qualified: str) -> TargetTable | None:
    schema, name = split_name(qualified)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped "
            "AND a.attgenerated = '' ORDER BY a.attnum", (schema, name))
        cols = cur.fetchall()
        if not cols:
            return None
        cur.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
            "ORDER BY array_position(i.indkey, a.attnum)", (sql.Identifier(schema, name).as_string(conn),))
        pk = tuple(r[0] for r in cur.fetchall())
        # Columns every INSERT must set: NOT NULL, no default, not generated, not identity, not in the
        # primary key (whose NOT NULL cannot be dropped) — what a source DROP COLUMN has to relax.
        cur.execute(
            "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 "
            "AND NOT a.attisdropped AND a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' "
            "AND a.attgenerated = '' AND NOT EXISTS (SELECT FROM pg_index i WHERE i.indrelid = a.attrelid "
            "AND i.indisprimary AND a.attnum = ANY(i.indkey)) ORDER BY a.attnum",
            (sql.Identifier(schema, name).as_string(conn),))
        required = tuple(r[0] for r in cur.fetchall())
    return TargetTable(qualified, dict(cols), pk, required)


def create_table(conn: psycopg2.extensions.connection, qualified: str, columns: Sequence[tuple[str, str]],
                 key: Sequence[str]) -> None:
    """CREATE TABLE IF NOT EXISTS with exact staged PostgreSQL types, primary key = ``key``."""
    parts = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in columns]
    if key:
        parts.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, key))))
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(ident(qualified), sql.SQL(", ").join(parts)))


def foreign_keys(conn: psycopg2.extensions.connection) -> list[tuple[str, str]]:
    """(child, parent) qualified-name pairs of every FK in the target database."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT cn.nspname || '.' || c.relname, pn.nspname || '.' || p.relname FROM pg_constraint k "
            "JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace cn ON cn.oid = c.relnamespace "
            "JOIN pg_class p ON p.oid = k.confrelid JOIN pg_namespace pn ON pn.oid = p.relnamespace "
            "WHERE k.contype = 'f'")
        return [(a, b) for a, b in cur.fetchall()]
