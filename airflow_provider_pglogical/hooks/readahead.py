"""Blocks of an iterator taken on a thread of their own, up to a bound of bytes ahead of their consumer.

A walsender sends a transaction's changes as it replays them at its commit, and waits on a full socket: a
client that reads only between staging its blocks keeps it waiting, so the server's decoding of the next
transaction starts only once the client has caught up. Taking the blocks on a thread of their own (the compiled
reader waits on the socket without the GIL) lets the walsender go on while the client stages. Nothing changes
but when the blocks are taken: the consumer gets the same blocks in the same order, and the source's error
after the last block it gave.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """``source``'s blocks, taken by a thread started here while fewer than ``limit`` bytes (``size`` of each
    block) wait for the consumer; iterate it once. ``close()`` stops the thread (at most one more block is
    taken), then closes ``source`` on it; a consumer that ends early must call it."""

    def __init__(self, source: Iterator[list[T]], limit: int, size: Callable[[list[T]], int], *, name: str) -> None:
        self._source, self._limit, self._size = source, max(int(limit), 1), size
        self._ready: deque[tuple[list[T], int]] = deque()
        self._held = 0  # bytes in _ready
        self._changed = threading.Condition()
        self._stopped = False
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
            for block in self._source:
                nbytes = self._size(block)
                with self._changed:
                    while self._held >= self._limit and not self._stopped:
                        self._changed.wait()
                    if self._stopped:
                        return
                    self._ready.append((block, nbytes))
                    self._held += nbytes
                    self._changed.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, after the blocks before it
            self._error = exc
        finally:
            close = getattr(self._source, "close", None)
            try:
                if close is not None:
                    close()
            finally:
                with self._changed:
                    self._finished = True
                    self._changed.notify_all()

    def __iter__(self) -> Generator[list[T], None, None]:
        while True:
            with self._changed:
                while not self._ready and not self._finished:
                    self._changed.wait()
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
        """Stops the thread and waits for it (it finishes the block it is taking); blocks not consumed are dropped."""
        with self._changed:
            self._stopped = True
            self._ready.clear()
            self._held = 0
            self._changed.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
