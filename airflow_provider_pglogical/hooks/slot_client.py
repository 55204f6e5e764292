"""Slot client: publications, slot lifecycle, peek/get/advance, server checks and catalog reads over plain psycopg2.

No Airflow import: the CLI and the pipeline's library code use this class directly (importing Airflow
costs seconds, which an empty ``pglogical run`` must not pay); ``PgLogicalHook`` wraps it for DAG authors,
resolving an Airflow connection into the ``connect`` callable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, cast

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from airflow_provider_pglogical.exceptions import (
    ReplicationPermissionError,
    SlotActiveError,
    SlotInvalidatedError,
    SlotNotFoundError,
    SlotPluginMismatchError,
    WalLevelError,
)
from airflow_provider_pglogical.hooks import copystream
from airflow_provider_pglogical.hooks.cursor import use_server_encoding
from airflow_provider_pglogical.hooks.errors import translated_errors, validate_slot_name
from airflow_provider_pglogical.hooks.replication import ReplicationStream
from airflow_provider_pglogical.hooks.slots import SlotInfo
from airflow_provider_pglogical.lsn import lsn_text
from airflow_provider_pglogical.progress import chunked

log = logging.getLogger(__name__)

PLUGIN = "pgoutput"
DEFAULT_PUBLISH = ("insert", "update", "delete", "truncate")
APPLICATION_NAME = "airflow-provider-pglogical"

# LSNs and xids leave the server as integers so nothing on the client parses "X/X" text per row.
_LSN = "(({}) - '0/0'::pg_lsn)::bigint"

Connect = Callable[[], psycopg2.extensions.connection]


Row = tuple[int, int, bytes | memoryview]


def proto_version_for(server_version_num: int) -> int:
    """Highest pgoutput protocol the server speaks (what the native apply worker picks)."""
    if server_version_num >= 160000:
        return 4
    if server_version_num >= 150000:
        return 3
    if server_version_num >= 140000:
        return 2
    raise ValueError(f"PostgreSQL {server_version_num} is too old: binary pgoutput needs 14 or later")


class PgLogicalClient:
    """Manage and read pgoutput logical replication slots over the SQL interface.

    Connects with a libpq DSN or URI (``PgLogicalClient.from_dsn``) or with ``connect``, a callable
    returning a new psycopg2 connection (how ``PgLogicalHook`` passes an Airflow connection in).
    One session per client: admin statements run in autocommit; ``peek_changes``/``get_changes``
    open a transaction for their server-side cursor (the binary-COPY peek uses a second connection).
    """

    def __init__(self, dsn: str | None = None, *, connect: Connect | None = None) -> None:
        if (dsn is None) == (connect is None):
            raise ValueError("give exactly one of dsn or connect")
        self.dsn = dsn
        self._connect_with = connect
        self._session: psycopg2.extensions.connection | None = None
        self._server_version_num: int | None = None

    @classmethod
    def from_dsn(cls, dsn: str) -> PgLogicalClient:
        """A client over a libpq keyword DSN or URI."""
        return cls(dsn)

    # -- session ---------------------------------------------------------------------------

    def connect(self) -> psycopg2.extensions.connection:
        """A new psycopg2 connection (not the session; the caller closes it)."""
        if self._connect_with is not None:
            return self._connect_with()
        return psycopg2.connect(self.dsn, application_name=APPLICATION_NAME)

    @property
    def session(self) -> psycopg2.extensions.connection:
        """The hook's session: autocommit, ``client_encoding`` = server encoding (pgoutput sends
        names and text in the client encoding; matching the server's makes that a no-op)."""
        if self._session is None or self._session.closed:
            conn = self.connect()
            conn.autocommit = True
            use_server_encoding(conn)
            self._session = conn
        return self._session

    def close(self) -> None:
        if self._session is not None and not self._session.closed:
            self._session.close()
        self._session = None

    def __enter__(self) -> PgLogicalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, query: sql.Composable | str, params: Any = None, *, slot: str | None = None,
               publication: str | None = None) -> list[tuple[Any, ...]]:
        with translated_errors(slot=slot, publication=publication), self.session.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []

    @property
    def server_version_num(self) -> int:
        if self._server_version_num is None:
            self._server_version_num = int(self._query("SHOW server_version_num")[0][0])
        return self._server_version_num

    @property
    def server_encoding(self) -> str:
        return str(self._query("SHOW server_encoding")[0][0])

    # -- preconditions ---------------------------------------------------------------------

    def check_wal_level(self) -> None:
        level = self._query("SHOW wal_level")[0][0]
        if level != "logical":
            raise WalLevelError(f"wal_level is {level!r}; logical decoding needs wal_level=logical "
                                "(ALTER SYSTEM SET wal_level = logical, then restart)")

    def check_replication_privilege(self) -> None:
        """Raise ReplicationPermissionError unless the role may use replication slots: SUPERUSER,
        REPLICATION, or membership in Amazon RDS's ``rds_replication`` (RDS grants the slot
        functions through that role, not the attribute; Cloud SQL and Azure set REPLICATION)."""
        rows = self._query(
            "SELECT r.rolsuper OR r.rolreplication OR EXISTS (SELECT 1 FROM pg_roles g WHERE g.rolname = "
            "'rds_replication' AND pg_has_role(current_user, g.oid, 'MEMBER')) FROM pg_roles r "
            "WHERE r.rolname = current_user")
        if not rows or not rows[0][0]:
            raise ReplicationPermissionError(
                "the current role lacks the REPLICATION attribute (and is no superuser); grant it with "
                "ALTER ROLE ... REPLICATION (Amazon RDS: GRANT rds_replication TO ...)")

    # -- publications ----------------------------------------------------------------------

    def publication_exists(self, name: str) -> bool:
        return bool(self._query("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)))

    def create_publication(self, name: str, tables: Sequence[str | tuple[str, str]] | None = None, *,
                           all_tables: bool = False, publish: Sequence[str] = DEFAULT_PUBLISH,
                           schemas: Sequence[str] = (), comment: str | None = None) -> bool:
        """Create the publication unless it exists; returns True when it was created.

        ``tables`` are ``(schema, table)`` pairs or unqualified names (resolved by search_path);
        both are quoted as identifiers, so any spelling works. ``schemas`` adds ``TABLES IN SCHEMA``
        (PostgreSQL 15+). ``comment`` is set in the same transaction (one simple-protocol query), so a
        publication created here never exists without it.
        """
        if self.publication_exists(name):
            return False
        if all_tables == bool(tables or schemas):
            raise ValueError("give exactly one of tables=[...]/schemas=[...] or all_tables=True")
        target: sql.Composable
        if all_tables:
            target = sql.SQL("FOR ALL TABLES")
        else:
            parts: list[sql.Composable] = []
            if tables:
                parts.append(sql.SQL("TABLE {}").format(sql.SQL(", ").join(
                    sql.Identifier(*t) if isinstance(t, tuple) else sql.Identifier(t) for t in tables)))
            if schemas:
                parts.append(sql.SQL("TABLES IN SCHEMA {}").format(sql.SQL(", ").join(map(sql.Identifier, schemas))))
            target = sql.SQL("FOR {}").format(sql.SQL(", ").join(parts))
        query = sql.SQL("CREATE PUBLICATION {} {} WITH (publish = {})").format(
            sql.Identifier(name), target, sql.Literal(", ".join(publish)))
        if comment is not None:
            query = sql.SQL("{}; COMMENT ON PUBLICATION {} IS {}").format(query, sql.Identifier(name),
                                                                          sql.Literal(comment))
        self._query(query, publication=name)
        return True

    def publication_comment(self, name: str) -> str | None:
        """The publication's comment (None when it has none or does not exist)."""
        rows = self._query("SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s",
                           (name,))
        return rows[0][0] if rows else None

    def published_tables(self, publications: str | Sequence[str]) -> set[str]:
        """``schema.table`` of every table the publications publish (pg_publication_tables)."""
        names = [publications] if isinstance(publications, str) else list(publications)
        rows = self._query("SELECT DISTINCT schemaname, tablename FROM pg_publication_tables WHERE pubname = ANY(%s)",
                           (names,), publication=", ".join(names))
        return {f"{s}.{t}" for s, t in rows}

    def drop_publication(self, name: str) -> None:
        self._query(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))

    # -- slots -----------------------------------------------------------------------------

    def slot_info(self, name: str) -> SlotInfo | None:
        """The slot's state, or None when it does not exist."""
        query = sql.SQL(
            "SELECT slot_name, plugin, slot_type, database, active, active_pid, {restart}, {confirmed},"
            " wal_status, safe_wal_size, two_phase,"
            " (pg_current_wal_lsn() - restart_lsn)::bigint, (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint"
            " FROM pg_replication_slots WHERE slot_name = %s"
        ).format(restart=sql.SQL(_LSN.format("restart_lsn")), confirmed=sql.SQL(_LSN.format("confirmed_flush_lsn")))
        rows = self._query(query, (name,), slot=name)
        return SlotInfo(*rows[0]) if rows else None

    def require_slot(self, name: str) -> SlotInfo:
        """slot_info, raising the typed error a read would hit (cheap check before reading)."""
        validate_slot_name(name)
        info = self.slot_info(name)
        if info is None:
            raise SlotNotFoundError(f"replication slot {name!r} does not exist")
        if info.slot_type != "logical" or info.plugin != PLUGIN:
            raise SlotPluginMismatchError(f"replication slot {name!r} uses plugin {info.plugin!r}, not {PLUGIN!r}")
        database = self.current_database()
        if info.database != database:
            raise SlotNotFoundError(f"replication slot {name!r} belongs to database {info.database!r}, "
                                    f"not {database!r}", hint="connect to the slot's database")
        if info.invalidated or info.confirmed_flush_lsn is None:
            raise SlotInvalidatedError(f"replication slot {name!r} has been invalidated (wal_status={info.wal_status})")
        if info.active:
            raise SlotActiveError(f"replication slot {name!r} is active for PID {info.active_pid}")
        return info

    def current_database(self) -> str:
        return str(self._query("SELECT current_database()")[0][0])

    def create_slot(self, name: str) -> bool:
        """Create a pgoutput logical slot unless it exists; returns True when it was created."""
        validate_slot_name(name)
        info = self.slot_info(name)
        if info is not None:
            if info.slot_type != "logical" or info.plugin != PLUGIN:
                raise SlotPluginMismatchError(
                    f"replication slot {name!r} exists with plugin {info.plugin!r}, not {PLUGIN!r}")
            return False
        self.check_wal_level()
        self._query("SELECT pg_create_logical_replication_slot(%s, %s)", (name, PLUGIN), slot=name)
        return True

    def drop_slot(self, name: str) -> None:
        validate_slot_name(name)
        self._query("SELECT pg_drop_replication_slot(%s)", (name,), slot=name)

    def drop_slot_if_exists(self, name: str) -> bool:
        """Drop the slot if it exists; returns True when it was dropped."""
        if self.slot_info(validate_slot_name(name)) is None:
            return False
        try:
            self.drop_slot(name)
        except SlotNotFoundError:  # dropped concurrently: the outcome is the same
            return False
        return True

    def advance_slot(self, name: str, lsn: int | str) -> int:
        """pg_replication_slot_advance: everything whose commit starts before ``lsn`` is consumed.

        Returns the slot's new confirmed_flush_lsn (the server clamps to its flush position).
        """
        validate_slot_name(name)
        query = sql.SQL("SELECT {} FROM pg_replication_slot_advance(%s, %s::pg_lsn)").format(
            sql.SQL(_LSN.format("end_lsn")))
        return int(self._query(query, (name, lsn_text(lsn)), slot=name)[0][0])

    # -- WAL positions and catalog --------------------------------------------------------

    def current_wal_flush_lsn(self) -> int:
        return int(self._query(sql.SQL("SELECT " + _LSN.format("pg_current_wal_flush_lsn()")))[0][0])

    def load_type_catalog(self, oids: Sequence[int]) -> Any:
        """A ``TypeCatalog`` for ``oids`` (runs ``TypeCatalog.CATALOG_QUERY`` in this session)."""
        from airflow_provider_pglogical.decoding.values import TypeCatalog

        rows = self._query(TypeCatalog.CATALOG_QUERY, {"oids": sorted({int(o) for o in oids})})
        return TypeCatalog.from_rows(rows)

    def format_types(self, pairs: Sequence[tuple[int, int]]) -> list[str | None]:
        """``format_type(oid, typmod)`` for each pair, in order (None for an unknown OID)."""
        if not pairs:
            return []
        rows = self._query("SELECT format_type(o, m) FROM unnest(%s::oid[], %s::int[]) WITH ORDINALITY AS t(o, m, i)"
                           " ORDER BY i", ([int(o) for o, _ in pairs], [int(m) for _, m in pairs]))
        return [r[0] for r in rows]

    def missing_values(self, relid: int) -> dict[str, str]:
        """Column → text of ``pg_attribute.attmissingval`` (a one-element array literal) for the columns of
        ``relid`` that have one: the value rows older than a column's ``ADD COLUMN … DEFAULT`` read
        (PostgreSQL 11+ fast default). Current catalog; empty for an unknown relation."""
        rows = self._query("SELECT attname, attmissingval::text FROM pg_catalog.pg_attribute WHERE attrelid = %s "
                           "AND attnum > 0 AND NOT attisdropped AND atthasmissing", (int(relid),))
        return {str(name): str(text) for name, text in rows if text is not None}

    def partition_info(self, relid: int) -> tuple[tuple[str, ...], str | None]:
        """(ancestors as ``schema.table``, parent first; partition constraint) of a leaf partition: the
        boolean expression ``pg_get_partition_constraintdef`` gives (its bound and its ancestors'), which
        a routed leaf's TRUNCATE deletes by in a shared target. ``((), None)`` for any other relation;
        ``"true"`` for a partition without a constraint (the only partition at every level). Current catalog."""
        rows = self._query(
            "SELECT c.relispartition, pg_catalog.pg_get_partition_constraintdef(c.oid), "
            "ARRAY(SELECT n.nspname || '.' || a.relname FROM pg_catalog.pg_partition_ancestors(c.oid) WITH ORDINALITY "
            "AS t(relid, i) JOIN pg_catalog.pg_class a ON a.oid = t.relid JOIN pg_catalog.pg_namespace n "
            "ON n.oid = a.relnamespace WHERE t.relid <> c.oid ORDER BY t.i) "
            "FROM pg_catalog.pg_class c WHERE c.oid = %s", (int(relid),))
        if not rows or not rows[0][0]:
            return (), None
        _, constraint, ancestors = rows[0]
        return tuple(str(a) for a in ancestors or ()), str(constraint) if constraint is not None else "true"

    def table_columns(self, table: str) -> list[str] | None:
        """The column names of ``table`` (``schema.table``) in order, or None when it does not exist."""
        schema, _, name = table.partition(".")
        rows = self._query(
            "SELECT a.attname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "WHERE n.nspname = %s AND c.relname = %s ORDER BY a.attnum", (schema, name))
        return [str(r[0]) for r in rows if r[0] is not None] if rows else None

    def primary_key(self, relid: int) -> tuple[str, ...]:
        """The primary key columns of ``relid`` in key order; () when it has none (or is unknown). Current catalog."""
        rows = self._query(
            "SELECT a.attname FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary "
            "ORDER BY array_position(i.indkey, a.attnum)", (int(relid),))
        return tuple(str(r[0]) for r in rows)

    def partition_leaves(self, table: str) -> list[str]:
        """The leaf partitions (``schema.table``) under ``table``, at any depth ([] for a missing or plain table)."""
        schema, _, name = table.partition(".")
        rows = self._query(
            "SELECT n.nspname || '.' || c.relname FROM pg_catalog.pg_class r JOIN pg_catalog.pg_namespace rn "
            "ON rn.oid = r.relnamespace, pg_catalog.pg_partition_tree(r.oid) t JOIN pg_catalog.pg_class c "
            "ON c.oid = t.relid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE rn.nspname = %s AND r.relname = %s AND t.isleaf AND t.relid <> r.oid ORDER BY 1", (schema, name))
        return [str(r[0]) for r in rows]

    @property
    def proto_version(self) -> int:
        return proto_version_for(self.server_version_num)

    def try_lock_slot(self, name: str) -> bool:
        """Take this session's advisory lock for ``name``; False when another session holds it.

        The slot itself is only held while the SQL decoding function runs, so two drains could
        both peek the same range; this lock (held for a whole drain) makes them mutually exclusive.
        """
        return bool(self._query("SELECT pg_try_advisory_lock(hashtext('airflow-provider-pglogical'), hashtext(%s))",
                                (name,))[0][0])

    def unlock_slot(self, name: str) -> None:
        self._query("SELECT pg_advisory_unlock(hashtext('airflow-provider-pglogical'), hashtext(%s))", (name,))

    # -- reading changes -------------------------------------------------------------------

    def peek_changes(self, slot: str, publication: str | Sequence[str], *, upto_lsn: int | str | None = None,
                     upto_nchanges: int | None = None, streaming: bool = False,
                     itersize: int = 2000) -> Iterator[tuple[int, int, bytes | memoryview]]:
        """Yield ``(lsn, xid, data)`` rows of pg_logical_slot_peek_binary_changes; never consumes.

        The SQL function materialises its whole result on the server before the first row, so
        bound the batch with ``upto_lsn``. The client side streams through binary COPY on a
        connection of its own when the compiled reader is built (``hooks.copystream``), else
        through a named cursor; both yield the same rows (``data`` as bytes or memoryview).
        """
        return self._changes("pg_logical_slot_peek_binary_changes", slot, publication, upto_lsn=upto_lsn,
                             upto_nchanges=upto_nchanges, streaming=streaming, itersize=itersize)

    def get_changes(self, slot: str, publication: str | Sequence[str], *, upto_lsn: int | str | None = None,
                    upto_nchanges: int | None = None, streaming: bool = False,
                    itersize: int = 2000) -> Iterator[tuple[int, int, bytes | memoryview]]:
        """Like ``peek_changes`` but consumes: the slot moves when the generator finishes
        (its transaction commits). Rows not yet made durable elsewhere are then lost on a crash.
        """
        return self._changes("pg_logical_slot_get_binary_changes", slot, publication, upto_lsn=upto_lsn,
                             upto_nchanges=upto_nchanges, streaming=streaming, itersize=itersize)

    def stream_changes(self, slot: str, publication: str | Sequence[str], *, start_lsn: int, upto_lsn: int,
                       itersize: int = 2000) -> ReplicationStream:
        """The changes ``peek_changes(upto_lsn=...)`` returns from ``start_lsn`` (the slot's position), streamed
        over a logical replication connection of their own (``hooks.replication``); the caller confirms
        published positions through it and closes it."""
        validate_slot_name(slot)
        session = self.session
        return ReplicationStream(session, slot, self.pgoutput_options(publication), start_lsn=start_lsn,
                                 bound=upto_lsn, itersize=itersize, slot_pid=lambda: self._slot_pid(slot),
                                 terminate=lambda pid: self._terminate_walsender(slot, pid))

    def _slot_pid(self, slot: str) -> int | None:
        info = self.slot_info(slot)
        return info.active_pid if info is not None and info.active else None

    def _terminate_walsender(self, slot: str, pid: int) -> None:
        """End ``pid`` only while it still holds ``slot``, in one statement: a pid the server reused for another
        process between the look and the end is never ended."""
        self._query("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                    " WHERE slot_name = %s AND active_pid = %s", (slot, pid))

    def pgoutput_options(self, publication: str | Sequence[str], *, streaming: bool = False) -> list[str]:
        """The option name/value list passed to the SQL decoding function."""
        names = [publication] if isinstance(publication, str) else list(publication)
        if not names:
            raise ValueError("at least one publication is required")
        # publication_names is parsed with SplitIdentifierString: quote each name as in SQL.
        quoted = ",".join(sql.Identifier(n).as_string(self.session) for n in names)
        options = ["proto_version", str(proto_version_for(self.server_version_num)), "publication_names", quoted,
                   "binary", "true", "messages", "true"]
        if streaming:
            options += ["streaming", "on"]
        return options

    def _changes(self, function: str, slot: str, publication: str | Sequence[str], *, upto_lsn: int | str | None,
                 upto_nchanges: int | None, streaming: bool, itersize: int,
                 cursor: bool = False) -> Iterator[tuple[int, int, bytes | memoryview]]:
        """``cursor=True`` forces the named-cursor path (the reference; benchmarks measure it)."""
        validate_slot_name(slot)
        options = self.pgoutput_options(publication, streaming=streaming)
        pub_name = publication if isinstance(publication, str) else ",".join(publication)
        query = sql.SQL("SELECT {lsn}, xid::text::bigint, data FROM {fn}(%s, %s::pg_lsn, %s, {opts})").format(
            lsn=sql.SQL(_LSN.format("lsn")), fn=sql.Identifier(function),
            opts=sql.SQL(", ").join(sql.Placeholder() * len(options)))
        params = (slot, lsn_text(upto_lsn), upto_nchanges, *options)
        if not cursor and function == "pg_logical_slot_peek_binary_changes" and copystream.available():
            return copystream.RowBlocks(self._stream_copy(query, params, slot=slot, publication=pub_name,
                                                          itersize=itersize))
        return self._stream_cursor(query, params, slot=slot, publication=pub_name, itersize=itersize)

    def _stream_copy(self, query: sql.Composable, params: tuple[Any, ...], *, slot: str, publication: str,
                     itersize: int) -> Generator[list[Row], None, None]:
        """Peek through binary COPY on a fresh connection of the compiled module's libpq, opened with the
        session's parameters and encoding, a list of rows at a time. A statement the server refuses is run
        again through the cursor path, which raises its error the way every other call does (typed by
        ``translated_errors``); so does a session whose settings that libpq cannot honour."""
        session = self.session
        with session.cursor() as cur:
            select = cur.mogrify(query, params)
        try:
            conn = copystream.LibpqConnection.like(session, client_encoding=session.encoding)
        except copystream.UnsupportedConnection as exc:
            log.warning("binary COPY fetch not used (%s); slot rows go through the named cursor", exc)
            yield from self._cursor_blocks(query, params, slot=slot, publication=publication, itersize=itersize)
            return
        try:
            blocks = copystream.stream_blocks(conn, select, itersize)
            try:
                with translated_errors(slot=slot, publication=publication):
                    # Rows of bytes are rows of ``bytes | memoryview``; the lists are only read downstream.
                    yield from cast(Iterator[list[Row]], blocks)
            except copystream.CopyRefused:
                yield from self._cursor_blocks(query, params, slot=slot, publication=publication, itersize=itersize)
            finally:
                blocks.close()
        finally:
            conn.close()

    def _cursor_blocks(self, query: sql.Composable, params: tuple[Any, ...], *, slot: str, publication: str,
                       itersize: int) -> Generator[list[Row], None, None]:
        """The cursor path in lists of ``itersize`` (where the COPY path cannot run); closing it ends the cursor."""
        rows = self._stream_cursor(query, params, slot=slot, publication=publication, itersize=itersize)
        try:
            yield from chunked(rows, max(itersize, 1))
        finally:
            rows.close()

    def _stream_cursor(self, query: sql.Composable, params: tuple[Any, ...], *, slot: str, publication: str,
                itersize: int) -> Generator[Row, None, None]:
        conn = self.session
        conn.autocommit = False  # a named (server-side) cursor lives inside a transaction
        committed = False
        try:
            with translated_errors(slot=slot, publication=publication):
                with conn.cursor(name=f"pglogical_{slot}") as cur:
                    cur.itersize = itersize
                    cur.execute(query, params)
                    yield from cur
                conn.commit()  # for get_changes this is what makes the consumption durable
                committed = True
        finally:
            if not committed and not conn.closed:
                conn.rollback()
            if not conn.closed:
                conn.autocommit = True


__all__ = ["APPLICATION_NAME", "DEFAULT_PUBLISH", "PLUGIN", "PgLogicalClient", "SlotInfo", "lsn_text", "proto_version_for"]
