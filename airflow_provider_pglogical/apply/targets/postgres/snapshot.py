"""Snapshot loads into PostgreSQL: staged by the executors like a batch, then one transaction that
empties the tables, inserts the rows and sets watermark and sync LSN.

Choice (docs/apply.md): the rows go into the *existing* target table emptied with ``TRUNCATE`` in
the same transaction, not into a fresh table swapped in. Readers see the old contents until
COMMIT and the new ones after (TRUNCATE is transactional in PostgreSQL), while grants, indexes,
constraints, FKs and dependent views of the target table stay as they are — a swap would have to
recreate all of them. Tables snapshotted at one LSN are loaded in one transaction, emptied by one
TRUNCATE (so FKs among them are fine) and filled parents first.

Crash windows (``CHECKPOINTS``, where the crash tests stop the process): while the executors COPY
into the unlogged ``…_snap`` staging tables nothing is visible, and the rerun recreates them under
the same names; before COMMIT the transaction rolls back with the connection; after COMMIT the
sync marks make the rerun skip the group, and the session's start drops the staging tables the
crash left (``copy.drop_leftover_staging``).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg2
from psycopg2 import sql

from airflow_provider_pglogical.apply.snapshots import PlannedSnapshot
from airflow_provider_pglogical.apply.targets.base import BatchResult
from airflow_provider_pglogical.apply.targets.postgres.bookkeeping_schema import qualified
from airflow_provider_pglogical.apply.targets.postgres.catalog import ident, lock_key
from airflow_provider_pglogical.apply.targets.postgres.copy import drop_staging
from airflow_provider_pglogical.apply.targets.postgres.plan import staging_name
from airflow_provider_pglogical.exceptions import ApplyError, format_lsn

SYNC_TABLE = "pglogical_sync"
# ``staged`` after each table's staging table is filled, ``loaded`` after each table's INSERT inside the
# transaction (watermark and sync LSN not written yet), then right before and right after COMMIT.
CHECKPOINTS = ("snapshot_staged", "snapshot_loaded", "snapshot_before_commit", "snapshot_committed")


def ensure_sync_table(conn: Any, table: str = SYNC_TABLE) -> None:
    """``table``: qualified with the bookkeeping schema (``bookkeeping_schema.qualified``), like the progress table."""
    with conn.cursor() as cur:
        cur.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (slot text NOT NULL, target_table text NOT NULL, sync_lsn pg_lsn NOT NULL, "
            "rows bigint NOT NULL, synced_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (slot, target_table))"
        ).format(ident(table)))
    conn.commit()


def sync_marks(conn: Any, slot: str, table: str = SYNC_TABLE) -> dict[str, int]:
    """Target table → sync LSN recorded in ``table`` for ``slot`` ({} while ``table`` does not exist)."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (ident(table).as_string(conn),))
        if cur.fetchone()[0] is None:
            return {}
        cur.execute(sql.SQL("SELECT target_table, (sync_lsn - '0/0'::pg_lsn)::bigint FROM {} WHERE slot = %s")
                    .format(ident(table)), (slot,))
        return dict(cur.fetchall())


def apply_snapshot(target: Any, plan: PlannedSnapshot, changes: Any) -> BatchResult:
    """Stage every table's rows, then TRUNCATE + INSERT + watermark + sync LSN in one transaction."""
    conn = target.conn
    progress = target.config.progress_table
    sync_table = qualified(target.bookkeeping_schema, SYNC_TABLE)
    ensure_sync_table(conn, sync_table)
    result = BatchResult(applied=False)
    started = time.monotonic()
    names = {t.target: staging_name(plan.slot, plan.lsn, t.target, target.bookkeeping_schema) + "_snap"
             for t in plan.tables}
    try:
        for t in plan.tables:
            target._stage(t, target._existing(t.target), names[t.target], changes.net(t), in_order=False)
            target.checkpoint("snapshot_staged")
        staged_at = time.monotonic()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock_key(plan.slot),))
                marks = sync_marks(conn, plan.slot, sync_table)
                load = [t for t in plan.tables if marks.get(t.target, -1) < plan.lsn]
                if not load:
                    conn.rollback()
                    return result
                cur.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(ident(t.target) for t in load)))
                for t in load:
                    cols = sql.SQL(", ").join(map(sql.Identifier, t.columns))
                    cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                        ident(t.target), cols, cols, ident(names[t.target])))
                    inserted = cur.rowcount
                    result.rows[t.target] = {"snapshot_rows": inserted}
                    target.checkpoint("snapshot_loaded")
                    cur.execute(sql.SQL(
                        "INSERT INTO {} (slot, target_table, end_lsn) VALUES (%s, %s, %s::pg_lsn) "
                        "ON CONFLICT (slot, target_table) DO UPDATE SET end_lsn = EXCLUDED.end_lsn, applied_at = now()"
                    ).format(ident(progress)), (plan.slot, t.target, format_lsn(plan.lsn)))
                    cur.execute(sql.SQL(
                        "INSERT INTO {} (slot, target_table, sync_lsn, rows) VALUES (%s, %s, %s::pg_lsn, %s) "
                        "ON CONFLICT (slot, target_table) DO UPDATE SET sync_lsn = EXCLUDED.sync_lsn, "
                        "rows = EXCLUDED.rows, synced_at = now()"
                    ).format(ident(sync_table)), (plan.slot, t.target, format_lsn(plan.lsn), inserted))
                cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
                target.checkpoint("snapshot_before_commit")
            conn.commit()
            target.checkpoint("snapshot_committed")
        except psycopg2.Error as exc:
            conn.rollback()
            primary = (exc.diag.message_primary if exc.diag else None) or type(exc).__name__
            hint = ""
            if exc.pgcode == "0A000":  # TRUNCATE of a table other target tables reference
                hint = "; resync the tables referencing it together with it (--table for each)"
            raise ApplyError(f"snapshot at {format_lsn(plan.lsn)} of {', '.join(t.target for t in plan.tables)} "
                             f"not applied: [{exc.pgcode}] {primary}{hint}") from None
        except BaseException:
            conn.rollback()
            raise
        result.applied = True
        result.seconds = {"stage": round(staged_at - started, 3), "apply": round(time.monotonic() - staged_at, 3)}
        return result
    finally:
        try:
            drop_staging(conn, list(names.values()))
        except psycopg2.Error:
            conn.rollback()
