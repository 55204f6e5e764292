"""Target bookkeeping in PostgreSQL: the progress (watermark), rejects and snapshot sync tables, and resetting a slot.

The only place that knows their names and SQL: the apply, ``pglogical status`` and replay's reset
all come here.
"""

from __future__ import annotations

from collections.abc import Iterable

from psycopg2 import sql
from psycopg2.extensions import connection, cursor

from airflow_provider_pglogical.apply.targets.postgres.catalog import ident
from airflow_provider_pglogical.hooks.cursor import one_row

PROGRESS_TABLE = "pglogical_progress"
REJECTS_TABLE = "pglogical_rejects"
SYNC_TABLE = "pglogical_sync"


def ensure_bookkeeping(conn: connection, progress: str, rejects: str) -> None:
    with conn.cursor() as cur:
        cur.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (slot text NOT NULL, target_table text NOT NULL, "
            "end_lsn pg_lsn NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), "
            "PRIMARY KEY (slot, target_table))").format(ident(progress)))
        cur.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, slot text NOT NULL, "
            "table_name text NOT NULL, lsn pg_lsn, reason text NOT NULL, key jsonb, "
            "rejected_at timestamptz NOT NULL DEFAULT now())").format(ident(rejects)))
    conn.commit()


def watermarks(conn: connection, progress: str, slot: str) -> dict[str, int]:
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT target_table, (end_lsn - '0/0'::pg_lsn)::bigint FROM {} WHERE slot = %s")
                    .format(ident(progress)), (slot,))
        return dict(cur.fetchall())


def exists(conn: connection, qualified: str) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (ident(qualified).as_string(conn),))
        return one_row(cur)[0] is not None


def read_watermarks(conn: connection, slot: str, progress: str = PROGRESS_TABLE) -> dict[str, int]:
    """``watermarks``, or {} when the progress table does not exist yet (nothing applied)."""
    if not exists(conn, progress):
        return {}
    return watermarks(conn, progress, slot)


def advance_watermarks(cur: cursor, progress: str, slot: str, tables: Iterable[str], end_lsn: int) -> None:
    """Move the watermark of ``tables`` to ``end_lsn`` (never backwards), inside the caller's transaction."""
    for table in tables:
        cur.execute(sql.SQL(
            "INSERT INTO {} AS p (slot, target_table, end_lsn) VALUES (%s, %s, '0/0'::pg_lsn + %s::numeric) "
            "ON CONFLICT (slot, target_table) DO UPDATE SET end_lsn = EXCLUDED.end_lsn, applied_at = now() "
            "WHERE p.end_lsn < EXCLUDED.end_lsn").format(ident(progress)),
            (slot, table, end_lsn))


def reset(conn: connection, slot: str, tables: Iterable[str], progress: str = PROGRESS_TABLE,
          sync: str | None = None) -> list[str]:
    """Empty the existing ``tables`` and forget ``slot``'s watermarks and sync marks (``sync``: the
    snapshot table next to ``progress``), in one transaction; returns the emptied tables.

    Used before re-applying the staged log from its first batch: the staged snapshots load again
    (their sync marks are gone with the rows they loaded). Crashing before the commit leaves the
    target untouched, after it the apply simply starts from an empty target.
    """
    existing = [name for name in tables if exists(conn, name)]
    with conn.cursor() as cur:
        if existing:
            # One TRUNCATE for all: foreign keys between target tables do not block it.
            cur.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(ident(n) for n in existing)))
        if exists(conn, progress):
            cur.execute(sql.SQL("DELETE FROM {} WHERE slot = %s").format(ident(progress)), (slot,))
        if sync is not None and exists(conn, sync):
            cur.execute(sql.SQL("DELETE FROM {} WHERE slot = %s").format(ident(sync)), (slot,))
    conn.commit()
    return existing


def slot_rows(conn: connection, slot: str, tables: Iterable[str]) -> dict[str, int]:
    """Rows of ``slot`` in each existing bookkeeping table of ``tables`` (progress, sync, rejects), by table."""
    counts: dict[str, int] = {}
    with conn.cursor() as cur:
        for table in tables:
            if exists(conn, table):
                cur.execute(sql.SQL("SELECT count(*) FROM {} WHERE slot = %s").format(ident(table)), (slot,))
                counts[table] = int(one_row(cur)[0])
    return counts


def slot_targets(conn: connection, slot: str, tables: Iterable[str]) -> set[str]:
    """The target tables ``slot``'s rows in the existing progress/sync ``tables`` name."""
    names: set[str] = set()
    with conn.cursor() as cur:
        for table in tables:
            if exists(conn, table):
                cur.execute(sql.SQL("SELECT DISTINCT target_table FROM {} WHERE slot = %s").format(ident(table)),
                            (slot,))
                names.update(str(name) for (name,) in cur.fetchall())
    return names


def delete_slot_rows(conn: connection, slot: str, tables: Iterable[str]) -> None:
    """Delete ``slot``'s rows from the existing bookkeeping ``tables``, inside the caller's transaction."""
    with conn.cursor() as cur:
        for table in tables:
            if exists(conn, table):
                cur.execute(sql.SQL("DELETE FROM {} WHERE slot = %s").format(ident(table)), (slot,))


def ensure_sync_table(conn: connection, table: str = SYNC_TABLE) -> None:
    """``table``: qualified with the bookkeeping schema (``bookkeeping_schema.qualified``), like the progress table."""
    with conn.cursor() as cur:
        cur.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (slot text NOT NULL, target_table text NOT NULL, sync_lsn pg_lsn NOT NULL, "
            "rows bigint NOT NULL, synced_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (slot, target_table))"
        ).format(ident(table)))
    conn.commit()


def sync_marks(conn: connection, slot: str, table: str = SYNC_TABLE) -> dict[str, int]:
    """Target table → sync LSN recorded in ``table`` for ``slot`` ({} while ``table`` does not exist)."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (ident(table).as_string(conn),))
        if one_row(cur)[0] is None:
            return {}
        cur.execute(sql.SQL("SELECT target_table, (sync_lsn - '0/0'::pg_lsn)::bigint FROM {} WHERE slot = %s")
                    .format(ident(table)), (slot,))
        return dict(cur.fetchall())
