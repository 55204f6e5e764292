"""Blocks of an iterator taken on a thread of their own, up to a bound of bytes ahead of their consumer.

A walsender sends a transaction's changes as it replays them at its commit, and waits on a full socket: a
client that reads only between staging its blocks keeps it waiting, so the server's decoding of the next
transaction starts only once the client has caught up. Taking the blocks on a thread of their own (the compiled
reader waits on the socket without the GIL) lets the walsender go on while the client stages. Nothing changes
but when the blocks are taken: the consumer gets the same blocks in the same order, and the source's error
after the last block it gave; a read-ahead closed before its end (blocks or an error it held dropped, or its thread
stopped before its source ended) raises when read on, never ends as its source would. One closed after its thread
reached the source's end and gave everything ends as its source would.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadAheadClosed(RuntimeError):
    """A ``ReadAhead`` iterated after ``close()``: the blocks it had not given were dropped, so its end is not the
    source's."""


class ReadAhead(Generic[T]):
    """``source``'s blocks, taken by a thread started here; iterate it once. The thread asks ``source`` for a block
    only while fewer than ``limit`` bytes (``size`` of each block) wait for the consumer, so the blocks taken and not
    yet given hold less than ``limit`` plus the last one. ``close()`` stops the thread (it finishes the block it is
    taking), then closes ``source`` on it; the blocks not given are dropped, and iterating it after that raises
    ``ReadAheadClosed`` (never the end of the source) unless nothing was dropped: the thread had reached the
    source's end and every block and error was given, so it ends as the source would. A consumer that does not iterate to the end must call
    ``close()``: until then the thread waits for it, holding ``source`` open."""

    def __init__(self, source: Iterator[list[T]], limit: int, size: Callable[[list[T]], int], *, name: str) -> None:
        self._source, self._limit, self._size = source, max(int(limit), 1), size
        self._ready: deque[tuple[list[T], int]] = deque()
        self._held = 0  # bytes in _ready
        self._changed = threading.Condition()
        self._stopped = False  # close() was called
        self._dropped = False  # close() found blocks, an error or the source's end not yet given
        self._finished = False  # the thread has taken its last block
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._take, name=name, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the thread may still take a block (false once the source ended or ``close()`` stopped it)."""
        with self._changed:
            return not self._finished

    @property
    def held(self) -> int:
        """Bytes taken and not yet given to the consumer."""
        with self._changed:
            return self._held

    def _take(self) -> None:
        try:
            while self._room():  # the bound first: a block asked for is held until it is given
                block = next(self._source, None)
                if block is None or not self._hold(block, self._size(block)):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, after the blocks before it
            self._error = exc
        finally:
            try:
                close = getattr(self._source, "close", None)
                if close is not None:
                    close()
            except BaseException as exc:  # noqa: BLE001 - the consumer's too (after the source's own error)
                if self._error is None:
                    self._error = exc
            with self._changed:
                self._finished = True
                self._changed.notify_all()

    def _room(self) -> bool:
        """Waits while the bound is reached; whether to go on (false once ``close()`` was called)."""
        with self._changed:
            while self._held >= self._limit and not self._stopped:
                self._changed.wait()
            return not self._stopped

    def _hold(self, block: list[T], nbytes: int) -> bool:
        """``block`` made ready for the consumer; false (dropped) once ``close()`` was called."""
        with self._changed:
            if self._stopped:
                return False
            self._ready.append((block, nbytes))
            self._held += nbytes
            self._changed.notify_all()
            return True

    def __iter__(self) -> Generator[list[T], None, None]:
        while True:
            with self._changed:
                while not self._ready and not self._finished and not self._stopped:
                    self._changed.wait()
                if self._dropped:
                    raise ReadAheadClosed("blocks read ahead were dropped by close()")
                if not self._ready:
                    error, self._error = self._error, None
                    if error is not None:
                        raise error
                    return
                block, nbytes = self._ready.popleft()
                self._held -= nbytes
                self._changed.notify_all()
            yield block

    def close(self) -> None:
        """Stops the thread and waits for it (it finishes the block it is taking); blocks not given are dropped.
        Never raises: it runs on failed reads too (an error closing the source reaches a consumer that iterates
        to the end)."""
        with self._changed:
            # Sticky: a second close() finds the thread finished and nothing ready, yet the first one dropped.
            self._dropped = (self._dropped or bool(self._ready) or not self._finished
                             or self._error is not None)
            self._stopped = True
            self._ready.clear()
            self._held = 0
            self._changed.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
