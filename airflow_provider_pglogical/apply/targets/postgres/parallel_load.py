"""A snapshot table the apply created, loaded by several COPY streams at once and swapped in by one transaction.

One ``COPY`` runs in one backend: on a large table it is the whole snapshot load's floor (parsing, heap and index
inserts, WAL on one core), where a native table sync is one COPY too. Several streams need several connections,
hence several transactions, and the serial load's promise must hold all the same: readers see the table before the
load or after it, never in between, and a crash leaves it as it was. For a table the apply itself created for the
snapshot (it did not exist: nobody's grants, views, foreign keys, triggers or indexes are on it yet), that holds
with a table built aside and swapped in:

1. a *load table* beside the staging tables (``<staging_prefix>…_load`` in the bookkeeping schema: the session's
   leftover cleanup knows it), with the target's columns and no index;
2. ``streams`` connections each COPY a contiguous share of the staged row groups into it and commit;
3. the target's primary key is built on it once the rows are in (one sorted, parallel index build instead of an
   index insert per row);
4. one transaction locks the created table, checks that it is still as created (empty, no other index, trigger,
   rule, policy, dependent object, comment or privilege than a new table of this role has), drops it, moves the
   load table into its place under its name and its key's name, and writes the watermark and sync LSN.

Crash windows (``CHECKPOINTS``): up to step 4's COMMIT the target is the empty table the apply created, without a sync
mark; the rerun loads it with the serial path (it no longer is a table this run created) and drops the load table.
After the COMMIT the sync mark makes the rerun skip it. A created table someone changed meanwhile (a grant, a view…)
is loaded by the serial path instead, so that nothing of theirs is dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg2
from psycopg2 import sql

from airflow_provider_pglogical.apply.targets.base import PlannedSnapshot, PlannedTable
from airflow_provider_pglogical.apply.targets.postgres.catalog import ident, split_name
from airflow_provider_pglogical.apply.targets.postgres.plan import staging_name
from airflow_provider_pglogical.apply.targets.postgres.progress import mark_synced, sync_marks

log = logging.getLogger(__name__)

# After every stream committed its share into the load table; after the key was built on it. The swap's own
# windows are the serial load's ``snapshot_before_commit`` / ``snapshot_committed``.
CHECKPOINTS = ("snapshot_streams_loaded", "snapshot_key_built")

Chunks = Callable[[], Iterator[bytes]]  # one stream's COPY text, chunk by chunk
CopyInto = Callable[[Any, str, Sequence[str], Iterator[bytes], Callable[[], None]], int]

# The created table is still as ``catalog.create_table`` made it: no rows, and nothing that points at it but its
# row type, its TOAST table and its primary key or NOT NULL constraints; owner, privileges and tablespace as those of
# the load table, which this role created just as fresh.
_UNTOUCHED = """
SELECT NOT EXISTS (SELECT 1 FROM {target})
   AND t.relowner = l.relowner AND t.relacl IS NOT DISTINCT FROM l.relacl AND t.reltablespace = l.reltablespace
   AND NOT t.relhasrules AND NOT t.relhastriggers AND NOT t.relrowsecurity AND t.relreplident = 'd'
   AND t.reloptions IS NULL AND obj_description(t.oid, 'pg_class') IS NULL
   AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.oid AND a.attnum > 0
                   AND (a.attacl IS NOT NULL OR col_description(t.oid, a.attnum) IS NOT NULL))
   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = t.oid
                   AND NOT (d.deptype = 'i' AND d.classid IN ('pg_type'::regclass, 'pg_class'::regclass))
                   AND NOT (d.deptype = 'a' AND d.classid = 'pg_constraint'::regclass
                            AND EXISTS (SELECT 1 FROM pg_constraint k WHERE k.oid = d.objid AND k.contype IN ('p', 'n'))))
FROM pg_class t, pg_class l WHERE t.oid = %(target)s::regclass AND l.oid = %(load)s::regclass
"""


def load_table_name(slot: str, lsn: int, target: str, schema: str) -> str:
    """The load table of ``target``'s snapshot at ``lsn`` (a staging table's name: the session drops leftovers)."""
    return staging_name(slot, lsn, target, schema) + "_load"


def drop_leftovers(conn: Any, plan: PlannedSnapshot, tables: Sequence[str], schema: str) -> None:
    """Drop the load tables of ``tables`` at ``plan.lsn`` that a crashed load left (no cleanup failure fails the load)."""
    for table in tables:
        _drop(conn, load_table_name(plan.slot, plan.lsn, table, schema))


def load_created(target: Any, plan: PlannedSnapshot, sync_table: str, table: PlannedTable, streams: Sequence[Chunks],
                 copy_into: CopyInto) -> dict[str, dict[str, int]] | None:
    """Load the created ``table`` by ``len(streams)`` COPY streams into a load table swapped in by one transaction
    (module docstring); its rows as ``_load_group`` reports them, {} when a run loaded it already, None when the
    table is no longer as created (the load table is dropped: the caller loads it serially)."""
    load = load_table_name(plan.slot, plan.lsn, table.target, target.bookkeeping_schema)
    conn = psycopg2.connect(target.dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident(load)))  # a crashed load's
            cur.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(ident(load), ident(table.target)))
            cur.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass"
                        " AND contype = 'p'", (ident(table.target).as_string(conn),))
            key = cur.fetchone()
        conn.commit()
        started = time.monotonic()
        rows = _stream(target, load, table, streams, copy_into)
        copied_s = time.monotonic() - started
        target.checkpoint("snapshot_streams_loaded")
        if key is not None:
            with conn.cursor() as cur:
                # Under the created key's name plus a suffix: the swap renames it back once the created one is gone.
                cur.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                    ident(load), sql.Identifier(_aside(key[0])), sql.SQL(key[1])))
            conn.commit()
        target.checkpoint("snapshot_key_built")
        swapped = _swap(target, conn, plan, sync_table, table, load, key[0] if key else None, rows)
        if swapped is None:
            log.info("%s changed since the apply created it: its snapshot loads in one COPY instead", table.target)
            _drop(conn, load)
            return None
        log.info("snapshot of %s loaded by %d COPY streams (%d rows, %.1f s) and swapped in (%.1f s)", table.target,
                 len(streams), rows, copied_s, time.monotonic() - started)
        target.checkpoint("snapshot_committed")
        return swapped
    except psycopg2.Error:
        conn.rollback()
        _drop(conn, load)
        raise
    finally:
        conn.close()


def _aside(name: str) -> str:
    return name[:56] + "_load"


def _stream(target: Any, load: str, table: PlannedTable, streams: Sequence[Chunks], copy_into: CopyInto) -> int:
    """Every stream's COPY into ``load`` on a connection of its own, each committed; the rows COPYed."""
    def one(i: int) -> int:
        conn = psycopg2.connect(target.dsn)
        try:
            with conn.cursor() as cur:
                sent: Callable[[], None] = (lambda: target.checkpoint("snapshot_copying")) if i == 0 else (lambda: None)
                rows = copy_into(cur, load, table.columns, streams[i](), sent)
            conn.commit()
            return rows
        finally:
            conn.close()

    with ThreadPoolExecutor(len(streams), thread_name_prefix="snapshot-stream") as pool:
        return sum(pool.map(one, range(len(streams))))


def _swap(target: Any, conn: Any, plan: PlannedSnapshot, sync_table: str, table: PlannedTable, load: str,
          key: str | None, rows: int) -> dict[str, dict[str, int]] | None:
    """The created table replaced by the load table, with its watermark and sync LSN, in one transaction; None
    (rolled back) when the created table is no longer as created."""
    schema, name = split_name(table.target)
    with conn.cursor() as cur:
        if sync_marks(conn, plan.slot, sync_table).get(table.target, -1) >= plan.lsn:
            conn.rollback()
            _drop(conn, load)
            return {}
        cur.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(ident(table.target)))
        cur.execute(sql.SQL(_UNTOUCHED).format(target=ident(table.target)),
                    {"target": ident(table.target).as_string(conn), "load": ident(load).as_string(conn)})
        row = cur.fetchone()
        if row is None or not row[0]:
            conn.rollback()
            return None
        cur.execute(sql.SQL("DROP TABLE {}").format(ident(table.target)))
        load_schema, load_name = split_name(load)
        if load_schema != schema:
            cur.execute(sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(ident(load), sql.Identifier(schema)))
        cur.execute(sql.SQL("ALTER TABLE {}.{} RENAME TO {}").format(
            sql.Identifier(schema), sql.Identifier(load_name), sql.Identifier(name)))
        if key is not None:
            cur.execute(sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
                ident(table.target), sql.Identifier(_aside(key)), sql.Identifier(key)))
        mark_synced(cur, target.config.progress_table, sync_table, plan.slot, table.target, plan.lsn, rows)
        target.checkpoint("snapshot_before_commit")
    conn.commit()
    return {table.target: {"snapshot_rows": rows}}


def _drop(conn: Any, load: str) -> None:
    """Drop the load table; a failure only leaves it to the next session's cleanup of this slot's staging tables."""
    try:
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident(load)))
        conn.commit()
    except psycopg2.Error as exc:
        conn.rollback()
        log.warning("could not drop the snapshot load table %s: %s", load, exc.pgcode)
