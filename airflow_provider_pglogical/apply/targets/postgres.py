"""PostgreSQL target: catalog lookups, per-batch unlogged staging tables filled by COPY, one apply transaction per batch.

Crash windows: executors COPY into unlogged staging tables first (nothing visible yet; a crash
leaves only staging tables, which the next run drops and refills). The apply transaction then
does the truncates, deletes and upserts *and* moves the watermark in ``pglogical_progress``;
a crash before COMMIT leaves the target untouched, a crash after COMMIT makes the next run skip
the batch (end_lsn ≤ watermark) and just drop the leftover staging tables.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import psycopg2
import pyarrow as pa
from psycopg2 import sql

from airflow_provider_pglogical.exceptions import ApplyError, UnresolvableToastError, format_lsn

OP, KEEP, LSN = "_pgl_kind", "_pgl_keep", "_pgl_lsn"
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


@dataclass
class BatchResult:
    applied: bool
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # target -> counters


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
    """(name, type) after the three meta columns: the moved-from key, then the written columns."""
    return [(from_column(i), target.columns[k]) for i, k in enumerate(key)] + [(c, target.columns[c]) for c in columns]


def create_staging(conn, staging: str, target: TargetTable, key: Sequence[str], columns: Sequence[str]) -> None:
    """A fresh unlogged table: op, keep list, lsn, moved-from key, then the written columns (target types, no constraints)."""
    defs = [sql.SQL("{} text, {} text[], {} bigint").format(*map(sql.Identifier, (OP, KEEP, LSN)))]
    defs += [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in staging_columns(target, key, columns)]
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
    finally:
        conn.close()
    return total


def copy_partitions(dsn: str, staging: str, columns: Sequence[str]) -> Callable[[Iterator[pa.RecordBatch]],
                                                                               Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: each partition's lines (Arrow batches, no pickling) COPYed; yields its count."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        lines = (line for b in batches for line in b.column(0).to_pylist())
        yield pa.RecordBatch.from_pydict({"rows": [copy_rows(dsn, staging, columns, lines)]},
                                         schema=pa.schema([("rows", pa.int64())]))

    return run


def _key_match(key: Sequence[str], left: str, right: str) -> sql.Composable:
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{} = {}.{}").format(sql.Identifier(left), sql.Identifier(k), sql.Identifier(right),
                                        sql.Identifier(k)) for k in key)


def _exists_in_target(t: TablePlan) -> sql.Composable:
    return sql.SQL("EXISTS (SELECT 1 FROM {} t WHERE {})").format(ident(t.target), _key_match(t.key, "t", "s"))


def _fill_from_moved_rows(cur, t: TablePlan) -> None:
    """Unchanged-TOAST values of rows that arrived by a key change, from the target row at the old key.

    Runs after the truncates (a truncated row is no source) and before the deletes (which remove
    the old key's row).
    """
    values = [c for c in t.columns if c not in t.key]
    if not values:
        return
    sets = sql.SQL(", ").join(
        sql.SQL("{c} = CASE WHEN {name} = ANY(s.{keep}) THEN t.{c} ELSE s.{c} END").format(
            c=sql.Identifier(c), name=sql.Literal(c), keep=sql.Identifier(KEEP)) for c in values)
    match = sql.SQL(" AND ").join(sql.SQL("t.{} = s.{}").format(sql.Identifier(k), sql.Identifier(from_column(i)))
                                  for i, k in enumerate(t.key))
    cur.execute(sql.SQL("UPDATE {stg} s SET {sets}, {keep} = '{{}}' FROM {tgt} t WHERE s.{op} IN ('I', 'R') "
                        "AND cardinality(s.{keep}) > 0 AND {m}").format(
        stg=ident(t.staging), sets=sets, keep=sql.Identifier(KEEP), tgt=ident(t.target), op=sql.Identifier(OP),
        m=match))


def _apply_table_rows(cur, plan: BatchPlan, t: TablePlan, rejects: str, counters: dict[str, int]) -> None:
    """Conflict/TOAST checks, then UPDATE of existing rows and INSERT of new ones (deletes done earlier)."""
    stg, tgt = ident(t.staging), ident(t.target)
    exists = _exists_in_target(t)
    unresolved = sql.SQL("s.{op} IN ('I', 'R') AND cardinality(s.{keep}) > 0 AND (s.{op} = 'R' OR NOT {ex})").format(
        op=sql.Identifier(OP), keep=sql.Identifier(KEEP), ex=exists)
    cur.execute(sql.SQL("SELECT count(*), min(s.{lsn}), max(s.{lsn}) FROM {stg} s WHERE {u}").format(
        lsn=sql.Identifier(LSN), stg=stg, u=unresolved))
    n, lo, hi = cur.fetchone()
    if n:
        if t.unchanged_toast == "fail":
            raise UnresolvableToastError(
                f"{n} row(s) of {t.target} need unchanged TOAST values that exist neither in the target nor in "
                f"the old image (LSN {format_lsn(lo)}..{format_lsn(hi)}); batch {format_lsn(plan.start_lsn)}-"
                f"{format_lsn(plan.end_lsn)} not applied")
        key_json = sql.SQL(", ").join(sql.SQL("{}, s.{}").format(sql.Literal(k), sql.Identifier(k)) for k in t.key)
        cur.execute(sql.SQL(
            "WITH r AS (DELETE FROM {stg} s WHERE {u} RETURNING s.*) INSERT INTO {rej} "
            "(slot, table_name, lsn, reason, key) SELECT %s, %s, '0/0'::pg_lsn + s.{lsn}::numeric, %s, "
            "jsonb_build_object({kj}) FROM r s").format(
                stg=stg, u=unresolved, rej=ident(rejects), lsn=sql.Identifier(LSN), kj=key_json),
            (plan.slot, t.target, TOAST_REASON))
        counters["rejected"] = cur.rowcount
    if t.conflict == "strict":
        cur.execute(sql.SQL("SELECT count(*) FROM {} s WHERE s.{} = 'I' AND {}").format(
            stg, sql.Identifier(OP), exists))
        (conflicts,) = cur.fetchone()
        if conflicts:
            raise ApplyError(f"{conflicts} INSERT(s) into {t.target} hit an existing key (conflict policy strict); "
                             f"batch {format_lsn(plan.start_lsn)}-{format_lsn(plan.end_lsn)} not applied")
    values = [c for c in t.columns if c not in t.key]
    if values:
        sets = sql.SQL(", ").join(
            sql.SQL("{c} = CASE WHEN {name} = ANY(s.{keep}) THEN t.{c} ELSE s.{c} END").format(
                c=sql.Identifier(c), name=sql.Literal(c), keep=sql.Identifier(KEEP)) for c in values)
        cur.execute(sql.SQL("UPDATE {tgt} t SET {sets} FROM {stg} s WHERE s.{op} IN ('U', 'I') AND {m}").format(
            tgt=tgt, sets=sets, stg=stg, op=sql.Identifier(OP), m=_key_match(t.key, "t", "s")))
        counters["updated"] = cur.rowcount
    cols = sql.SQL(", ").join(map(sql.Identifier, t.columns))
    scols = sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(c)) for c in t.columns)
    cur.execute(sql.SQL("INSERT INTO {tgt} ({cols}) SELECT {scols} FROM {stg} s WHERE s.{op} IN ('I', 'R') "
                        "AND cardinality(s.{keep}) = 0 AND NOT {ex}").format(
        tgt=tgt, cols=cols, scols=scols, stg=stg, op=sql.Identifier(OP), keep=sql.Identifier(KEEP), ex=exists))
    counters["inserted"] = cur.rowcount
    cur.execute(sql.SQL("SELECT count(*) FROM {} s WHERE s.{} = 'U' AND NOT {}").format(
        stg, sql.Identifier(OP), exists))
    counters["skipped_missing_update"] = cur.fetchone()[0]


def apply_batch(conn, plan: BatchPlan, *, progress: str, rejects: str) -> BatchResult:
    """One transaction: truncates, deletes (children first), upserts (parents first), watermark.

    Idempotent under replay: the watermark is re-read under a per-slot advisory lock inside the
    transaction, and a batch whose end_lsn is not beyond it changes nothing.
    """
    result = BatchResult(applied=False)
    try:
        with conn.cursor() as cur:
            # Same key as the run's session lock: re-entrant here, and it serialises other writers.
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (_lock_key(plan.slot),))
            marks = watermarks(conn, progress, plan.slot)
            if all(marks.get(t, -1) >= plan.end_lsn for t in plan.watermark_tables):
                conn.rollback()
                return result
            if plan.truncate:
                cur.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(map(ident, plan.truncate))))
                for table in plan.restart_identity:
                    # What TRUNCATE ... RESTART IDENTITY does, for a subset of one statement's tables.
                    cur.execute("SELECT s.oid::regclass::text FROM pg_depend d JOIN pg_class s ON s.oid = d.objid "
                                "WHERE d.refobjid = %s::regclass AND d.deptype IN ('a', 'i') AND s.relkind = 'S'",
                                (ident(table).as_string(conn),))
                    for (seq,) in cur.fetchall():
                        cur.execute(f"ALTER SEQUENCE {seq} RESTART")  # seq is regclass text: quoted already
            for t in plan.tables:
                if t.staging is not None:
                    _fill_from_moved_rows(cur, t)
            for t in reversed(plan.tables):
                counters = result.rows.setdefault(t.target, {})
                if t.staging is None:
                    continue
                cur.execute(sql.SQL("DELETE FROM {tgt} t USING {stg} s WHERE s.{op} IN ('D', 'R') AND {m}").format(
                    tgt=ident(t.target), stg=ident(t.staging), op=sql.Identifier(OP), m=_key_match(t.key, "t", "s")))
                counters["deleted"] = cur.rowcount
            for t in plan.tables:
                if t.staging is not None:
                    _apply_table_rows(cur, plan, t, rejects, result.rows[t.target])
            for table in plan.watermark_tables:
                cur.execute(sql.SQL(
                    "INSERT INTO {} AS p (slot, target_table, end_lsn) VALUES (%s, %s, '0/0'::pg_lsn + %s::numeric) "
                    "ON CONFLICT (slot, target_table) DO UPDATE SET end_lsn = EXCLUDED.end_lsn, applied_at = now() "
                    "WHERE p.end_lsn < EXCLUDED.end_lsn").format(ident(progress)),
                    (plan.slot, table, plan.end_lsn))
        conn.commit()
        result.applied = True
        return result
    except psycopg2.Error as exc:
        conn.rollback()
        # message_primary names tables and constraints; DETAIL carries key values, so neither it nor the
        # driver exception (whose text includes DETAIL) is chained into what Airflow logs.
        primary = exc.diag.message_primary if exc.diag else type(exc).__name__
        raise ApplyError(f"batch {format_lsn(plan.start_lsn)}-{format_lsn(plan.end_lsn)} not applied: "
                         f"[{exc.pgcode}] {primary}") from None
    except Exception:
        conn.rollback()
        raise
