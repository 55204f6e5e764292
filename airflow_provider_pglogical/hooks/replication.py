"""Slot rows over a logical replication connection (``replication=database``, ``START_REPLICATION ... LOGICAL``).

The SQL peek (``pg_logical_slot_peek_binary_changes``) materialises its whole result on the server before
the first row, so the client's decoding comes after the server's. A walsender streams each message as
it decodes it: both run at once. The rows are the peek's: a message's ``dataStart`` is the peek's
``lsn``; the peek's ``xid`` is not sent per message, and the rows carry 0 (the decoder reads a
transaction's xid from its Begin; only a non-transactional message's staged ``xid`` loses it).

The read is bounded like the peek's ``upto_lsn`` (``decoding._speedups.repl_step``): no transaction
whose commit starts at or after the bound and no message outside a transaction starting there is taken;
the read ends at a commit, or a keepalive, at or past the bound with no transaction open. Nothing is
confirmed to the server except ``confirm(lsn)`` — the end of a published batch — and keepalives asking
for a reply are answered with that position; while nothing reads the stream (a batch being published), a
status update every ``HEARTBEAT_S`` repeats it, so ``wal_sender_timeout`` never ends a stream whose client is
busy. The walsender holds the slot while the stream is open;
``close()`` returns once the server has released it, so the slot can be read or advanced through SQL.

The compiled module's libpq reads the stream (COPY BOTH, socket waits without the GIL); ``split_messages``
is the Python reference of its bound rule. A thread of the stream's own reads it up to ``READ_AHEAD_BYTES``
ahead of the decoder (``hooks.readahead``), so the walsender is not kept waiting on a full socket while the
client stages; ``PGLOGICAL_STREAM_READ_AHEAD=0`` reads it on the decoder's thread instead (the reference). Either
way ``blocks()`` ends only at the bound: a stream stopped before it (closed, or broken) raises.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Literal, cast

import psycopg2

from airflow_provider_pglogical.decoding import speedups
from airflow_provider_pglogical.environ import whole_number
from airflow_provider_pglogical.exceptions import ReplicationConnectionError, StagingError, format_lsn
from airflow_provider_pglogical.hooks import copystream, errors
from airflow_provider_pglogical.hooks.readahead import ReadAhead, ReadAheadClosed
from airflow_provider_pglogical.text import first_line

log = logging.getLogger(__name__)

Row = tuple[int, int, bytes]
SplitState = Literal["more", "bound", "keepalive"]

IDLE_WAIT_MS = 1000  # nothing for this long: ask the walsender for a keepalive (its position)
EXIT_WAIT_S = 1.0  # how long close() lets the walsender notice the closed connection before ending it
RELEASE_WAIT_S = 10.0  # how long close() waits for the walsender to release the slot
HEARTBEAT_S = 1.0  # status updates while nothing reads the stream (a batch being published): wal_sender_timeout
# Bytes of rows (messages and their Python objects) read ahead of the decoder: a walsender replaying a large
# transaction at its commit sends without waiting for the client up to this much.
READ_AHEAD_BYTES = 64 << 20
READ_AHEAD_ENV = "PGLOGICAL_STREAM_READ_AHEAD"  # bytes to read ahead instead; 0: read on the decoder's thread
ROW_OVERHEAD = 128  # bytes of a row's tuple, int and bytes objects beside its message
RUN_AGAIN = "run the drain again: it reads on from the last published batch (nothing past it was confirmed)"


def split_messages(messages: Sequence[bytes], bound: int, in_tx: bool) -> tuple[list[Row], bool, SplitState]:
    """The rows ``messages`` (CopyData of a replication stream) give up to ``bound``, whether a transaction is
    still open after them, and where the split stopped: ``'bound'`` (the read ends), ``'keepalive'`` (the
    read answers it and goes on) or ``'more'``. The Python reference of ``_speedups.repl_split``."""
    rows: list[Row] = []
    for m in messages:
        if len(m) >= 18 and m[:1] == b"k":
            (wal_end,) = struct.unpack_from(">Q", m, 1)
            return rows, in_tx, "bound" if not in_tx and wal_end >= bound else "keepalive"
        if len(m) < 26 or m[:1] != b"w":
            raise ValueError("unexpected replication message")
        (lsn,) = struct.unpack_from(">Q", m, 1)
        kind = m[25:26]
        if not in_tx:
            if kind == b"B":
                if len(m) < 34:
                    raise ValueError("unexpected replication message")
                (final_lsn,) = struct.unpack_from(">Q", m, 26)
                if final_lsn >= bound:  # commits at or past the bound: the next read sends it again
                    return rows, in_tx, "bound"
                in_tx = True
            # else a message: its lsn is its record's end, which may start before the bound (the peek takes it
            # then); taken, it ends the read below, and the batch ends at its end
        elif kind == b"C":
            in_tx = False
        rows.append((lsn, 0, m[25:]))
        if not in_tx and lsn >= bound:  # a commit or message ending at or past the bound: nothing more before it
            return rows, in_tx, "bound"
    return rows, in_tx, "more"


def read_ahead_bytes() -> int:
    """``READ_AHEAD_BYTES``, or the bytes ``PGLOGICAL_STREAM_READ_AHEAD`` gives (0: no read-ahead); anything but a
    whole number of bytes is a ``StagingError``."""
    return whole_number(READ_AHEAD_ENV, READ_AHEAD_BYTES, "bytes", "0 reads on the decoder's thread", StagingError)


def block_bytes(block: Sequence[Row]) -> int:
    """What a block of rows holds in memory, about: its messages and ``ROW_OVERHEAD`` a row."""
    return sum(len(row[2]) for row in block) + ROW_OVERHEAD * len(block)


def _heartbeat(stream: weakref.ref[ReplicationStream], stopped: threading.Event) -> None:
    """Every ``HEARTBEAT_S`` until stopped (or the stream is gone), the stream's status update: the walsender
    ends a stream whose client stays silent for ``wal_sender_timeout``, and nothing reads it while a batch
    is written and published."""
    while not stopped.wait(HEARTBEAT_S):
        current = stream()
        if current is None:
            return
        current._beat()
        del current


def start_command(slot: str, start_lsn: int, options: Sequence[str]) -> bytes:
    """``START_REPLICATION SLOT "slot" LOGICAL X/X (name 'value', ...)`` for pgoutput options as name/value pairs."""
    quoted = '"' + slot.replace('"', '""') + '"'
    pairs = ", ".join(f"{options[i]} '{options[i + 1].replace(chr(39), chr(39) * 2)}'"
                      for i in range(0, len(options), 2))
    return f"START_REPLICATION SLOT {quoted} LOGICAL {format_lsn(start_lsn)} ({pairs})".encode()


def available() -> bool:
    """Whether the compiled module can read a replication stream here (built with libpq)."""
    compiled = speedups.compiled
    return compiled is not None and hasattr(compiled, "repl_read")


class ReplicationStream:
    """One slot's changes from ``start_lsn`` up to ``bound`` over a replication connection of its own.

    ``blocks()`` yields the peek-shaped ``(lsn, 0, data)`` rows in lists of up to ``itersize`` and ends at
    the bound with the stream still open, so the last batch's end can be confirmed through it too;
    ``confirm(lsn)`` reports ``lsn`` as flushed (only ever a published batch's end); ``close()`` ends the
    stream and returns once the server has released the slot. Every reader calls ``close()`` (in a ``finally``):
    the read-ahead thread waits for its consumer until then, the walsender holding the slot. ``slot_pid`` gives the slot's
    ``active_pid`` (None when free): a walsender decoding a long stretch with nothing to send does not
    look at its connection, so ours (the replication connection's own server process) still holding the
    slot after ``EXIT_WAIT_S`` is ended (``pg_terminate_backend`` through ``terminate``); a status update
    it had not read is then lost, and the drain advances the slot through SQL instead. ``read_ahead``: bytes
    of rows a thread of the stream's own reads ahead of ``blocks()``' consumer (None: ``read_ahead_bytes()``;
    0: read on the consumer's thread); a position confirmed meanwhile is sent by that thread after its current read.
    """

    def __init__(self, session: psycopg2.extensions.connection, slot: str, options: Sequence[str], *,
                 start_lsn: int, bound: int, itersize: int, slot_pid: Callable[[], int | None],
                 terminate: Callable[[int], None], read_ahead: int | None = None) -> None:
        if not available():
            raise ReplicationConnectionError(
                "the streamed read needs the compiled module built with libpq (pip install with libpq headers)",
                hint="read through SQL (source.read: sql)")
        self.slot, self.bound, self.itersize = slot, bound, max(int(itersize), 1)
        self.confirmed = start_lsn
        self._slot_pid, self._terminate = slot_pid, terminate
        self.done = False  # every row up to the bound given to blocks()' consumer
        self._reached = False  # the read (on whichever thread) reached the bound
        self.read_ahead = read_ahead_bytes() if read_ahead is None else max(int(read_ahead), 0)
        self._ahead: ReadAhead[Row] | None = None
        self._report = False  # a confirmed position for the read-ahead thread to send after its current read
        self._compiled: Any = cast(Any, speedups.compiled)  # checked by available()
        try:
            self._conn: copystream.LibpqConnection | None = copystream.LibpqConnection.like(
                session, replication="database", client_encoding=session.encoding)
        except (psycopg2.OperationalError, copystream.UnsupportedConnection) as exc:
            first = first_line(str(exc), type(exc).__name__)
            raise ReplicationConnectionError(f"the server refused a replication connection for slot {slot!r}: "
                                             f"{first}") from None
        self._pid = self._conn.backend_pid()  # our walsender, once START_REPLICATION is accepted
        # One user of the connection at a time: the reader, a status update, or the heartbeat.
        self._using = threading.Lock()
        self._stopped = threading.Event()
        self._heartbeat: threading.Thread | None = None
        refused = self._compiled.copy_start(self._conn.handle, start_command(slot, start_lsn, options))
        if refused is not None:
            self.close(wait=False)  # never ours: the slot may be another consumer's
            raise self._failed(*refused)
        # The heartbeat holds the stream weakly: one dropped unread without close() is not kept alive (holding the
        # slot). A read-ahead thread holds it until close(), which every reader calls (``blocks()`` on its own end).
        self._heartbeat = threading.Thread(target=_heartbeat, args=(weakref.ref(self), self._stopped),
                                           name=f"replication-heartbeat-{slot}", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        """A status update (the confirmed position) unless the stream is being read (the reader answers
        keepalives itself). A failed update is left to the next read or confirm, which see the broken
        connection and raise."""
        if not self._using.acquire(blocking=False):
            return
        try:
            if self._conn is not None:
                self._compiled.repl_status(self._conn.handle, self.confirmed, False)
        finally:
            self._using.release()

    def _failed(self, sqlstate: str, message: str, *, ended: bool = False) -> Exception:
        """The typed error of a refused (or, ``ended``, a broken) stream: the SQL read's for what it
        recognises (``hooks.errors``), else a ``ReplicationConnectionError``; one line."""
        typed = errors.translate_state(sqlstate, message, slot=self.slot)
        if typed is not None:
            return typed
        first = first_line(message, "connection lost")
        if ended:
            return ReplicationConnectionError(f"the stream of slot {self.slot!r} ended before its bound: {first}",
                                              hint=RUN_AGAIN)
        # The connection was accepted: the command failed, so the connection hint (pg_hba.conf) does not apply.
        return ReplicationConnectionError(f"START_REPLICATION of slot {self.slot!r} failed ({sqlstate or 'connection'}): "
                                          f"{first}", hint="")

    def blocks(self) -> Generator[list[Row], None, None]:
        """The rows up to the bound; closing the generator early closes the stream. A stream closed (or broken)
        before its bound raises ``ReplicationConnectionError``, never ends: what was read ahead and not given is
        gone, and a drain taking that end as the bound's would publish past transactions it never staged."""
        done = False
        try:
            if self.read_ahead > 0:
                self._ahead = ReadAhead(self._read(), self.read_ahead, block_bytes,
                                        name=f"replication-read-{self.slot}")
                try:
                    yield from self._ahead
                except ReadAheadClosed:
                    raise self._ended_early() from None
            else:
                yield from self._read()
            if not self._reached:  # never reported as read to the bound
                raise self._ended_early()
            done = self.done = True
        finally:
            if not done:
                self.close()

    def _ended_early(self) -> ReplicationConnectionError:
        return ReplicationConnectionError(f"the stream of slot {self.slot!r} ended before its bound", hint=RUN_AGAIN)

    def _read(self) -> Generator[list[Row], None, None]:
        """The rows up to the bound, read on the thread iterating it."""
        in_tx = False
        while True:
            if self._conn is None or self._stopped.is_set():  # closed: the rest is never read
                raise self._ended_early()
            if self._report:
                self._report = False
                self._status(reply=False)
            with self._using:
                rows, in_tx, state, error = self._compiled.repl_read(
                    self._conn.handle, self.itersize, self.bound, in_tx, self.confirmed, IDLE_WAIT_MS)
            if rows:
                yield rows
            if state == "bound":
                self._reached = True
                return
            if state == "ended":
                raise self._failed(*(error or ("", "the server ended the stream")), ended=True)
            if state == "idle":  # ask for the walsender's position: a keepalive (its walEnd) answers
                self._status(reply=True)

    @property
    def open(self) -> bool:
        return self._conn is not None

    def confirm(self, lsn: int) -> None:
        """Report ``lsn`` as written, flushed and applied: the slot's ``confirmed_flush_lsn`` moves there."""
        if lsn > self.confirmed:
            self.confirmed = lsn
        if self._ahead is not None and self._ahead.running:
            self._report = True  # sent by the reading thread after its current read (else by the heartbeat)
        elif self._conn is not None:
            self._status(reply=False)

    def _status(self, *, reply: bool) -> None:
        """The confirmed position, read under the lock: a later confirm's position is never overtaken by an
        earlier one's, so the position sent never goes backwards."""
        assert self._conn is not None
        with self._using:
            failed = self._compiled.repl_status(self._conn.handle, self.confirmed, reply)
        if failed is not None:
            raise ReplicationConnectionError(f"streaming slot {self.slot!r} failed: "
                                             f"{first_line(str(failed), 'connection lost')}",
                                             hint=RUN_AGAIN)

    def close(self, *, wait: bool = True) -> None:
        """Ends the stream (closing its connection) and, with ``wait``, waits up to ``RELEASE_WAIT_S`` for our
        walsender (this connection's server process) to release the slot, ending it if it has not noticed
        after ``EXIT_WAIT_S``. No other process is ever ended: a slot held by another pid is not ours."""
        self._stopped.set()
        if self._ahead is not None:  # stopped before the connection closes under it
            self._ahead.close()
        if self._heartbeat is not None:  # none when START_REPLICATION was refused
            self._heartbeat.join()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._report:  # best effort: the drain advances the slot through SQL after the stream anyway
            self._report = False
            self._compiled.repl_status(conn.handle, self.confirmed, False)
        conn.close()
        if not wait:
            return
        try:
            self._wait_released()
        except Exception as exc:  # noqa: BLE001 - close() runs on a failed run too: never replace its error
            log.warning("slot %s: could not wait for its walsender (pid %d) to release it: %s", self.slot,
                        self._pid, first_line(str(exc), type(exc).__name__))

    def _wait_released(self) -> None:
        started = time.monotonic()
        ended = False
        while self._slot_pid() == self._pid and (elapsed := time.monotonic() - started) < RELEASE_WAIT_S:
            if not ended and elapsed >= EXIT_WAIT_S:
                log.info("slot %s: ending its walsender (pid %d), still decoding after the stream closed",
                         self.slot, self._pid)
                self._terminate(self._pid)
                ended = True
            time.sleep(0.01)

    def __iter__(self) -> Iterator[Row]:
        for block in self.blocks():
            yield from block

