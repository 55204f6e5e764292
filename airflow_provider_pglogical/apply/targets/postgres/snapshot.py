"""Snapshot loads into PostgreSQL: each atomic group of a snapshot's tables (tables linked by foreign keys of
the target) in its own transaction — TRUNCATE, COPY of the snapshot rows straight into the tables, watermark
and sync LSN — up to ``PARALLEL_GROUPS`` groups at once (``PostgresTarget.group_loads``, shared by its siblings).

Choice (docs/apply.md): the rows go into the *existing* target table emptied with ``TRUNCATE`` in
the same transaction, not into a fresh table swapped in. Readers never see an empty or half-loaded table
(TRUNCATE's lock makes them wait until COMMIT, then they see the new rows), while grants, indexes,
constraints, FKs and dependent views of the target table stay as they are — a swap would have to
recreate all of them.

Per group, not per snapshot, like native table sync (one transaction per table, two sync workers in
parallel): every table is consistent on its own from its sync LSN on (the per-table rule of
``apply/snapshots.py``), so only tables the target ties together load together — a referenced table can
only be truncated together with its referencing tables, and its rows must be there for theirs. Inside a
group the tables are emptied by one TRUNCATE and filled parents first.

The rows are COPYed by the group's own connection, like a native table sync copies into the
table — no staging table, no ``INSERT … SELECT``. Snapshot rows need no transform on the way
(``apply/changes.SnapshotChanges.rows``); when they are the staged ``new`` images as they are and every column
is a type ``arrowtext`` prints exactly, the loading process reads the staged row groups with pyarrow and prints
them on a few threads while the COPY sends them (``StreamedText``: the text would pass through this connection
anyway, so a Spark job and its cache only added a copy); otherwise Spark reads them, ``copytext.copy_columns`` +
``arrowtext`` print them into Spark's disk cache before the transaction, and the COPY reads them back in chunks
of whole lines (``toLocalIterator``: one partition at a time, so memory stays bounded by a partition).

Crash windows (``CHECKPOINTS``, where the crash tests stop the process): everything of a group happens inside
its transaction, which rolls back with the connection — during a COPY, after a table's COPY, before COMMIT;
after COMMIT the sync marks make the rerun skip the group, and the groups not committed load whole.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import psycopg2
import pyarrow as pa
from psycopg2 import errorcodes, sql

from airflow_provider_pglogical.apply.targets.base import BatchResult, DirectRowsSource, PlannedSnapshot, PlannedTable
from airflow_provider_pglogical.apply.targets.postgres import arrownet, arrowtext
from airflow_provider_pglogical.apply.targets.postgres.bookkeeping_schema import qualified
from airflow_provider_pglogical.apply.targets.postgres.catalog import ident
from airflow_provider_pglogical.apply.targets.postgres.copy import server_primary, without_quoted
from airflow_provider_pglogical.apply.targets.postgres.progress import SYNC_TABLE, ensure_sync_table, sync_marks
from airflow_provider_pglogical.apply.targets.postgres.replication_role import set_replication_role
from airflow_provider_pglogical.apply.targets.postgres.target_types import PgType, describe_types
from airflow_provider_pglogical.exceptions import ApplyError, PgLogicalError, format_lsn
from airflow_provider_pglogical.snapshot.links import linked_components

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# ``copying`` inside each table's COPY once its first chunk was sent, ``loaded`` after it (watermark and sync
# LSN not written yet), then right before and right after COMMIT.
CHECKPOINTS = ("snapshot_copying", "snapshot_loaded", "snapshot_before_commit", "snapshot_committed")


PARALLEL_GROUPS = 2  # groups loaded at once: native's max_sync_workers_per_subscription default
CHUNK_BYTES = 4 << 20  # COPY data handed from the executors to the loading connection per chunk


class LoadSlots:
    """At most ``n`` snapshot load transactions at once (``PostgresTarget.group_loads``, shared by its siblings).
    A load either waits for a slot (``with slots:``), or is started once one is free (``start_when_free``): a
    loader that could only wait is not started, and holds no thread or connection, before it can load."""

    def __init__(self, n: int) -> None:
        self._n = self._free = n
        self._changed = threading.Condition()
        self._starts: deque[Callable[[], bool]] = deque()

    def __enter__(self) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._free > 0)
            self._free -= 1

    def __exit__(self, *exc: object) -> None:
        self.release()

    def start_when_free(self, start: Callable[[], bool]) -> None:
        """Call ``start`` holding a slot, now or once one frees: it returns whether it loads (then it calls
        ``release`` once its load ends), else the slot goes on."""
        with self._changed:
            self._starts.append(start)
        self._hand_over()

    def release(self) -> None:
        """A slot back, like ``threading.BoundedSemaphore.release``: one more than were taken is a bug that would
        let more loads run at once than there are slots, so it raises ``ValueError``."""
        with self._changed:
            if self._free >= self._n:
                raise ValueError(f"load slot released more often than taken (all {self._n} are free)")
            self._free += 1
        self._hand_over()

    def _hand_over(self) -> None:
        """A free slot to the first waiting start that still loads; what is left to the loads that wait. Never
        raises: it runs in ``release`` (another load's end, maybe after its COMMIT), and a start that raised
        gives its slot back like one that declined."""
        while True:
            with self._changed:
                if not self._starts or self._free == 0:
                    self._changed.notify_all()
                    return
                start = self._starts.popleft()
                self._free -= 1
            try:
                loads = start()
            except BaseException:  # noqa: BLE001 - a lost slot would hold every later load forever
                log.exception("a snapshot loader failed to start; its table is loaded after its publication")
                loads = False
            if not loads:
                with self._changed:
                    self._free += 1


class CachedText:
    """A table's COPY text in chunks of whole lines in Spark's disk cache (a DataFrame of one ``data`` column),
    built by every executor at once before the load transaction takes its locks, so that the load only streams it."""

    def __init__(self, cached: Any) -> None:
        self._cached = cached

    def chunks(self) -> Iterator[bytes]:
        """The chunks in order, one partition at a time on the driver (memory bounded by a partition)."""
        for row in self._cached.toLocalIterator(prefetchPartitions=True):
            yield bytes(row[0])

    def unpersist(self) -> None:
        self._cached.unpersist()


class StreamedText:
    """A table's COPY text printed from the staged files' row groups (``arrownet.row_text``) by ``threads``
    threads of the loading process while the COPY sends it: no Spark job, no cache, no hop through the JVM, and
    PostgreSQL parses one chunk while the next ones are printed. Row groups come back in file order; at most
    ``2 × threads`` printed row groups wait (memory bounded by a few row groups' text). pyarrow's readers and
    compute kernels release the GIL, so the threads print on every core."""

    def __init__(self, plan: arrownet.RowsPlan, threads: int) -> None:
        self._plan, self._threads = plan, max(1, threads)

    def chunks(self) -> Iterator[bytes]:
        run = arrownet.row_text(self._plan, CHUNK_BYTES)
        tasks = iter(self._plan.tasks)
        with ThreadPoolExecutor(self._threads, thread_name_prefix="snapshot-text") as pool:
            waiting: deque[Future[list[bytes]]] = deque()
            try:
                def submit() -> None:
                    task = next(tasks, None)
                    if task is not None:
                        waiting.append(pool.submit(lambda t: list(run([t])), task))

                for _ in range(2 * self._threads):
                    submit()
                while waiting:
                    printed = waiting.popleft().result()
                    submit()
                    yield from printed
            finally:  # a failed or abandoned COPY: print nothing more
                for future in waiting:
                    future.cancel()

    def unpersist(self) -> None:
        pass


def streamed_text(target: Any, plan: arrownet.RowsPlan) -> StreamedText:
    """``plan``'s rows printed by this process while the COPY sends them, on its cores."""
    return StreamedText(plan, target.config.write_partitions or os.cpu_count() or 1)


def column_types(target: Any, table: PlannedTable) -> dict[str, PgType]:
    """The target columns' types, as the COPY text of ``table``'s rows is printed for them."""
    return describe_types(target.conn, [(c, target._existing(table.target).columns[c]) for c in table.columns])


def copy_text(frame: DataFrame, types: Any) -> CachedText:
    """The frame's rows as COPY text (``copytext.copy_columns``, ``arrowtext``), cached."""
    from pyspark import StorageLevel

    from airflow_provider_pglogical.apply.targets.postgres.copytext import copy_columns

    text_frame, fields = copy_columns(frame, types)
    lines = arrowtext.line_batches(fields)

    def join(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        schema = pa.schema([("data", pa.binary())])
        parts: list[bytes] = []
        size = 0
        for data, _rows in lines(batches):
            parts.append(data)
            size += len(data)
            if size >= CHUNK_BYTES:
                yield pa.RecordBatch.from_pydict({"data": [b"".join(parts)]}, schema=schema)
                parts, size = [], 0
        if parts:
            yield pa.RecordBatch.from_pydict({"data": [b"".join(parts)]}, schema=schema)

    text = text_frame.mapInArrow(join, "data binary").persist(StorageLevel.DISK_ONLY)
    text.count()
    return CachedText(text)


def table_text(target: Any, changes: Any, table: PlannedTable, types: Any) -> CachedText | StreamedText:
    """The table's snapshot rows as COPY text. When they are the staged ``new`` images as they are and every
    column is a type ``arrowtext`` prints exactly (``SnapshotChanges.direct_rows``, ``arrownet.plan_rows``), the
    staged files' row groups are read with pyarrow and printed while the COPY runs (``StreamedText``): no Spark
    Parquet read, no struct handling, no Arrow conversion of typed columns. Otherwise Spark's path, cached
    before the load transaction."""
    found = changes.direct_rows(table) if isinstance(changes, DirectRowsSource) else None
    plan = arrownet.plan_rows(found.files, table.columns, types, found.filesystem) if found else None
    if plan is None:
        return copy_text(changes.rows(table), types)
    log.debug("snapshot of %s printed straight from the staged files (%d row groups)", table.target, len(plan.tasks))
    return streamed_text(target, plan)


class _Feed:
    """The file object ``copy_expert`` reads: each ``read`` returns the next whole chunk; ``on_sent`` is
    called when the second is asked for (the first is in the COPY). ``failed``: what a ``read`` raised —
    psycopg2 ends the COPY with it flattened into its own error's text."""

    def __init__(self, chunks: Iterator[bytes], on_sent: Callable[[], None]) -> None:
        self._chunks, self._on_sent, self._sent = chunks, on_sent, 0
        self.failed: BaseException | None = None

    def read(self, _size: int = -1) -> bytes:
        try:
            if self._sent == 1:
                self._on_sent()
            for data in self._chunks:
                if data:
                    self._sent += 1
                    return data
            return b""
        except BaseException as exc:
            self.failed = exc
            raise

    def readline(self, _size: int = -1) -> bytes:  # never called by COPY FROM; part of the file API
        return self.read()


class FeedError(Exception):
    """What a COPY's feed (``chunks`` or ``on_sent`` of ``copy_into``) raised that is not ours to raise as it is:
    a read of the staged rows that failed (``OSError`` of an object store, a Spark job's error)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(feed_error_line(cause))
        self.cause = cause


class UnreadRows(ApplyError):
    """A load transaction rolled back because its staged rows could not be read. ``reason``: the message without
    its way out, for a caller whose table is loaded again anyway (the streamed load, the overlapped one)."""

    def __init__(self, reason: str, way_out: str) -> None:
        super().__init__(f"{reason}; {way_out}")
        self.reason = reason


FEED_LINE_CHARS = 200  # of a foreign error's first line in ours: a Spark job's error holds its whole Java stack
_TRANSIENT_ERRNOS = frozenset({errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT,
                               errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EPIPE, errno.EAGAIN})
_TRANSIENT_WORDS = ("connection", "timed out", "timeout", "temporarily", "throttl", "slow down", "unavailable")
# pyarrow raises an object store's errors as a plain ``OSError`` (no errno) whose text names the store's error code:
# S3's as the AWS SDK names it and, for a code the SDK does not know, the HTTP status (``AWS Error UNKNOWN (HTTP
# status 503)``); Azure's as the service sends it, then the status (``Azure Error: [BlobNotFound] 404 The specified
# blob does not exist.``: ``ExceptionToStatus`` in arrow/filesystem/azurefs.cc, e.g. a blob gone between opening
# and reading it); GCS's as google-cloud-cpp's status code (``google::cloud::Status(UNAVAILABLE: …``: ``ToArrowStatus``
# in arrow/filesystem/gcsfs_internal.cc, which raises RESOURCE_EXHAUSTED as ``ArrowCapacityError`` and gives
# NOT_FOUND and PERMISSION_DENIED errno ENOENT / EACCES, so they arrive as FileNotFoundError / PermissionError).
# A Spark job whose executors read the store with pyarrow carries the same text in its Python worker's traceback.
_STORE_CODE = re.compile(r"AWS Error (\w+)|Azure Error: \[(\w+)\]|google::cloud::Status\((\w+)")
_HTTP_STATUS = re.compile(r"HTTP status (\d{3})|Azure Error: \[\w*\] (\d{3})")
_STORE_RERUN = frozenset({"SLOW_DOWN", "THROTTLING", "NETWORK_CONNECTION", "SERVICE_UNAVAILABLE", "INTERNAL_FAILURE",
                          "REQUEST_TIMEOUT",  # S3
                          "ServerBusy", "OperationTimedOut", "InternalError",  # Azure
                          "UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL", "ABORTED"})  # GCS
_STORE_MISSING = frozenset({"NO_SUCH_KEY", "NO_SUCH_BUCKET", "RESOURCE_NOT_FOUND",
                            "BlobNotFound", "ContainerNotFound", "PathNotFound", "FilesystemNotFound",
                            "NOT_FOUND"})
_STORE_DENIED = frozenset({"ACCESS_DENIED", "AuthorizationFailure", "AuthorizationPermissionMismatch",
                           "AuthenticationFailed", "PERMISSION_DENIED", "UNAUTHENTICATED"})
# a Spark job's error that fails the same on every rerun: a staged file gone or damaged (Spark 4's error classes
# ``[FAILED_READ_FILE.FILE_NOT_EXIST]`` and ``[PATH_NOT_FOUND]`` too)
_SPARK_LOST = ("FileNotFoundException", "CANNOT_READ_FILE_FOOTER", "FILE_NOT_EXIST", "[PATH_NOT_FOUND]")
# Python's ``FileNotFoundError`` raised by pyarrow in the traceback of an executor reading staged files
# (``executor_reads``): the traceback's last frame is pyarrow's (a Cython frame has no source line under it). One
# raised by other code of the worker (a missing module file, a lost temporary file) is no staged file's loss.
_PYARROW_LOST = re.compile(r'File "[^"\n]*pyarrow[^"\n]*", line \d+, in [^\n]*\n(?: {4}[^\n]*\n)?FileNotFoundError: ')
# a staging area's refusal of the read: Hadoop's ``AccessDeniedException``, GCS's ``PERMISSION_DENIED``, Azure's
# ``AuthorizationFailure``, an HTTP 403 (not a Java stack's line number: ``Foo.java:403``)
_REFUSED = re.compile(r"AccessDenied|PERMISSION_DENIED|AuthorizationFailure|(?<![\w.:])403(?![\w.])")
# a file's own damage as pyarrow's Parquet reader reports it (``ArrowInvalid`` or ``OSError``): it fails the same on
# every rerun. An ``ArrowInvalid`` without these words is a value's conversion or a schema's, not the file's bytes.
_DAMAGE_WORDS = ("thrift", "magic bytes", "could not open parquet input source", "parquet file size", "corrupt")
RERUN, READ_ACCESS, RESYNC, UNKNOWN = "rerun", "read access", "resync", "unknown"


def feed_error_line(exc: BaseException) -> str:
    """``Type: first line`` of a foreign error, capped at ``FEED_LINE_CHARS``, without what it quotes: a parser's
    message quotes the row's value (``Failed to parse string: 'alice@x'``), so every quoted span becomes ``…``
    (``copy.without_quoted``). An ``OSError`` that carries them is its file name and the system's reason."""
    if isinstance(exc, OSError) and exc.strerror:
        first = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        first = without_quoted(str(exc).strip())
    first = first.strip()
    if len(first) > FEED_LINE_CHARS:
        first = first[:FEED_LINE_CHARS - 1] + "…"
    return f"{type(exc).__name__}: {first}" if first and first != "…" else type(exc).__name__


def read_failure(exc: BaseException) -> str:
    """What a failed read of staged rows calls for: ``RERUN`` when it may well succeed again (a lost connection, a
    timeout, an object store's throttling or 5xx, a Spark job's failure such as a lost executor), ``READ_ACCESS``
    when the staging area refused the read, ``RESYNC`` when a staged file is known missing or damaged (it fails the
    same on every rerun), ``UNKNOWN`` for anything else (a rerun, then the resync if it fails the same)."""
    text = str(exc)
    spark = type(exc).__module__.startswith(("py4j", "pyspark"))
    if spark or isinstance(exc, (OSError, pa.ArrowException)):
        store = _store_failure(text)
        if store is not None:
            return store
    if spark:
        if _REFUSED.search(text):
            return READ_ACCESS
        lost = (any(word in text for word in _SPARK_LOST) or _PYARROW_LOST.search(text) is not None
                or any(w in text.lower() for w in _DAMAGE_WORDS))
        return RESYNC if lost else RERUN
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return RERUN
    if isinstance(exc, PermissionError):
        return READ_ACCESS
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return RESYNC
    if not isinstance(exc, (OSError, pa.ArrowInvalid)):
        return UNKNOWN
    if isinstance(exc, OSError) and _REFUSED.search(text):
        return READ_ACCESS
    if isinstance(exc, OSError) and (exc.errno in _TRANSIENT_ERRNOS
                                     or any(w in text.lower() for w in _TRANSIENT_WORDS)):
        return RERUN
    return RESYNC if any(word in text.lower() for word in _DAMAGE_WORDS) else UNKNOWN


def _store_failure(text: str) -> str | None:
    """What an object store's error code or HTTP status named in ``text`` calls for; None when it names neither."""
    code_found, status_found = _STORE_CODE.search(text), _HTTP_STATUS.search(text)
    code = next((g for g in code_found.groups() if g), "") if code_found else ""
    http = int(next((g for g in status_found.groups() if g), "0")) if status_found else 0
    if code in _STORE_DENIED or http in (401, 403):
        return READ_ACCESS
    if not code and not http:
        return None
    if code in _STORE_RERUN or http >= 500 or http == 429:
        return RERUN
    return RESYNC if code in _STORE_MISSING or http == 404 else UNKNOWN


def unread_rows(lsn: int, names: str, table: PlannedTable, exc: FeedError) -> UnreadRows:
    """A load transaction's failed read of ``table``'s staged rows, with the way out that exists for its cause."""
    reason = (f"snapshot at {format_lsn(lsn)} of {names} not applied: its staged rows could not be read ({exc}); "
              "nothing of it was committed")
    resync = f"pglogical resync --table {table.source}"
    way_out = {RERUN: "rerun the apply to load it whole",
               READ_ACCESS: "give the apply read access to the staging area, then rerun it",
               RESYNC: f"stage the table again: {resync}"}.get(read_failure(exc.cause),
                                                               f"rerun the apply; if it fails the same way: {resync}")
    return UnreadRows(reason, way_out)


def copy_into(cur: Any, table: str, columns: Sequence[str], chunks: Iterator[bytes],
              on_sent: Callable[[], None] = lambda: None,
              passed: tuple[type[BaseException], ...] = ()) -> int:
    """``COPY table (columns) FROM STDIN`` of text chunks on ``cur``'s connection (inside its transaction);
    the row count PostgreSQL reports. What ``chunks`` or ``on_sent`` raised, not the server's error that ended the
    COPY with it (``COPY from stdin failed``, SQLSTATE 57014): as it is when ours (``PgLogicalError``), an
    interrupt or one of ``passed``, else as ``FeedError``. A server error raised before (a row it rejected) is
    raised as it is: the server reports it only once the feed ends, whatever the feed raised meanwhile."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(ident(table), sql.SQL(", ").join(map(sql.Identifier, columns)))
    feed = _Feed(chunks, on_sent)
    try:
        cur.copy_expert(statement.as_string(cur), feed, size=CHUNK_BYTES)
    except psycopg2.Error as exc:
        failed = feed.failed
        if failed is None or exc.pgcode != errorcodes.QUERY_CANCELED:  # the server's error came first: its own
            raise
        if isinstance(failed, (PgLogicalError, KeyboardInterrupt, SystemExit, *passed)):
            raise failed from None
        raise FeedError(failed) from failed
    return int(cur.rowcount)


def atomic_groups(tables: Sequence[PlannedTable], fks: Iterable[tuple[str, str]]) -> list[tuple[PlannedTable, ...]]:
    """The tables of one snapshot split into the groups that must be loaded together: tables linked by a
    foreign key of the target (either way, transitively) — a ``TRUNCATE`` of a referenced table must name its
    referencing tables too, and a child's rows need its parent's. Each group keeps ``tables``' order (parents
    first); groups come in the order of their first table. ``fks``: (referencing, referenced) target tables."""
    by_name = {t.target: t for t in tables}
    return [tuple(by_name[n] for n in group) for group in linked_components([t.target for t in tables], list(fks))]


def apply_snapshot(target: Any, plan: PlannedSnapshot, changes: Any) -> BatchResult:
    """Every atomic group of the snapshot's tables (``atomic_groups``) loaded in its own transaction —
    TRUNCATE + COPY of its tables + their watermarks and sync LSNs — up to ``PARALLEL_GROUPS`` at a time,
    like native table sync workers. A group whose tables are marked at ``plan.lsn`` already is skipped."""
    conn = target.conn
    sync_table = qualified(target.bookkeeping_schema, SYNC_TABLE)
    ensure_sync_table(conn, sync_table)
    result = BatchResult(applied=False)
    started = time.monotonic()
    marks = sync_marks(conn, plan.slot, sync_table)
    conn.commit()
    groups = [g for g in atomic_groups(plan.tables, target.foreign_keys())
              if any(marks.get(t.target, -1) < plan.lsn for t in g)]
    if not groups:
        return result  # loaded by an earlier run (each group checked again inside its transaction)
    types = {t.target: column_types(target, t) for g in groups for t in g}
    conn.commit()
    seconds = {"stage": 0.0, "apply": 0.0, "copy": 0.0}
    lock = threading.Lock()

    def load(group: tuple[PlannedTable, ...]) -> dict[str, dict[str, int]]:
        with target.group_loads:  # shared by the target's siblings: PARALLEL_GROUPS loads in all
            return load_one(group)

    def load_one(group: tuple[PlannedTable, ...]) -> dict[str, dict[str, int]]:
        group_started = time.monotonic()
        texts = {t.target: table_text(target, changes, t, types[t.target]) for t in group}
        try:
            staged_at = time.monotonic()
            rows, copy_s = load_transaction(target, plan.slot, plan.lsn, sync_table, group,
                                            lambda t: texts[t.target].chunks())
        finally:
            for text in texts.values():
                text.unpersist()
        with lock:
            seconds["stage"] += staged_at - group_started
            seconds["apply"] += time.monotonic() - staged_at
            seconds["copy"] += copy_s
        return rows

    workers = min(PARALLEL_GROUPS, len(groups))
    if workers == 1:
        loaded = [load(groups[0])]
    else:
        # Spark runs the groups' jobs side by side (one scheduler, shared executors); a failing group leaves the
        # committed ones committed — each is exactly-once on its own, and the rerun loads the rest.
        with ThreadPoolExecutor(workers, thread_name_prefix="snapshot-group") as pool:
            futures = [pool.submit(load, g) for g in groups]
            loaded = []
            errors: list[BaseException] = []
            for future in futures:
                try:
                    loaded.append(future.result())
                except BaseException as exc:  # noqa: BLE001 - the first one is raised once all ended
                    errors.append(exc)
            if errors:
                raise errors[0]
    for rows in loaded:
        result.rows.update(rows)
    result.applied = bool(result.rows)
    # "stage": Spark building the COPY text, "apply": the load transactions (their COPYs took ``copy``): summed
    # over the groups, which overlap; "wall": the whole snapshot
    result.seconds = {k: round(v, 3) for k, v in seconds.items()} | {"wall": round(time.monotonic() - started, 3)}
    return result


def load_transaction(target: Any, slot: str, lsn: int, sync_table: str, group: Sequence[PlannedTable],
                     chunks: Callable[[PlannedTable], Iterator[bytes]],
                     copied: Callable[[PlannedTable, int], None] = lambda _table, _rows: None,
                     passed: tuple[type[BaseException], ...] = (),
                     ) -> tuple[dict[str, dict[str, int]], float]:
    """One atomic group's transaction on a connection of its own: TRUNCATE, COPY of each table's ``chunks``
    (parents first) — ``copied`` with its row count, which may stop the load by raising — its watermark and sync
    LSN, COMMIT. The rows committed by target table (none when the sync marks show the group loaded at ``lsn``)
    and the seconds the COPYs took. Errors are ``ApplyError``s naming the snapshot and the group, except ours
    and ``passed`` (what a ``chunks`` or ``copied`` of the caller raises on purpose), raised as they are.

    The run's slot lock is held by the driver's session connection (``PostgresTarget.session``), so no other
    apply of the slot writes these marks; they are read again here, inside the transaction that sets them, once
    before and once after ``TRUNCATE`` takes its lock: another load of these tables (a streamed one of a later
    snapshot) may have committed while this one waited for it."""
    rows: dict[str, dict[str, int]] = {}
    copy_s = 0.0
    names = ", ".join(t.target for t in group)
    copying = group[0]
    conn = psycopg2.connect(target.dsn)
    try:
        set_replication_role(conn, target.config.session_replication_role)  # like a native table sync worker
        with conn.cursor() as cur:
            before = sync_marks(conn, slot, sync_table)
            if all(before.get(t.target, -1) >= lsn for t in group):
                conn.rollback()
                return rows, copy_s
            cur.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(ident(t.target) for t in group)))
            if loaded_while_waiting(before, sync_marks(conn, slot, sync_table), group, lsn):
                conn.rollback()
                return rows, copy_s
            for t in group:
                copying = t
                copy_started = time.monotonic()
                inserted = copy_into(cur, t.target, t.columns, chunks(t), lambda: target.checkpoint("snapshot_copying"),
                                     passed)
                copy_s += time.monotonic() - copy_started
                target.checkpoint("snapshot_loaded")
                copied(t, inserted)
                rows[t.target] = {"snapshot_rows": inserted}
                mark_synced(cur, target.config.progress_table, sync_table, slot, t.target, lsn, inserted)
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
            target.checkpoint("snapshot_before_commit")
        conn.commit()
        target.checkpoint("snapshot_committed")
    except psycopg2.Error as exc:
        conn.rollback()
        raise load_error(exc, lsn, names) from None
    except FeedError as exc:
        conn.rollback()
        raise unread_rows(lsn, names, copying, exc) from exc.cause
    finally:
        conn.close()
    return rows, copy_s


def loaded_while_waiting(before: dict[str, int], after: dict[str, int], group: Sequence[PlannedTable],
                         lsn: int) -> bool:
    """Whether a table of ``group`` was loaded at ``lsn`` or later between the sync marks read ``before`` and
    ``after`` TRUNCATE took its lock: loading this snapshot would move its marks back."""
    return any(after.get(t.target, -1) >= lsn and after.get(t.target) != before.get(t.target) for t in group)


def mark_synced(cur: Any, progress: str, sync_table: str, slot: str, table: str, lsn: int, rows: int) -> None:
    """Inside a table's load transaction: its watermark *to* the snapshot's LSN (backwards too: a resync) and its
    sync LSN with the rows loaded."""
    cur.execute(sql.SQL(
        "INSERT INTO {} (slot, target_table, end_lsn) VALUES (%s, %s, %s::pg_lsn) "
        "ON CONFLICT (slot, target_table) DO UPDATE SET end_lsn = EXCLUDED.end_lsn, applied_at = now()"
    ).format(ident(progress)), (slot, table, format_lsn(lsn)))
    cur.execute(sql.SQL(
        "INSERT INTO {} (slot, target_table, sync_lsn, rows) VALUES (%s, %s, %s::pg_lsn, %s) "
        "ON CONFLICT (slot, target_table) DO UPDATE SET sync_lsn = EXCLUDED.sync_lsn, "
        "rows = EXCLUDED.rows, synced_at = now()"
    ).format(ident(sync_table)), (slot, table, format_lsn(lsn), rows))


def load_error(exc: psycopg2.Error, lsn: int, names: str) -> ApplyError:
    """A load transaction's server error as ours, without the row value an input function's message quotes."""
    primary = server_primary(exc)  # never row data in an error
    hint = ""
    if exc.pgcode == "0A000":  # TRUNCATE of a table other target tables reference
        hint = "; resync the tables referencing it together with it (--table for each)"
    return ApplyError(f"snapshot at {format_lsn(lsn)} of {names} not applied: [{exc.pgcode}] {primary}{hint}")
