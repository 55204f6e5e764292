"""Source side of a snapshot: exported snapshots on replication connections, and what to read per table.

An exported snapshot is valid while the replication connection that created it stays open and
idle; readers import it with ``SET TRANSACTION SNAPSHOT`` in ``REPEATABLE READ`` transactions.
The slot's consistent point is the LSN that splits transactions between the two: those whose
commit record starts before it are in the snapshot, the slot decodes the others (snapbuild.c;
``SnapBuildXactNeedsSkip``) — so snapshot rows and decoded changes meet with nothing lost and
nothing twice.
"""

from __future__ import annotations

import hashlib
import select
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras
from psycopg2 import sql

from airflow_provider_pglogical.exceptions import (
    RowFilterError,
    SnapshotConnectionLostError,
    SnapshotError,
)
from airflow_provider_pglogical.hooks.cursor import one_row
from airflow_provider_pglogical.lsn import parse_lsn
from airflow_provider_pglogical.row_filter import RowFilter, canonical, conjunction, disjunction, parse_row_filter

PLUGIN = "pgoutput"


@dataclass
class ExportedSnapshot:
    """A slot created on a replication connection with an exported snapshot; close() releases it.

    ``temporary`` slots (table resyncs) are dropped by the server when the connection closes, so
    a crash never leaves one behind.
    """

    dsn: str
    slot: str
    temporary: bool = False
    lsn: int = 0
    name: str = ""
    conn: Any = field(default=None, repr=False)

    def open(self) -> ExportedSnapshot:
        conn = psycopg2.connect(self.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                                application_name="airflow-provider-pglogical-snapshot")
        try:
            version = conn.server_version
            temp = " TEMPORARY" if self.temporary else ""
            if version >= 150000:
                command = f"CREATE_REPLICATION_SLOT {self.slot}{temp} LOGICAL {PLUGIN} (SNAPSHOT 'export')"
            else:
                command = f"CREATE_REPLICATION_SLOT {self.slot}{temp} LOGICAL {PLUGIN} EXPORT_SNAPSHOT"
            with conn.cursor() as cur:
                try:
                    cur.execute(command)
                except psycopg2.Error as exc:
                    primary = (exc.diag.message_primary if exc.diag else None) or type(exc).__name__
                    raise SnapshotError(f"could not create slot {self.slot!r} with an exported snapshot: "
                                        f"[{exc.pgcode}] {primary}") from None
                _slot, consistent_point, snapshot_name, _plugin = one_row(cur)
        except BaseException:
            conn.close()
            raise
        self.conn, self.lsn, self.name = conn, parse_lsn(consistent_point), snapshot_name
        return self

    def check_alive(self) -> None:
        """Raise when the connection holding the snapshot is gone (an idle walsender sends nothing,
        so a readable socket means EOF or an error message: the snapshot is no longer importable)."""
        conn = self.conn
        lost = conn is None or conn.closed
        if not lost:
            try:
                readable, _w, _x = select.select([conn.fileno()], [], [], 0)
                lost = bool(readable)
            except (OSError, ValueError):
                lost = True
        if lost:
            raise SnapshotConnectionLostError(
                f"the replication connection holding the exported snapshot of slot {self.slot!r} "
                f"(consistent point {self.lsn:X}) was lost; nothing of the unfinished tables was published — "
                "run again: finished tables are kept, the others are copied again at a later LSN")

    def close(self) -> None:
        if self.conn is not None and not self.conn.closed:
            self.conn.close()
        self.conn = None

    def __enter__(self) -> ExportedSnapshot:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def temporary_slot_name(slot: str, table: str) -> str:
    """A short, valid, per-run name for the temporary slot of a table resync."""
    import os
    import time

    digest = hashlib.sha1(f"{slot}/{table}/{os.getpid()}/{time.time_ns()}".encode()).hexdigest()[:12]
    return f"pglogical_sync_{digest}"


@dataclass(frozen=True)
class TableRead:
    """What a snapshot reads of one table, as a native table sync would (fetch_remote_table_info)."""

    table: str  # schema.table as in the spec
    relid: int
    schema: str
    name: str
    replica_identity: str
    columns: tuple[dict[str, Any], ...]  # name, type_oid, type_modifier, is_identity, type_name
    # ``(<publications' filter>) AND (<spec's filter>)``, each deparsed from its parse tree (row_filter.py)
    row_filter: str | None
    heap_bytes: int
    block_size: int
    partitioned: bool = False  # a partitioned root published via its root: its rows are its leaves' rows
    # A partitioned table whose entry routes its leaves (``leaves: route_to_root``) and whose publications
    # publish the leaves, not the table: each leaf is read on its own (``FROM ONLY <leaf>``, its own
    # filters and column list, as table sync reads a leaf) and staged as one part of this table's
    # snapshot. ``columns`` and ``relation`` are then the root's (what its target gets).
    leaves: tuple[TableRead, ...] = ()
    routed: bool = False
    primary_key: tuple[str, ...] = ()  # the table's primary key columns (a target created from it gets them)

    @property
    def relation(self) -> dict[str, Any]:
        return {"relid": self.relid, "schema": self.schema, "table": self.name,
                "replica_identity": self.replica_identity, "columns": list(self.columns),
                "primary_key": list(self.primary_key)}

    @property
    def pages(self) -> int:
        return max(1, -(-self.heap_bytes // self.block_size))

    def select_sql(self, page_range: tuple[int, int | None] | None = None) -> sql.Composed:
        """``COPY (SELECT <columns> FROM ONLY <table> WHERE <filter> [AND ctid range]) TO STDOUT (FORMAT binary)``."""
        cols = sql.SQL(", ").join(sql.Identifier(c["name"]) for c in self.columns)
        # ONLY keeps an inheritance parent's children out, as table sync does; a partitioned table has
        # no rows of its own (ONLY would read none), so it is read whole, like tablesync's SELECT.
        only = sql.SQL("") if self.partitioned else sql.SQL("ONLY ")
        query = sql.SQL("SELECT {} FROM {}{}").format(cols, only, sql.Identifier(self.schema, self.name))
        conds: list[sql.Composable] = []
        if self.row_filter:
            # Deparsed trees only (describe_tables): the text cannot reach past its parentheses.
            conds.append(sql.SQL("(" + self.row_filter + ")"))
        if page_range is not None:
            lo, hi = page_range
            conds.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({lo},0)")))
            if hi is not None:
                conds.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({hi},0)")))
        if conds:
            query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(conds))
        return sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(query)


def describe_tables(conn: psycopg2.extensions.connection, publications: str | Sequence[str],
                    tables: dict[str, tuple[tuple[str, ...] | None, str | None]],
                    routing: Collection[str] = (), named: Collection[str] | None = None) -> dict[str, TableRead]:
    """Per spec table (``schema.table`` → (spec columns, spec row filter)): columns, identity, filters.

    Read as a native subscription to ``publications`` syncs a table (tablesync.c
    ``fetch_remote_table_info``). Columns: the publications' column list (PostgreSQL 15+; a
    publication without one publishes every non-generated column) or every non-generated column,
    narrowed to the spec's ``columns``. Row filter: the publications' filters OR-ed — a row is copied
    when any publication publishes it, so one publishing the table without a filter (or through
    ``FOR ALL TABLES`` / ``TABLES IN SCHEMA``) means none — AND the spec's. Raises ``SnapshotError``
    for a missing table, one without SELECT privilege, one no publication publishes, and one the
    publications give different column lists (PostgreSQL 16+ table sync refuses it, and pgoutput stops
    decoding its changes with the same error on every version). Both filters are parsed by PostgreSQL's
    parser and deparsed (``row_filter.py``) before they reach the ``WHERE``: the spec's is checked by
    publication rules again (a caller may not have loaded a spec) and may use only published columns.

    ``routing``: the entries with ``leaves: route_to_root``. Such a partitioned table published
    without ``publish_via_partition_root`` (its publications list its leaves, not it) is described
    with its leaves (``TableRead.leaves``): every published leaf at any depth whose top-most routing
    ancestor it is, minus leaves with an entry of their own (``named``: the spec's entries, default
    ``tables``) — the leaves ``ApplyConfig.routed`` sends to its target. Each leaf gets its own
    publications' filter and column list AND the entry's, as a native subscriber syncs that leaf.
    """
    names = [publications] if isinstance(publications, str) else list(publications)
    entries = set(tables) if named is None else set(named)
    out: dict[str, TableRead] = {}
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('block_size')::int, current_setting('server_version_num')::int")
        block_size, version = one_row(cur)
        for table, (spec_columns, spec_text) in tables.items():
            spec_filter = _spec_filter(table, spec_text)
            read = _describe_one(cur, names, version, block_size, table, spec_columns, spec_filter)
            if read is None and table in routing:
                read = _describe_routed(cur, names, version, block_size, table, spec_columns, spec_filter,
                                        set(routing), entries)
            if read is None and table not in routing and _is_partitioned(cur, table):
                # Without publish_via_partition_root a publication lists the leaves, not the root.
                raise SnapshotError(f"{table} is partitioned and its publication publishes its leaves, not the table "
                                    "(no publish_via_partition_root): set leaves: route_to_root on its entry to "
                                    "snapshot every leaf into its target, or publish_via_partition_root = true on "
                                    "the publication")
            if read is None:
                which = f"publication {names[0]!r} does not" if len(names) == 1 else \
                    f"none of the publications {', '.join(repr(n) for n in names)}"
                raise SnapshotError(f"{which} publish {table}; ALTER PUBLICATION {names[0]} ADD TABLE {table} first")
            out[table] = read
    return out


def _spec_filter(table: str, text: str | None) -> RowFilter | None:
    """The spec's filter of ``table`` parsed and checked by publication rules (row_filter.py)."""
    if not text:
        return None
    try:
        return parse_row_filter(text)
    except RowFilterError as exc:
        raise SnapshotError(f"row filter of {table}: {exc}; fix the spec's row_filter of {table} "
                            "(nothing was read)") from None


def _describe_one(cur: Any, names: list[str], version: int, block_size: int, table: str,
                  spec_columns: tuple[str, ...] | None, spec_filter: RowFilter | None, *,
                  leaf_of: str | None = None) -> TableRead | None:
    """One table as table sync reads it; None when no publication publishes it. ``leaf_of``: the routing
    entry a leaf is read for (errors name both)."""
    schema, _, name = table.partition(".")
    what = f"{table} (leaf partition of {leaf_of})" if leaf_of else table
    # A partitioned table's size is its largest leaf's: page-range chunks split every leaf.
    cur.execute("SELECT c.oid, c.relreplident, has_table_privilege(c.oid, 'SELECT'),"
                " CASE WHEN c.relkind = 'p' THEN COALESCE((SELECT max(pg_relation_size(t.relid))"
                "   FROM pg_partition_tree(c.oid) t WHERE t.isleaf), 0) ELSE pg_relation_size(c.oid) END,"
                " c.relkind = 'p'"
                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')", (schema, name))
    row = cur.fetchone()
    if row is None:
        raise SnapshotError(f"table {what} does not exist on the source (dropped?); remove it from the "
                            "spec's tables or create it, then run again")
    relid, replident, can_select, heap_bytes, partitioned = row
    if not can_select:
        # Reading a partition directly needs SELECT on it: a grant on its root does not reach it.
        raise SnapshotError(f"the source role may not SELECT from {what}; GRANT SELECT ON {table} TO "
                            "the replication role, then run again (nothing of it was staged)")
    if version >= 150000:
        cur.execute("SELECT pubname, attnames, rowfilter FROM pg_publication_tables WHERE pubname = ANY(%s)"
                    " AND schemaname = %s AND tablename = %s ORDER BY pubname", (names, schema, name))
    else:
        cur.execute("SELECT pubname, NULL::name[], NULL::text FROM pg_publication_tables WHERE pubname = ANY(%s)"
                    " AND schemaname = %s AND tablename = %s ORDER BY pubname", (names, schema, name))
    published = [(pub, _names(cols), flt) for pub, cols, flt in cur.fetchall()]
    if not published:
        return None
    columns = _columns(cur, int(relid), replident)
    pub_columns = published_columns(table, [c["name"] for c in columns], [p[1] for p in published])
    columns = [c for c in columns if c["name"] in pub_columns]
    unknown = sorted(spec_filter.columns - set(pub_columns)) if spec_filter else []
    if unknown:
        raise SnapshotError(f"row filter of {what} references column(s) {', '.join(unknown)} that its publications "
                            "do not publish; fix the spec's row_filter (nothing was read)")
    if spec_columns:
        keep = set(spec_columns)
        columns = [c for c in columns if c["name"] in keep]
    pub_filter = published_row_filter([p[2] for p in published])
    row_filter = conjunction([pub_filter, spec_filter.sql if spec_filter else None])
    return TableRead(table, int(relid), schema, name, replident, tuple(columns), row_filter,
                     int(heap_bytes), block_size, bool(partitioned), primary_key=primary_key(cur, int(relid)))


def primary_key(cur: Any, relid: int) -> tuple[str, ...]:
    """The primary key columns of ``relid`` in key order; () when it has none."""
    cur.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
                " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary"
                " ORDER BY array_position(i.indkey, a.attnum)", (relid,))
    return tuple(str(r[0]) for r in cur.fetchall())


def _is_partitioned(cur: Any, table: str) -> bool:
    schema, _, name = table.partition(".")
    cur.execute("SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'p'", (schema, name))
    return cur.fetchone() is not None


def _columns(cur: Any, relid: int, replident: str) -> list[dict[str, Any]]:
    """Non-generated columns in attribute order, each flagged when it is in the replica identity."""
    cur.execute(
        "SELECT a.attname, a.atttypid::bigint, a.atttypmod, format_type(a.atttypid, a.atttypmod),"
        " CASE %(ri)s WHEN 'f' THEN true WHEN 'n' THEN false ELSE COALESCE(a.attnum = ANY("
        "   (SELECT i.indkey FROM pg_index i WHERE i.indrelid = %(oid)s AND"
        "    CASE %(ri)s WHEN 'd' THEN i.indisprimary ELSE i.indisreplident END LIMIT 1)::int2[]), false) END"
        " FROM pg_attribute a WHERE a.attrelid = %(oid)s AND a.attnum > 0 AND NOT a.attisdropped"
        " AND a.attgenerated = '' ORDER BY a.attnum", {"oid": relid, "ri": replident})
    return [{"name": r[0], "type_oid": int(r[1]), "type_modifier": int(r[2]), "type_name": r[3],
             "is_identity": bool(r[4])} for r in cur.fetchall()]


def _describe_routed(cur: Any, names: list[str], version: int, block_size: int, table: str,
                     spec_columns: tuple[str, ...] | None, spec_filter: RowFilter | None, routing: set[str],
                     entries: set[str]) -> TableRead | None:
    """A routing entry's partitioned table with its published leaves as parts (``describe_tables``); None
    when it is not a partitioned table. A partitioned table without any leaf yet is read whole (no rows)."""
    schema, _, name = table.partition(".")
    cur.execute("SELECT c.oid, c.relreplident, has_table_privilege(c.oid, 'SELECT') FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'p'", (schema, name))
    row = cur.fetchone()
    if row is None:
        return None
    relid, replident, can_select = row
    # Every leaf under it with its ancestors (parent first), as the drain stages them for routing.
    cur.execute("SELECT n.nspname || '.' || c.relname, ARRAY(SELECT an.nspname || '.' || a.relname"
                "   FROM pg_partition_ancestors(t.relid) WITH ORDINALITY AS x(relid, i)"
                "   JOIN pg_class a ON a.oid = x.relid JOIN pg_namespace an ON an.oid = a.relnamespace"
                "   WHERE x.relid <> t.relid ORDER BY x.i)"
                " FROM pg_partition_tree(%s::oid) t JOIN pg_class c ON c.oid = t.relid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                # foreign-table partitions are never published (nor read by table sync)
                " WHERE t.isleaf AND t.relid <> %s::oid AND c.relkind = 'r' ORDER BY 1",
                (int(relid), int(relid)))
    tree = [(str(leaf), [str(a) for a in ancestors or ()]) for leaf, ancestors in cur.fetchall()]
    root_columns = _columns(cur, int(relid), replident)
    if spec_columns:
        root_columns = [c for c in root_columns if c["name"] in set(spec_columns)]
    if not tree:
        # No partition yet: nothing to copy, but the target and its sync LSN start here (leaves attached
        # later bring their changes). Read whole, it has no rows.
        if not can_select:
            raise SnapshotError(f"the source role may not SELECT from {table}; GRANT SELECT ON {table} TO "
                                "the replication role, then run again (nothing of it was staged)")
        row_filter = conjunction([spec_filter.sql if spec_filter else None])
        return TableRead(table, int(relid), schema, name, replident, tuple(root_columns), row_filter, 0,
                         block_size, partitioned=True, primary_key=primary_key(cur, int(relid)))
    mine = [leaf for leaf, ancestors in tree if leaf not in entries
            and next((a for a in reversed(ancestors) if a in routing), None) == table]
    leaves = [read for leaf in mine
              if (read := _describe_one(cur, names, version, block_size, leaf, spec_columns, spec_filter,
                                        leaf_of=table)) is not None]
    if not leaves:
        if not mine:
            # Every leaf goes elsewhere (an entry of its own, an upper routing entry): this entry's target gets
            # none of their rows. Read the root with a false filter: an empty snapshot with the root's columns.
            return TableRead(table, int(relid), schema, name, replident, tuple(root_columns), "false", 0,
                             block_size, partitioned=True, primary_key=primary_key(cur, int(relid)))
        which = f"publication {names[0]!r} publishes" if len(names) == 1 else \
            f"the publications {', '.join(repr(n) for n in names)} publish"
        raise SnapshotError(f"{table} routes its leaf partitions (leaves: route_to_root) but {which} none of them "
                            f"({', '.join(mine)}); ALTER PUBLICATION {names[0]} ADD TABLE {table} first")
    published = {c["name"] for leaf in leaves for c in leaf.columns}
    columns = tuple(c for c in root_columns if c["name"] in published)
    return TableRead(table, int(relid), schema, name, replident, columns,
                     conjunction([spec_filter.sql if spec_filter else None]),
                     sum(leaf.heap_bytes for leaf in leaves), block_size, leaves=tuple(leaves), routed=True,
                     primary_key=primary_key(cur, int(relid)))


def _names(value: Any) -> tuple[str, ...] | None:
    """A ``name[]`` column as a tuple (it may arrive as its text form); None for NULL."""
    if value is None:
        return None
    if isinstance(value, str):
        inner = value.strip("{}")
        return tuple(inner.split(",")) if inner else ()
    return tuple(value)


def published_columns(table: str, columns: Sequence[str], lists: Sequence[tuple[str, ...] | None]) -> set[str]:
    """The columns the publications publish of ``table`` (``columns``: its non-generated ones, in order).

    Each entry of ``lists`` is one publication's ``attnames``: NULL or empty (PostgreSQL 14, or no
    column list on 15) means every column. Publications giving different sets is PostgreSQL's error.
    """
    every = set(columns)
    sets = {frozenset(every & set(cols)) if cols else frozenset(every) for cols in lists}
    if len(sets) > 1:
        raise SnapshotError(f"cannot use different column lists for table {table} in different publications "
                            "(PostgreSQL refuses it in table sync and in decoding); give the table one column "
                            "list in every publication, or list one publication")
    return set(next(iter(sets))) if sets else every


def published_row_filter(filters: Sequence[str | None]) -> str | None:
    """The publications' row filters of one table as table sync combines them: OR-ed, each once, in order;
    None (copy every row) when any publication has none for it. Each is the server's ``pg_get_expr`` text,
    parsed and deparsed like the spec's."""
    if not filters or any(not f for f in filters):
        return None
    try:
        distinct = list(dict.fromkeys(canonical(f) for f in filters if f))
    except RowFilterError as exc:  # not expected of the server's own deparse
        raise SnapshotError(f"a publication's row filter {exc}") from None
    return disjunction(distinct)


def foreign_key_links(conn: psycopg2.extensions.connection, tables: Collection[str]) -> list[tuple[str, str]]:
    """(referencing, referenced) pairs among ``tables`` (``schema.table``) by the source's foreign keys.

    A partitioned table's own constraint links it (its leaves' clones link the leaves), as the target of a
    routed table gets it."""
    names = sorted(set(tables))
    if not names:
        return []
    with conn.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT cn.nspname || '.' || c.relname, pn.nspname || '.' || p.relname FROM pg_constraint k"
            " JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace cn ON cn.oid = c.relnamespace"
            " JOIN pg_class p ON p.oid = k.confrelid JOIN pg_namespace pn ON pn.oid = p.relnamespace"
            " WHERE k.contype = 'f' AND cn.nspname || '.' || c.relname = ANY(%(t)s)"
            " AND pn.nspname || '.' || p.relname = ANY(%(t)s) ORDER BY 1, 2", {"t": names})
        return [(str(a), str(b)) for a, b in cur.fetchall()]

