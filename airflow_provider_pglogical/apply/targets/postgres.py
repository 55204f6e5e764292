"""PostgreSQL target: catalog lookups, per-batch unlogged staging tables filled by COPY, the frame of the apply transaction.

Crash windows: executors COPY into unlogged staging tables first (nothing visible yet; a crash
leaves only staging tables, which the next run drops and refills). The apply transaction then
does the truncates and the changes (``setbased.py``, or ``ordered.py`` change by change) *and*
moves the watermark in ``pglogical_progress``; a crash before COMMIT leaves the target untouched,
a crash after COMMIT makes the next run skip the batch (end_lsn ≤ watermark) and just drop the
leftover staging tables.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import pyarrow as pa
from psycopg2 import sql

from airflow_provider_pglogical.exceptions import ApplyError, ConstraintViolationError, format_lsn

OP, KEEP, LSN, TOUCHED = "_pgl_kind", "_pgl_keep", "_pgl_lsn", "_pgl_touched"
COPY_CHUNK_ROWS = 20000
TOAST_REASON = "unchanged TOAST value unavailable (not in the target, not in the old image)"


def split_name(qualified: str) -> tuple[str, str]:
    schema, _, name = qualified.rpartition(".")
    return (schema or "public", name)


def ident(qualified: str) -> sql.Composable:
    return sql.Identifier(*split_name(qualified))


@dataclass(frozen=True)
class TargetTable:
    qualified: str
    columns: dict[str, str]  # name -> format_type(), relation order
    primary_key: tuple[str, ...]


@dataclass
class TablePlan:
    """What one target table gets in one batch (built on the driver, executed in one transaction)."""

    source: str
    target: str
    key: tuple[str, ...]
    columns: tuple[str, ...]  # target columns written (key included)
    staging: str | None = None  # None: no row changes for this table in the batch
    conflict: str = "upsert"
    unchanged_toast: str = "fail"


@dataclass
class BatchPlan:
    slot: str
    start_lsn: int
    end_lsn: int
    tables: list[TablePlan]  # parents before children
    truncate: list[str] = field(default_factory=list)  # target tables, one TRUNCATE statement
    restart_identity: list[str] = field(default_factory=list)  # subset whose owned sequences restart
    watermark_tables: list[str] = field(default_factory=list)
    # Source schema changes the target follows (pg_schema.alter_statements), run first in the transaction.
    ddl: list[sql.Composable] = field(default_factory=list)


@dataclass
class BatchResult:
    applied: bool
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # target -> counters
    ordered: bool = False  # applied change by change (ordered.py) rather than set-based (setbased.py)


def connect(dsn: str):
    conn = psycopg2.connect(dsn)
    conn.autocommit = False
    return conn


def staging_name(slot: str, end_lsn: int, target: str) -> str:
    digest = hashlib.sha1(f"{slot}\0{target}".encode()).hexdigest()[:12]
    return f"public._pglogical_stg_{digest}_{end_lsn:016X}"


def _lock_key(slot: str) -> str:
    return f"pglogical-apply:{slot}"


def try_lock_slot(conn, slot: str) -> bool:
    """Session-level advisory lock for a whole run (released when the connection closes)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (_lock_key(slot),))
        locked = cur.fetchone()[0]
    conn.commit()
    return bool(locked)


def describe(conn, qualified: str) -> TargetTable | None:
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
    return TargetTable(qualified, dict(cols), pk)


def create_table(conn, qualified: str, columns: Sequence[tuple[str, str]], key: Sequence[str]) -> None:
    """CREATE TABLE IF NOT EXISTS with exact staged PostgreSQL types, primary key = ``key``."""
    parts = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in columns]
    if key:
        parts.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, key))))
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(ident(qualified), sql.SQL(", ").join(parts)))


def foreign_keys(conn) -> list[tuple[str, str]]:
    """(child, parent) qualified-name pairs of every FK in the target database."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT cn.nspname || '.' || c.relname, pn.nspname || '.' || p.relname FROM pg_constraint k "
            "JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace cn ON cn.oid = c.relnamespace "
            "JOIN pg_class p ON p.oid = k.confrelid JOIN pg_namespace pn ON pn.oid = p.relnamespace "
            "WHERE k.contype = 'f'")
        return [(a, b) for a, b in cur.fetchall()]


def ensure_bookkeeping(conn, progress: str, rejects: str) -> None:
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


def watermarks(conn, progress: str, slot: str) -> dict[str, int]:
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT target_table, (end_lsn - '0/0'::pg_lsn)::bigint FROM {} WHERE slot = %s")
                    .format(ident(progress)), (slot,))
        return dict(cur.fetchall())


def from_column(i: int) -> str:
    return f"_pgl_from_{i}"


def staging_columns(target: TargetTable, key: Sequence[str], columns: Sequence[str]) -> list[tuple[str, str]]:
    """(name, type) after the three meta columns: the moved-from key, the touched flag, then the written columns."""
    return ([(from_column(i), target.columns[k]) for i, k in enumerate(key)] + [(TOUCHED, "boolean")]
            + [(c, target.columns[c]) for c in columns])


def create_staging(conn, staging: str, columns: Sequence[tuple[str, str]]) -> None:
    """A fresh unlogged table: op, keep list, lsn, then ``columns`` (name, type) — target types, no constraints.

    ``columns`` is ``staging_columns`` (net changes) or ``ordered.ordered_columns`` (ordered replay).
    """
    defs = [sql.SQL("{} text, {} text[], {} bigint").format(*map(sql.Identifier, (OP, KEEP, LSN)))]
    defs += [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns]
    with conn.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident(staging)))
        cur.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(ident(staging), sql.SQL(", ").join(defs)))
    conn.commit()


def drop_staging(conn, names: Iterable[str]) -> None:
    with conn.cursor() as cur:
        for name in names:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident(name)))
    conn.commit()


def drop_leftover_staging(conn) -> None:
    """Staging tables of batches a crashed run left behind (their batches are re-staged or skipped)."""
    with conn.cursor() as cur:
        cur.execute("SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname LIKE '\\_pglogical\\_stg\\_%%' "
                    "AND c.relkind = 'r'")
        for (name,) in cur.fetchall():
            cur.execute(f"DROP TABLE IF EXISTS {name}")  # name was quoted by quote_ident above
    conn.commit()


def copy_rows(dsn: str, staging: str, columns: Sequence[str], lines: Iterator[str]) -> int:
    """COPY ready text lines (``copytext.copy_lines``) into ``staging``; returns the row count.

    Columns are (kind, keep, lsn, *columns). Runs on executors; the DSN arrives in the task closure.
    """
    target = sql.SQL("COPY {} ({}) FROM STDIN").format(
        ident(staging), sql.SQL(", ").join(map(sql.Identifier, (OP, KEEP, LSN, *columns))))
    conn = psycopg2.connect(dsn)
    total = 0
    try:
        with conn.cursor() as cur:
            copy_sql = target.as_string(conn)
            while True:
                chunk = [line for _, line in zip(range(COPY_CHUNK_ROWS), lines, strict=False)]
                if not chunk:
                    break
                cur.copy_expert(copy_sql, io.StringIO("\n".join(chunk) + "\n"))
                total += len(chunk)
        conn.commit()
    except psycopg2.Error as exc:
        raise copy_error(staging, exc, total) from None
    finally:
        conn.close()
    return total


_QUOTED_VALUE = re.compile(r':\s*".*', re.S)
_COPY_POSITION = re.compile(r"line (\d+), column ([^:]+)")


def copy_error(staging: str, exc: psycopg2.Error, copied: int) -> ApplyError:
    """A COPY failure without the value that caused it (input-function messages quote it: ``…: "abc"``).

    Executor errors reach Spark's and Airflow's logs; like ``batch_error``, only the statement of
    the problem, its SQLSTATE and its position may go there, never row data.
    """
    diag = exc.diag
    primary = _QUOTED_VALUE.sub("", (diag.message_primary if diag else None) or type(exc).__name__)
    where = _COPY_POSITION.search((diag.context if diag else None) or "")
    position = f" (line {int(where.group(1)) + copied} of this partition, column {where.group(2)})" if where else ""
    return ApplyError(f"COPY into {staging} failed{position}: [{exc.pgcode}] {primary}")


def copy_partitions(dsn: str, staging: str, columns: Sequence[str]) -> Callable[[Iterator[pa.RecordBatch]],
                                                                               Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: each partition's lines (Arrow batches, no pickling) COPYed; yields its count."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        lines = (line for b in batches for line in b.column(0).to_pylist())
        yield pa.RecordBatch.from_pydict({"rows": [copy_rows(dsn, staging, columns, lines)]},
                                         schema=pa.schema([("rows", pa.int64())]))

    return run


def begin_batch(cur, plan: BatchPlan, progress: str) -> bool:
    """Lock the slot, re-read the watermark (False: already applied), follow schema changes, run the truncates."""
    # Same key as the run's session lock: re-entrant here, and it serialises other writers.
    cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (_lock_key(plan.slot),))
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
    return True


def finish_batch(cur, plan: BatchPlan, progress: str) -> None:
    """Deferred constraints checked now (against the batch's end state, while errors are still ours), then the watermark."""
    cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
    for table in plan.watermark_tables:
        cur.execute(sql.SQL(
            "INSERT INTO {} AS p (slot, target_table, end_lsn) VALUES (%s, %s, '0/0'::pg_lsn + %s::numeric) "
            "ON CONFLICT (slot, target_table) DO UPDATE SET end_lsn = EXCLUDED.end_lsn, applied_at = now() "
            "WHERE p.end_lsn < EXCLUDED.end_lsn").format(ident(progress)),
            (plan.slot, table, plan.end_lsn))


def run_batch(conn, plan: BatchPlan, progress: str, result: BatchResult, apply_rows: Callable[[Any], None],
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
