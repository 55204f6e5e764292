"""Ordered replay: a batch applied change by change in commit order, like the native apply worker.

The runner falls back to it when ``setbased.apply_batch`` raises ``OrderedReplayNeeded``. The
batch's un-netted changes (filtered, projected, truncate-voided) of every table are COPYed by the
executors into one unlogged table per target table, through the same COPY path as the net changes.
One PL/pgSQL DO block then merges those tables by (commit_lsn, tx_order) — tables interleave
exactly as on the source, which FKs between them need — and runs a few static statements per
change. Server-side because rows never cross the network again, there is one round trip per batch,
and PL/pgSQL caches the plan of each static statement across the loop; the driver alternative
would ship every row (TOAST values included) back and forth or re-plan dynamic SQL per change.

Semantics per change, as the native apply worker: INSERT (an existing key: UPDATE under ``upsert``,
error under ``strict``); UPDATE matched by its old key, moving the row when the key changes, with
unchanged-TOAST columns left unassigned so their values travel with the row; DELETE by key; an
UPDATE or DELETE that finds no row is skipped and counted. An INSERT with unchanged-TOAST columns
and no row to take them from goes to the rejects table or fails, by policy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

import psycopg2
from psycopg2 import sql
from psycopg2.extensions import connection, cursor

from airflow_provider_pglogical.apply.targets.base import COMMIT, ORDER
from airflow_provider_pglogical.apply.targets.postgres.catalog import TargetTable, ident
from airflow_provider_pglogical.apply.targets.postgres.frame import batch_error, run_batch
from airflow_provider_pglogical.apply.targets.postgres.plan import (
    KEEP,
    LSN,
    OP,
    TOAST_REASON,
    BatchPlan,
    BatchResult,
    TablePlan,
    from_column,
)
from airflow_provider_pglogical.exceptions import ApplyError, UnresolvableToastError, format_lsn
from airflow_provider_pglogical.hooks.cursor import one_row

# PL/pgSQL variables are named _pglv_*: never a staging column (_pgl_*), so no reference is ambiguous.
COUNTERS = ("inserted", "updated", "deleted", "rejected", "skipped_missing_update", "skipped_missing_delete")
TOAST_STATE, CONFLICT_STATE = "PGLT1", "PGLC1"  # our own SQLSTATEs, raised inside the replay
RESULT_SETTING = "airflow_pglogical.replay_counters"  # not "pglogical.": that prefix may be the extension's
_HINT = re.compile(r"pglogical-replay:(\d+):(-?\d+)")


def ordered_name(staging: str) -> str:
    return f"{staging}_o"


def ordered_columns(target: TargetTable, key: Sequence[str], columns: Sequence[str]) -> list[tuple[str, str]]:
    """(name, type) after the three meta columns: position, the key the change is matched by, the new values."""
    return ([(COMMIT, "bigint"), (ORDER, "bigint")] + [(from_column(i), target.columns[k]) for i, k in enumerate(key)]
            + [(c, target.columns[c]) for c in columns])


def _bump(counter: str, n: int) -> sql.Composable:
    return sql.SQL("_pglv_n_{c}[{n}] := _pglv_n_{c}[{n}] + 1;").format(c=sql.SQL(counter), n=sql.Literal(n))


def _change_block(i: int, t: TablePlan, plan: BatchPlan, rejects: str) -> sql.Composable:
    """Static statements applying one change (record ``_pglv_r<i>``) to table ``t``."""
    r, n = sql.Identifier(f"_pglv_r{i}"), i + 1

    def rec(c: str) -> sql.Composable:
        return sql.SQL("{}.{}").format(r, sql.Identifier(c))

    if not t.key:  # keyless, insert-only (the runner refused its UPDATE/DELETE): append
        return sql.SQL("\n      INSERT INTO {tgt} ({cols}) VALUES ({vals}); {inserted}").format(
            tgt=ident(t.target), cols=sql.SQL(", ").join(sql.Identifier(c) for c in t.columns),
            vals=sql.SQL(", ").join(rec(c) for c in t.columns), inserted=_bump("inserted", n))

    def tgt(c: str) -> sql.Composable:
        return sql.SQL("_pgl_t.{}").format(sql.Identifier(c))

    def both(pairs: Iterable[sql.Composable], sep: str) -> sql.Composable:
        return sql.SQL(sep).join(pairs)

    equals = sql.SQL(t.key_equals)  # NULL = NULL for a REPLICA IDENTITY FULL table matched by every column
    at_old = both([sql.SQL("{}{}{}").format(tgt(k), equals, rec(from_column(j))) for j, k in enumerate(t.key)], " AND ")
    at_new = both([sql.SQL("{}{}{}").format(tgt(k), equals, rec(k)) for k in t.key], " AND ")
    values = [c for c in t.columns if c not in t.key]
    set_values = [sql.SQL("{c} = CASE WHEN {name} = ANY({keep}) THEN {old} ELSE {new} END").format(
        c=sql.Identifier(c), name=sql.Literal(c), keep=rec(KEEP), old=tgt(c), new=rec(c)) for c in values]
    set_keys = [sql.SQL("{} = {}").format(sql.Identifier(k), rec(k)) for k in t.key]
    # A key-only table still runs the UPDATE, so a missing row is found out and counted.
    set_same = set_values or [sql.SQL("{} = {}").format(sql.Identifier(t.key[0]), tgt(t.key[0]))]
    strict = t.conflict == "strict"
    on_taken_key = (sql.SQL("RAISE EXCEPTION USING ERRCODE = {}, MESSAGE = 'key change onto an existing key "
                            "(conflict policy strict)';").format(sql.Literal(CONFLICT_STATE)) if strict
                    else sql.SQL("DELETE FROM {} AS _pgl_t WHERE {};").format(ident(t.target), at_new))
    on_existing = (sql.SQL("RAISE EXCEPTION USING ERRCODE = {}, MESSAGE = 'INSERT hit an existing key "
                           "(conflict policy strict)';").format(sql.Literal(CONFLICT_STATE)) if strict
                   else sql.SQL("UPDATE {} AS _pgl_t SET {} WHERE {}; {}").format(
                       ident(t.target), both(set_same, ", "), at_new, _bump("updated", n)))
    if t.unchanged_toast == "fail":
        no_toast = sql.SQL("RAISE EXCEPTION USING ERRCODE = {}, MESSAGE = 'unchanged TOAST value unavailable';").format(
            sql.Literal(TOAST_STATE))
    else:
        no_toast = sql.SQL(
            "INSERT INTO {rej} (slot, table_name, lsn, reason, key) VALUES ({slot}, {table}, "
            "'0/0'::pg_lsn + {lsn}::numeric, {reason}, jsonb_build_object({key})); {bump}").format(
            rej=ident(rejects), slot=sql.Literal(plan.slot), table=sql.Literal(t.target), lsn=rec(LSN),
            reason=sql.Literal(TOAST_REASON), bump=_bump("rejected", n),
            key=both([sql.SQL("{}, {}").format(sql.Literal(k), rec(k)) for k in t.key], ", "))
    return sql.SQL("""
      IF {kind} = 'D' THEN
        DELETE FROM {tgt} AS _pgl_t WHERE {at_old};
        IF FOUND THEN {deleted} ELSE {missing_delete} END IF;
      ELSIF {kind} = 'U' AND ROW({new_key}) IS NOT DISTINCT FROM ROW({old_key}) THEN
        UPDATE {tgt} AS _pgl_t SET {set_same} WHERE {at_old};
        IF FOUND THEN {updated} ELSE {missing_update} END IF;
      ELSIF {kind} = 'U' THEN
        IF NOT EXISTS (SELECT FROM {tgt} AS _pgl_t WHERE {at_old}) THEN {missing_update}
        ELSE
          IF EXISTS (SELECT FROM {tgt} AS _pgl_t WHERE {at_new}) THEN {on_taken_key} END IF;
          UPDATE {tgt} AS _pgl_t SET {set_move} WHERE {at_old}; {updated}
        END IF;
      ELSIF EXISTS (SELECT FROM {tgt} AS _pgl_t WHERE {at_new}) THEN {on_existing}
      ELSIF cardinality({keep}) > 0 THEN {no_toast}
      ELSE
        INSERT INTO {tgt} ({cols}) VALUES ({vals}); {inserted}
      END IF;""").format(
        kind=rec(OP), tgt=ident(t.target), at_old=at_old, at_new=at_new, keep=rec(KEEP),
        new_key=both([rec(k) for k in t.key], ", "), old_key=both([rec(from_column(j)) for j in range(len(t.key))], ", "),
        set_same=both(set_same, ", "), set_move=both(set_keys + set_values, ", "),
        on_taken_key=on_taken_key, on_existing=on_existing, no_toast=no_toast,
        cols=both([sql.Identifier(c) for c in t.columns], ", "), vals=both([rec(c) for c in t.columns], ", "),
        deleted=_bump("deleted", n), missing_delete=_bump("skipped_missing_delete", n), updated=_bump("updated", n),
        missing_update=_bump("skipped_missing_update", n), inserted=_bump("inserted", n))


def replay_block(plan: BatchPlan, tables: Sequence[TablePlan], rejects: str) -> sql.Composable:
    """The DO block: merge the tables' changes in commit order, apply each; counters via a transaction-local setting.

    Errors are re-raised with their SQLSTATE, primary message and constraint, plus a hint naming the
    table and LSN of the change (DETAIL, which holds row values, is dropped).
    """
    stg = [ident(ordered_name(t.staging_table)) for t in tables]
    merged = sql.SQL(" UNION ALL ").join(
        sql.SQL("SELECT {i} AS t, {c} AS c, {o} AS o, {lsn} AS l, ctid AS id FROM {s}").format(
            i=sql.Literal(i), c=sql.Identifier(COMMIT), o=sql.Identifier(ORDER), lsn=sql.Identifier(LSN), s=s)
        for i, s in enumerate(stg))
    dispatch = sql.SQL("\n    ELS").join(
        sql.SQL("IF _pglv_ev.t = {i} THEN\n      SELECT * INTO _pglv_r{i} FROM {s} WHERE ctid = _pglv_ev.id;{block}").format(
            i=sql.Literal(i), s=s, block=_change_block(i, t, plan, rejects)) for i, (t, s) in enumerate(zip(tables, stg, strict=True)))
    return sql.SQL("""
DECLARE
  _pglv_ev record;
  {records}
  {counters}
  _pglv_tab int := 0;
  _pglv_lsn bigint := -1;
  _pglv_state text; _pglv_msg text; _pglv_con text;
BEGIN
  FOR _pglv_ev IN {merged} ORDER BY c, o, l LOOP
    _pglv_tab := _pglv_ev.t;
    _pglv_lsn := _pglv_ev.l;
    {dispatch}
    END IF;
  END LOOP;
  PERFORM set_config({setting}, json_build_array({results})::text, true);
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS _pglv_state = RETURNED_SQLSTATE, _pglv_msg = MESSAGE_TEXT, _pglv_con = CONSTRAINT_NAME;
  RAISE EXCEPTION USING ERRCODE = _pglv_state, MESSAGE = _pglv_msg, CONSTRAINT = coalesce(_pglv_con, ''),
    HINT = 'pglogical-replay:' || _pglv_tab || ':' || _pglv_lsn;
END""").format(
        records=sql.SQL("\n  ").join(sql.SQL("_pglv_r{} {}%ROWTYPE;").format(sql.Literal(i), s) for i, s in enumerate(stg)),
        counters=sql.SQL("\n  ").join(sql.SQL("_pglv_n_{} bigint[] := array_fill(0::bigint, ARRAY[{}]);").format(
            sql.SQL(c), sql.Literal(len(tables))) for c in COUNTERS),
        merged=merged, dispatch=dispatch, setting=sql.Literal(RESULT_SETTING),
        results=sql.SQL(", ").join(sql.SQL("_pglv_n_{}").format(sql.SQL(c)) for c in COUNTERS))


def _replay_error(plan: BatchPlan, tables: Sequence[TablePlan], exc: psycopg2.Error) -> ApplyError:
    found = _HINT.fullmatch((exc.diag.message_hint if exc.diag else None) or "")
    if found is None or int(found[2]) < 0:  # before the replay (locks, truncates) or after it (deferred constraints)
        return batch_error(plan, exc)
    table, lsn = tables[int(found[1])].target, int(found[2])
    where = f"change at LSN {format_lsn(lsn)} of {table}"
    if exc.pgcode == TOAST_STATE:
        return UnresolvableToastError(
            f"batch {format_lsn(plan.start_lsn)}-{format_lsn(plan.end_lsn)} not applied: the {where} needs an "
            "unchanged TOAST value that exists neither in the target, nor in the old image, nor earlier in the batch")
    constraint = f" violates {exc.diag.constraint_name}" if exc.diag.constraint_name else ""
    return batch_error(plan, exc, where=f"applied change by change in commit order, the {where}{constraint}: ",
                       table=table, lsn=lsn)


def apply_ordered(conn: connection, plan: BatchPlan, *, progress: str, rejects: str) -> BatchResult:
    """The batch in one transaction, change by change: truncates, the replay, deferred constraints, watermark.

    The tables' changes must be in their ``ordered_name`` staging tables. Same exactly-once frame as
    the set-based apply (watermark re-read under the slot lock); on any error nothing is written.
    """
    result = BatchResult(applied=False, ordered=True)
    tables = [t for t in plan.tables if t.staging is not None]

    def apply_rows(cur: cursor) -> None:
        if not tables:
            return
        cur.execute(sql.SQL("DO {}").format(sql.Literal(replay_block(plan, tables, rejects).as_string(cur))))
        cur.execute("SELECT current_setting(%s)", (RESULT_SETTING,))
        for name, per_table in zip(COUNTERS, json.loads(one_row(cur)[0]), strict=True):
            for t, count in zip(tables, per_table, strict=True):
                result.rows.setdefault(t.target, {})[name] = count

    return run_batch(conn, plan, progress, result, apply_rows, lambda exc: _replay_error(plan, tables, exc))
