"""Set-based apply of one batch's net changes: one statement per table and step, in FK order, in one transaction.

The fast path. It cannot reproduce a native subscriber when the order of changes matters — a
constraint that an intermediate state satisfies and the net statements do not (a unique value
freed and reused, a child re-pointed before its parent goes), or an unchanged-TOAST value that
travelled along a key-change chain — and then raises ``OrderedReplayNeeded`` for ``ordered.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
from psycopg2 import sql
from psycopg2.extensions import connection, cursor

from airflow_provider_pglogical.apply.targets.postgres.catalog import ident
from airflow_provider_pglogical.apply.targets.postgres.frame import batch_error, run_batch
from airflow_provider_pglogical.apply.targets.postgres.plan import (
    KEEP,
    LSN,
    OP,
    TOAST_REASON,
    TOUCHED,
    BatchPlan,
    BatchResult,
    TablePlan,
    from_column,
)
from airflow_provider_pglogical.exceptions import ApplyError, UnresolvableToastError, format_lsn
from airflow_provider_pglogical.hooks.cursor import one_row

# Violations whose outcome depends on the order rows are written in (RESTRICT FKs raise 23001). CHECK and
# NOT NULL judge one row's final values, which both paths write alike, so they fail either way.
ORDER_DEPENDENT = frozenset({"23505", "23503", "23P01", "23001"})


class OrderedReplayNeeded(Exception):  # noqa: N818 - a signal to the runner, not an error
    """The set-based apply cannot reproduce the native result of this batch; its transaction was rolled back."""


@contextmanager
def key_ordered_joins(cur: cursor, t: TablePlan) -> Iterator[None]:
    """The statements inside join staging to the target walking the target's key index (merge or nested loop),
    not through a hash table, when the target has a unique index on the key.

    Why: a hash join that does not fit ``work_mem`` splits both sides into batches and emits the joined rows
    batch by batch, so an UPDATE or DELETE of millions of rows visits the target's pages in random order and
    thrashes shared buffers. Measured on a 5.7M-row target, 2.86M staged updates: 50.4 s with the default 4 MB
    ``work_mem`` hash join, 26.6 s merge join, 24.5 s index nested loop (docs/performance.md). Small batches
    were planned as nested loops anyway. Without such an index a hash join stays the only sane plan.
    """
    if not t.key_indexed:
        yield
        return
    cur.execute("SELECT current_setting('enable_hashjoin'), set_config('enable_hashjoin', 'off', true)")
    (before, _) = one_row(cur)
    yield  # an error aborts the transaction, whose rollback ends the SET LOCAL: restore only on success
    cur.execute("SELECT set_config('enable_hashjoin', %s, true)", (before,))


def _key_match(t: TablePlan, left: str, right: str) -> sql.Composable:
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{}{}{}.{}").format(sql.Identifier(left), sql.Identifier(k), sql.SQL(t.key_equals),
                                       sql.Identifier(right), sql.Identifier(k)) for k in t.key)


def _exists_in_target(t: TablePlan) -> sql.Composable:
    return sql.SQL("EXISTS (SELECT 1 FROM {} t WHERE {})").format(ident(t.target), _key_match(t, "t", "s"))


def _moved_toast_needs_order(cur: cursor, t: TablePlan) -> bool:
    """Whether a row that arrived by a key change needs unchanged-TOAST values the target row at its old key
    cannot give: that row is not there (inserted or moved in earlier in the batch, or truncated) or it changed
    in the batch before moving (``_pgl_touched``). Only replaying the chain of changes finds the value.

    A join and an uncorrelated IN rather than correlated EXISTS: those made the planner estimate a huge
    cost and JIT-compile a query that reads nothing in the common case (0.15 s per batch).
    """
    old_key = [sql.SQL("s.{}").format(sql.Identifier(from_column(i))) for i in range(len(t.key))]
    cur.execute(sql.SQL(
        "SELECT EXISTS (SELECT FROM {stg} s LEFT JOIN {tgt} t ON {at_old} WHERE s.{op} IN ('I', 'R') "
        "AND cardinality(s.{keep}) > 0 AND {old0} IS NOT NULL AND (t.ctid IS NULL "
        "OR ({old}) IN (SELECT {key} FROM {stg} f WHERE f.{touched})))").format(
        stg=ident(t.staging_table), tgt=ident(t.target), op=sql.Identifier(OP), keep=sql.Identifier(KEEP),
        at_old=sql.SQL(" AND ").join(sql.SQL("t.{}{}{}").format(sql.Identifier(k), sql.SQL(t.key_equals), o)
                                     for k, o in zip(t.key, old_key, strict=True)),
        old0=old_key[0], old=sql.SQL(", ").join(old_key),
        key=sql.SQL(", ").join(sql.SQL("f.{}").format(sql.Identifier(k)) for k in t.key),
        touched=sql.Identifier(TOUCHED)))
    return bool(one_row(cur)[0])


def _fill_from_moved_rows(cur: cursor, t: TablePlan) -> None:
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
    match = sql.SQL(" AND ").join(sql.SQL("t.{}{}s.{}").format(sql.Identifier(k), sql.SQL(t.key_equals),
                                                               sql.Identifier(from_column(i)))
                                  for i, k in enumerate(t.key))
    cur.execute(sql.SQL("UPDATE {stg} s SET {sets}, {keep} = '{{}}' FROM {tgt} t WHERE s.{op} IN ('I', 'R') "
                        "AND cardinality(s.{keep}) > 0 AND {m}").format(
        stg=ident(t.staging_table), sets=sets, keep=sql.Identifier(KEEP), tgt=ident(t.target), op=sql.Identifier(OP),
        m=match))


def _apply_table_rows(cur: cursor, plan: BatchPlan, t: TablePlan, rejects: str, counters: dict[str, int]) -> None:
    """Conflict/TOAST checks, then UPDATE of existing rows and INSERT of new ones (deletes done earlier)."""
    stg, tgt = ident(t.staging_table), ident(t.target)
    cols = sql.SQL(", ").join(map(sql.Identifier, t.columns))
    scols = sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(c)) for c in t.columns)
    if not t.key:  # keyless, insert-only: append every INSERT (the runner refused UPDATE/DELETE)
        cur.execute(sql.SQL("INSERT INTO {tgt} ({cols}) SELECT {scols} FROM {stg} s WHERE s.{op} = 'I'").format(
            tgt=tgt, cols=cols, scols=scols, stg=stg, op=sql.Identifier(OP)))
        counters["inserted"] = cur.rowcount
        return
    exists = _exists_in_target(t)
    unresolved = sql.SQL("s.{op} IN ('I', 'R') AND cardinality(s.{keep}) > 0 AND (s.{op} = 'R' OR NOT {ex})").format(
        op=sql.Identifier(OP), keep=sql.Identifier(KEEP), ex=exists)
    n = 0
    if t.may_keep and t.may_have("I", "R"):
        cur.execute(sql.SQL("SELECT count(*), min(s.{lsn}), max(s.{lsn}) FROM {stg} s WHERE {u}").format(
            lsn=sql.Identifier(LSN), stg=stg, u=unresolved))
        n, lo, hi = one_row(cur)
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
    if t.conflict == "strict" and t.may_have("I"):
        cur.execute(sql.SQL("SELECT count(*) FROM {} s WHERE s.{} = 'I' AND {}").format(
            stg, sql.Identifier(OP), exists))
        (conflicts,) = one_row(cur)
        if conflicts:
            raise ApplyError(f"{conflicts} INSERT(s) into {t.target} hit an existing key (conflict policy strict); "
                             f"batch {format_lsn(plan.start_lsn)}-{format_lsn(plan.end_lsn)} not applied")
    values = [c for c in t.columns if c not in t.key]
    if values:
        counters["updated"] = 0
    counters["inserted"] = 0
    if values and t.may_have("U", "I"):
        sets = sql.SQL(", ").join(
            sql.SQL("{c} = CASE WHEN {name} = ANY(s.{keep}) THEN t.{c} ELSE s.{c} END").format(
                c=sql.Identifier(c), name=sql.Literal(c), keep=sql.Identifier(KEEP)) for c in values)
        with key_ordered_joins(cur, t):
            cur.execute(sql.SQL("UPDATE {tgt} t SET {sets} FROM {stg} s WHERE s.{op} IN ('U', 'I') AND {m}").format(
                tgt=tgt, sets=sets, stg=stg, op=sql.Identifier(OP), m=_key_match(t, "t", "s")))
            counters["updated"] = cur.rowcount
    if t.may_have("I", "R"):
        cur.execute(sql.SQL("INSERT INTO {tgt} ({cols}) SELECT {scols} FROM {stg} s WHERE s.{op} IN ('I', 'R') "
                            "AND cardinality(s.{keep}) = 0 AND NOT {ex}").format(
            tgt=tgt, cols=cols, scols=scols, stg=stg, op=sql.Identifier(OP), keep=sql.Identifier(KEEP), ex=exists))
        counters["inserted"] = cur.rowcount
    counters["skipped_missing_update"] = _missing_updates(cur, t, counters, values=bool(values))


def _missing_updates(cur: cursor, t: TablePlan, counters: dict[str, int], *, values: bool) -> int:
    """UPDATEs whose row the target does not have (skipped, as a native subscriber skips them).

    From the counts when they determine it: with every staged op counted, no ``R`` row and no keep list, each
    staged key is one row; the UPDATE matched the ``U`` rows found plus the ``I`` rows whose key existed, and
    the INSERT wrote every other ``I`` row, so the ``U`` rows not found are ``U - (updated - (I - inserted))``.
    Otherwise an anti-join of the staged ``U`` rows.
    """
    if not t.may_have("U"):
        return 0
    if t.staged_ops is not None and values and not t.may_have("R") and not t.may_keep:
        inserts_matched = t.staged_ops.get("I", 0) - counters["inserted"]
        return t.staged_ops["U"] - (counters["updated"] - inserts_matched)
    cur.execute(sql.SQL("SELECT count(*) FROM {} s WHERE s.{} = 'U' AND NOT {}").format(
        ident(t.staging_table), sql.Identifier(OP), _exists_in_target(t)))
    return int(one_row(cur)[0])


def apply_batch(conn: connection, plan: BatchPlan, *, progress: str, rejects: str) -> BatchResult:
    """One transaction: truncates, deletes (children first), upserts (parents first), watermark.

    Idempotent under replay: the watermark is re-read under a per-slot advisory lock inside the
    transaction, and a batch whose end_lsn is not beyond it changes nothing. Raises
    ``OrderedReplayNeeded`` (after rolling back) when only the change-by-change replay gets the native
    result: an order-dependent violation, or unchanged-TOAST values along a key-change chain.
    """
    staged = [t for t in plan.tables if t.staging is not None]
    keyed = [t for t in staged if t.key]  # keyless tables are insert-only: nothing to match, move or delete

    def apply_rows(cur: cursor) -> None:
        for t in keyed:
            if t.may_keep and t.may_have("I", "R") and _moved_toast_needs_order(cur, t):
                raise OrderedReplayNeeded(f"unchanged TOAST values of {t.target} moved along a key-change chain")
        try:
            for t in keyed:
                if t.may_keep and t.may_have("I", "R"):
                    _fill_from_moved_rows(cur, t)
            for t in reversed(keyed):
                deleted = 0
                if t.may_have("D", "R"):
                    with key_ordered_joins(cur, t):
                        cur.execute(sql.SQL("DELETE FROM {tgt} t USING {stg} s WHERE s.{op} IN ('D', 'R') AND {m}")
                                    .format(tgt=ident(t.target), stg=ident(t.staging_table), op=sql.Identifier(OP),
                                            m=_key_match(t, "t", "s")))
                        deleted = cur.rowcount
                result.rows.setdefault(t.target, {})["deleted"] = deleted
            for t in staged:
                _apply_table_rows(cur, plan, t, rejects, result.rows.setdefault(t.target, {}))
        except psycopg2.Error as exc:
            if exc.pgcode in ORDER_DEPENDENT:
                raise OrderedReplayNeeded(f"set-based apply hit [{exc.pgcode}] "
                                          f"{exc.diag.constraint_name or exc.diag.message_primary}") from None
            raise

    result = BatchResult(applied=False)
    return run_batch(conn, plan, progress, result, apply_rows, lambda exc: batch_error(plan, exc))
