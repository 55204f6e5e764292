"""Snapshot loads overlapped with the snapshot's read: a process that both takes a snapshot and applies it loads
each set of linked tables into the target as soon as the snapshot publishes it, while its readers still copy the
other tables — as a native subscriber's table sync workers each load their table while the others copy theirs.

Nothing of the load's guarantees changes, because nothing of its code does: a set is loaded only once its
manifests are written and its requests removed (``snapshot/run.py`` calls ``published`` then), by
``snapshots.apply_snapshots`` — the same planning, verification of the staged files, and one transaction per
atomic group that TRUNCATEs, COPYs and sets the sync marks (``snapshot.py``). Every other table is held, so a
loader plans only its own set. A crash at any point leaves what a crash of the apply after the snapshot leaves:
groups committed with their sync marks (the rerun skips them) or rolled back (the rerun loads them whole).

The loaders run without Spark: a table whose rows need Spark's transforms (``direct_rows`` is None) fails its
group before the group's transaction begins. Of a set whose load failed, for that or any other reason, the
atomic groups that did not commit are left to the apply that follows the snapshot (the apply loads them, or
reports the error itself); those that committed it skips by their sync marks. A set a foreign key of the target links to a table not loaded yet is left
too (``snapshots.linked_outside``): the apply loads them together, as it does without the overlap.

A table read alone in several chunks is not even waited for: handed to the snapshot as its ``on_published``
(a ``snapshot.run.ChunkListener``), the loader streams each chunk into the table's COPY as its file is written, in
a transaction that commits once the table is published (``streamed.py``); a table it does not take that way is
loaded after its publication as above.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg2

from airflow_provider_pglogical.apply import snapshots
from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.targets.postgres.bookkeeping_schema import qualified
from airflow_provider_pglogical.apply.targets.postgres.copy import server_primary
from airflow_provider_pglogical.apply.targets.postgres.progress import SYNC_TABLE, ensure_sync_table
from airflow_provider_pglogical.apply.targets.postgres.snapshot import PARALLEL_GROUPS, UnreadRows
from airflow_provider_pglogical.apply.targets.postgres.streamed import (
    PUBLISHED,
    ChunkStream,
    NotStreamed,
    load_streamed,
)
from airflow_provider_pglogical.apply.without_spark import needed_spark
from airflow_provider_pglogical.exceptions import format_lsn
from airflow_provider_pglogical.history.recorder import error_line
from airflow_provider_pglogical.snapshot.layout import SnapshotLayout
from airflow_provider_pglogical.snapshot.run import WrittenChunk
from airflow_provider_pglogical.text import first_line

if TYPE_CHECKING:
    from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget

log = logging.getLogger(__name__)

Log = Callable[[str], None]


STREAM_SWITCH = "PGLOGICAL_SNAPSHOT_STREAM_LOAD"


def streams_while_read() -> bool:
    """Whether a table the snapshot reads alone is streamed into its target while it is read (``streamed.py``).
    Opt-in (``PGLOGICAL_SNAPSHOT_STREAM_LOAD=1``): the target table's ``TRUNCATE`` lock is then held for the whole
    read, not just the load (a resync of a live table blocks its readers that long), and a lock another session
    holds on the target table holds up the snapshot's publication of it."""
    return os.environ.get(STREAM_SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


class OverlappedLoad:
    """Loads published snapshot sets (``published``) on ``workers`` threads, each on a connection of its own, under
    one target session (the slot's apply lock) opened at the first publication; ``close`` waits for the loads.

    ``make``: the target (its session ``without_spark.refusing_session``) and the apply config, made at the
    first publication.
    ``published`` never raises and never waits for a load: the snapshot's reading goes on. Called as the
    snapshot's ``on_published`` (``snapshot.run.ChunkListener``), it also streams each table read alone into the
    target while the table is read (``streamed.py``)."""

    def __init__(self, make: Callable[[], tuple[PostgresTarget, ApplyConfig]], *, workers: int = PARALLEL_GROUPS,
                 log: Log | None = None) -> None:
        self._make, self._workers = make, max(1, workers)
        self._log: Log = log or log_info
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue()  # (published at, *tables) or the end
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.rows: dict[str, dict[str, int]] = {}  # target table → its load's counts (``snapshot_rows``)
        self.left: dict[str, str] = {}  # source table → why the apply after the snapshot loads it
        self.seconds = 0.0
        # per set, seconds from the first publication: when it was published, and when its load ended
        self.timeline: list[dict[str, Any]] = []
        self._first: float | None = None
        self._failed: str | None = None  # why the session did not open
        self._closed = False
        self._session: tuple[PostgresTarget, ApplyConfig] | None = None  # once open, for the streamed tables
        # (source table, snapshot LSN) → its chunks streamed while it is read: a publication is answered only by
        # the stream of that snapshot (``publishing``), never by an earlier one of the same table
        self._streams: dict[tuple[str, int], ChunkStream] = {}
        self._handed: dict[str, ChunkStream | None] = {}  # source table → the stream of its publication under way
        self._unscheduled: list[ChunkStream] = []  # streams whose loader waits for the session to open
        self._streaming: list[threading.Thread] = []

    def __call__(self, tables: list[str]) -> None:
        self.published(tables)

    def listener(self) -> Callable[[list[str]], None]:
        """What ``pglogical run`` hands the snapshot as ``on_published``: the loader itself, which also streams a
        table read alone into its target while it is read, when ``PGLOGICAL_SNAPSHOT_STREAM_LOAD`` is on
        (``streams_while_read``); else its ``published``, which loads each set once it is published."""
        return self if streams_while_read() else self.published

    def published(self, tables: Sequence[str]) -> None:
        self._first = self._first if self._first is not None else time.monotonic()
        stream = self._handed.pop(tables[0], None) if len(tables) == 1 else None
        if stream is not None and stream.publish(self._since_first()):
            return  # its loader commits it now
        self._queue.put((self._since_first(), *tables))
        self._start()

    def chunk_written(self, chunk: WrittenChunk) -> None:
        """A chunk of a table read alone is whole: a table of several chunks is streamed into its COPY."""
        if chunk.chunks < 2 or self._closed:
            return  # one chunk: loaded on its publication, nothing to overlap
        with self._lock:
            stream = self._streams.get((chunk.table, chunk.lsn))
            if stream is None:
                stream = self._streams[chunk.table, chunk.lsn] = ChunkStream(chunk)
                self._unscheduled.append(stream)
        stream.add(chunk)
        self._start()
        self._schedule()

    def publishing(self, table: str, lsn: int) -> None:
        stream = self._handed[table] = self._streams.get((table, lsn))
        if stream is not None and stream.publishing():
            self._log(f"snapshot of {table} at {format_lsn(lsn)} not streamed while it was read: its loader had not "
                      "started (no load slot free, or no target session) when its last chunk was written")

    def _schedule(self) -> None:
        """Once the session is open, each new stream's loader starts as soon as one of the target's load slots is
        free (``LoadSlots.start_when_free``): none waits for a slot on a thread and connection of its own."""
        with self._lock:  # ``_run`` sets and clears the session under the lock
            session = self._session
            if session is None:
                return  # ``_run`` schedules them once it opens
            streams, self._unscheduled = self._unscheduled, []
        target, config = session
        for stream in streams:
            target.group_loads.start_when_free(functools.partial(self._start_stream, stream, target, config))

    def _start_stream(self, stream: ChunkStream, target: PostgresTarget, config: ApplyConfig) -> bool:
        """In a load slot just freed: start ``stream``'s loader, unless the table was read whole before (it is
        loaded after its publication), the snapshot's steps ended, or the session it was scheduled under did."""
        with self._lock:  # checked again, and started and listed under it: ``_run``'s last join pass sees it
            if self._session is None or self._session[0] is not target or not stream.claim():
                return False
            thread = threading.Thread(target=self._stream, args=(stream, target, config), name="snapshot-stream",
                                      daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # no thread to be had: the slot goes on, the table loads after publication
                stream.drop()
                why = exc
            else:
                self._streaming.append(thread)
                return True
        self._log(f"snapshot of {stream.table} at {format_lsn(stream.lsn)} not streamed while it was read: its "
                  f"loader did not start ({why})")
        return False

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="snapshot-overlap", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Wait for every published set's load and end the session (the slot's apply lock, the connections): the
        run's apply must not start while they hold the lock. Called again, it does nothing."""
        if self._thread is None or self._closed:
            return
        self._closed = True
        for stream in list(self._streams.values()):
            stream.end()
        for _ in range(self._workers):
            self._queue.put(None)
        self._thread.join()
        # Sets published after the session failed to open: nobody took them
        self._leave(self._drain(), self._failed or "not loaded")

    def __enter__(self) -> OverlappedLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def summary(self) -> dict[str, Any]:
        return {"rows": self.rows, "left_to_apply": self.left, "seconds": round(self.seconds, 3),
                "timeline": self.timeline}

    def _since_first(self) -> float:
        return round(time.monotonic() - (self._first or time.monotonic()), 3)

    def _run(self) -> None:
        started = time.monotonic()
        try:
            target, config = self._make()
            with target.session(config.slot):
                # Once, before the loaders: two CREATE TABLE IF NOT EXISTS at once can both try to create it
                ensure_sync_table(target.conn, qualified(target.bookkeeping_schema, SYNC_TABLE))
                with self._lock:
                    self._session = target, config
                try:
                    self._schedule()
                    threads = [threading.Thread(target=self._work, args=(target, config),
                                                name=f"snapshot-overlap-{i}", daemon=True) for i in range(self._workers)]
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
                finally:
                    with self._lock:  # no loader starts under it any more (``_start_stream`` checks under the lock)
                        self._session = None
                    # the loaders started before: their connections must end while the session still holds the lock
                    while streaming := [t for t in self._streaming if t.is_alive()]:
                        for thread in streaming:
                            thread.join()
        except Exception as exc:  # noqa: BLE001 - the apply after the snapshot loads every set, or reports it
            self._failed = _why(exc)
            self._leave(self._drain(), self._failed)
        self.seconds = time.monotonic() - started

    def _stream(self, stream: ChunkStream, target: PostgresTarget, config: ApplyConfig) -> None:
        """Stream one table's chunks into its target (``streamed.load_streamed``) in the load slot it was started
        in, released at the end; a table not taken is loaded on its publication (the log says why), one that
        failed after it was handed over is left to the apply, saying why."""
        try:
            with target.sibling() as mine:
                rows = load_streamed(mine, config, stream)
            with self._lock:
                self.rows.update(rows)
                self.timeline.append({"tables": [stream.table], "published_s": stream.published_s,
                                      "loaded_s": self._since_first(), "streamed_chunks": stream.chunks})
            for table in rows:
                self._log(f"snapshot of {table} at {format_lsn(stream.lsn)} loaded while it was read "
                          f"({stream.chunks} chunks COPYed as written)")
        except Exception as exc:  # noqa: BLE001 - loaded after its publication, or by the apply (which reports it)
            stream.drop()
            why = str(exc) if isinstance(exc, NotStreamed) else _why(exc)
            if stream.state == PUBLISHED:
                self._leave([stream.table], why)
            else:
                self._log(f"snapshot of {stream.table} at {format_lsn(stream.lsn)} not streamed while it was read: "
                          f"{why}")
        finally:
            target.group_loads.release()

    def _drain(self) -> list[str]:
        """The sets published but not taken by a loader (their session never opened)."""
        tables: list[str] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return tables
            tables.extend(item[1:] if item else ())

    def _work(self, session: PostgresTarget, config: ApplyConfig) -> None:
        try:
            with session.sibling() as mine:
                while (item := self._queue.get()) is not None:
                    published_s, group = item[0], tuple(item[1:])
                    try:
                        if self._load(mine, config, group):
                            with self._lock:
                                self.timeline.append({"tables": list(group), "published_s": published_s,
                                                      "loaded_s": self._since_first()})
                    except Exception as exc:  # noqa: BLE001 - the apply loads what did not commit (or reports it)
                        why = "its rows need Spark's transforms" if needed_spark(exc) else _why(exc)
                        self._leave(self._not_committed(mine, config, group), why)
        except Exception as exc:  # noqa: BLE001 - its connection did not open: the other loader, or ``close``, goes on
            self._failed = self._failed or _why(exc)

    def _load(self, target: PostgresTarget, config: ApplyConfig, group: tuple[str, ...]) -> bool:
        """Load ``group``'s snapshot; whether any of it loaded now. A group the apply must load (with tables
        outside it, or held by ``snapshots.waiting``) is left to it, named with the reason."""
        linked = snapshots.linked_outside(config, target, group)
        if linked:
            self._leave(group, f"linked by a foreign key of the target to {', '.join(linked)}: loaded with it by "
                               "the apply")
            return False
        layout = SnapshotLayout.from_uri(config.staging_root, config.slot)
        others = set(config.tables or layout.tables()) - set(group)
        waiting = snapshots.waiting(config, target)
        reports = snapshots.apply_snapshots(target.on_demand, config, target, waiting | others)
        if not reports:
            if held := sorted(set(group) & waiting):
                self._leave(group, f"held: {', '.join(held)} waits for a snapshot still requested; loaded by the "
                                   "apply")
            return False  # else loaded before (its sync marks are at the snapshot)
        for report in reports:
            if report.rows:  # else loaded before (the sync marks said so)
                with self._lock:
                    self.rows.update(report.rows)
                self._log(f"snapshot of {', '.join(report.rows)} at {format_lsn(report.start_lsn)} loaded while "
                          "the snapshot reads on")
        return any(report.rows for report in reports)

    def _not_committed(self, target: PostgresTarget, config: ApplyConfig, group: tuple[str, ...]) -> list[str]:
        """The tables of a set whose load failed that the apply must load: each atomic group committed on its own,
        so those the sync marks show loaded are not left (all of them when the marks cannot be read)."""
        try:
            target.conn.rollback()
            return snapshots.unloaded(config, target, group)
        except Exception:  # noqa: BLE001 - the apply finds the committed ones by their marks all the same
            return list(group)

    def _leave(self, tables: Sequence[str], why: str) -> None:
        if not tables:
            return
        with self._lock:
            self.left.update(dict.fromkeys(tables, why))
        self._log(f"snapshot of {', '.join(tables)} left to the apply after the snapshot: {why}")


def _why(exc: BaseException) -> str:
    """A loader's error as one line that quotes no row value (it goes into the run's JSON and log): ours with its
    message, a server error by its SQLSTATE and primary message without the values it quotes
    (``copy.server_primary``), a connection's failure by its first line, a failed read of staged rows
    without the way out (the table is loaded again after its publication, or by the apply, which names it),
    anything else by its type."""
    if isinstance(exc, UnreadRows):
        return exc.reason
    code = getattr(exc, "pgcode", None)
    if isinstance(exc, psycopg2.Error) and code:
        return f"{type(exc).__name__} (SQLSTATE {code}): {server_primary(exc)}"
    if isinstance(exc, psycopg2.Error):
        return f"{type(exc).__name__}: {first_line(str(exc), '')}"
    return error_line(exc)


def log_info(message: str) -> None:
    log.info("%s", message)
