"""Progress lines for long decodes and applies: at least every ``interval`` seconds, from a heartbeat thread.

The work loop only sets counters (cheap, no clock reads per row); a daemon thread wakes every
``interval`` seconds and logs rows, bytes, rates and an ETA when the total is known. The thread
also covers the stretches where the loop cannot report: the server materialising a peek's whole
result before the first row, or one Spark job running for minutes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from types import TracebackType
from typing import Any, TypeVar

DEFAULT_INTERVAL_S = 30.0
Row = TypeVar("Row", bound=tuple[Any, ...])
T = TypeVar("T")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def human_seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """A long step's progress, logged by a heartbeat thread while the step runs (use as a context manager).

    :param what: what is being done, first words of each line (``"decode slot s1"``)
    :param log: where lines go (``logger.info``)
    :param total_bytes: the step's size when known: enables the percentage and ETA
    :param interval: seconds between lines
    :param detail: called only when a line is written, for extra state (read from the heartbeat thread)
    """

    def __init__(self, what: str, log: Callable[[str], object], *, total_bytes: int | None = None,
                 interval: float = DEFAULT_INTERVAL_S, detail: Callable[[], str] | None = None) -> None:
        self.what = what
        self.log = log
        self.total_bytes = total_bytes
        self.interval = interval
        self.rows = 0
        self.done_bytes = 0
        self.phase = ""
        self.detail = detail
        self.lines = 0
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def update(self, *, rows: int | None = None, done_bytes: int | None = None, phase: str | None = None) -> None:
        """Record where the step is (absolute counts); called from the work loop."""
        if rows is not None:
            self.rows = rows
        if done_bytes is not None:
            self.done_bytes = done_bytes
        if phase is not None:
            self.phase = phase

    def line(self, now: float | None = None) -> str:
        """The current progress as one line."""
        elapsed = max((now if now is not None else time.monotonic()) - self._started, 1e-9)
        parts = [f"{self.what}: {self.rows} rows"]
        size = human_bytes(self.done_bytes)
        if self.total_bytes:
            size += f" of {human_bytes(self.total_bytes)} ({100.0 * self.done_bytes / self.total_bytes:.1f}%)"
        parts.append(size)
        parts.append(f"{self.rows / elapsed:.0f} rows/s, {human_bytes(self.done_bytes / elapsed)}/s")
        if self.total_bytes and self.done_bytes > 0:
            remaining = max(self.total_bytes - self.done_bytes, 0)
            parts.append(f"ETA {human_seconds(remaining / (self.done_bytes / elapsed))}")
        else:
            parts.append("ETA unknown")
        parts.append(f"elapsed {human_seconds(elapsed)}")
        if self.phase:
            parts.append(self.phase)
        if self.detail is not None:
            parts.append(self.detail())
        return ", ".join(parts)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.log(self.line())
                self.lines += 1
            except Exception:  # noqa: BLE001 - a progress line must never break the step
                pass

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="pglogical-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def metered_rows(rows: Iterable[Row], progress: Progress, start_lsn: int, chunk: int = 4096) -> Iterator[Row]:
    """Pass ``(lsn, xid, data)`` rows through, telling ``progress`` the rows and WAL bytes read so far
    once per ``chunk`` rows (WAL bytes: the LSN reached minus ``start_lsn``)."""
    for block in metered_blocks(rows, progress, start_lsn, chunk):
        yield from block


def metered_blocks(rows: Iterable[Row], progress: Progress, start_lsn: int, chunk: int = 4096) -> Iterator[list[Row]]:
    """``metered_rows`` handing the rows on in lists of ``chunk`` (what the decoder's compiled path takes), or in
    the lists they were read in when ``rows`` has ``blocks()`` (``hooks.copystream.RowBlocks``)."""
    blocks = getattr(rows, "blocks", None)
    n = 0
    for block in blocks() if blocks is not None else chunked(rows, chunk):
        if block:
            n += len(block)
            progress.update(rows=n, done_bytes=max(int(block[-1][0]) - start_lsn, 0))
            yield block


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last one shorter), none empty; ``size`` must be at least 1."""
    if size < 1:
        raise ValueError(f"chunked: size {size} is below 1")
    it = iter(items)
    while block := list(islice(it, size)):
        yield block
