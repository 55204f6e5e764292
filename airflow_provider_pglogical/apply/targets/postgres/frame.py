"""The exactly-once frame of a batch transaction in PostgreSQL, shared by the set-based apply and the ordered replay."""

from __future__ import annotations

from collections.abc import Callable

import psycopg2
from psycopg2 import sql
from psycopg2.extensions import connection, cursor

from airflow_provider_pglogical.apply.targets.postgres.catalog import ident, lock_key
from airflow_provider_pglogical.apply.targets.postgres.plan import BatchPlan, BatchResult
from airflow_provider_pglogical.apply.targets.postgres.progress import advance_watermarks, watermarks
from airflow_provider_pglogical.exceptions import ApplyError, ConstraintViolationError, format_lsn


def begin_batch(cur: cursor, plan: BatchPlan, progress: str) -> bool:
    """Lock the slot, re-read the watermark (False: already applied), follow schema changes, run the truncates."""
    # Same key as the run's session lock: re-entrant here, and it serialises other writers.
    cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock_key(plan.slot),))
    marks = watermarks(cur.connection, progress, plan.slot)
    if all(marks.get(t, -1) >= plan.end_lsn for t in plan.watermark_tables):
        return False
    for statement in plan.ddl:
        cur.execute(statement)
    if plan.truncate:
        cur.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(map(ident, plan.truncate))))
        for table in plan.restart_identity:
            # What TRUNCATE ... RESTART IDENTITY does, for a subset of one statement's tables.
            cur.execute("SELECT s.oid::regclass::text FROM pg_depend d JOIN pg_class s ON s.oid = d.objid "
                        "WHERE d.refobjid = %s::regclass AND d.deptype IN ('a', 'i') AND s.relkind = 'S'",
                        (ident(table).as_string(cur.connection),))
            for (seq,) in cur.fetchall():
                cur.execute(f"ALTER SEQUENCE {seq} RESTART")  # seq is regclass text: quoted already
    for table, source, constraint in plan.leaf_deletes:
        # A routed leaf's TRUNCATE: only its rows, those satisfying its partition constraint (the source's
        # pg_get_partition_constraintdef, PostgreSQL syntax over the same column names). Its earlier changes
        # are void and keys include the partition key, so running it before the row changes is exact.
        try:
            cur.execute(sql.SQL("DELETE FROM {} WHERE {}").format(ident(table), sql.SQL(constraint)))
        except psycopg2.Error as exc:  # run_batch rolls back
            primary = (exc.diag.message_primary if exc.diag else None) or type(exc).__name__
            raise ApplyError(f"batch {format_lsn(plan.start_lsn)}-{format_lsn(plan.end_lsn)} not applied: TRUNCATE of "
                             f"leaf partition {source} cannot empty its rows of {table} by its partition constraint: "
                             f"[{exc.pgcode}] {primary}") from None
    return True


def finish_batch(cur: cursor, plan: BatchPlan, progress: str) -> None:
    """Deferred constraints checked now (against the batch's end state, while errors are still ours), then the watermark."""
    cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
    advance_watermarks(cur, progress, plan.slot, plan.watermark_tables, plan.end_lsn)


def run_batch(conn: connection, plan: BatchPlan, progress: str, result: BatchResult,
              apply_rows: Callable[[cursor], None],
              error: Callable[[psycopg2.Error], ApplyError]) -> BatchResult:
    """The exactly-once frame of a batch transaction, shared by the set-based apply and the ordered replay.

    Lock + watermark re-read + truncates (``begin_batch``; an applied batch returns unapplied),
    ``apply_rows(cursor)``, deferred constraints + watermark (``finish_batch``), commit. Any error
    rolls everything back; database errors are raised as ``error(exc)`` without their DETAIL.
    """
    try:
        with conn.cursor() as cur:
            if not begin_batch(cur, plan, progress):
                conn.rollback()
                return result
            apply_rows(cur)
            finish_batch(cur, plan, progress)
        conn.commit()
        result.applied = True
        return result
    except psycopg2.Error as exc:
        conn.rollback()
        raise error(exc) from None
    except BaseException:
        conn.rollback()
        raise


def batch_error(plan: BatchPlan, exc: psycopg2.Error, *, where: str = "", table: str | None = None,
                lsn: int | None = None) -> ApplyError:
    """The typed error for a failed batch: primary message and constraint name only.

    message_primary names tables and constraints; DETAIL carries key values, so neither it nor the driver
    exception (whose text includes DETAIL) may reach what Airflow logs — raise this ``from None``.
    """
    diag = exc.diag
    primary = (diag.message_primary if diag else None) or type(exc).__name__
    text = f"batch {format_lsn(plan.start_lsn)}-{format_lsn(plan.end_lsn)} not applied: {where}[{exc.pgcode}] {primary}"
    if not (exc.pgcode or "").startswith("23"):
        return ApplyError(text)
    if table is None and diag and diag.table_name:
        table = f"{diag.schema_name or 'public'}.{diag.table_name}"
    return ConstraintViolationError(text, table=table, lsn=lsn, constraint=(diag.constraint_name or None) if diag
                                    else None, sqlstate=exc.pgcode)
