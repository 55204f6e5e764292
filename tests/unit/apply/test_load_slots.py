"""``snapshot.LoadSlots``: loads that wait for a slot (``with``) and loads started once one is free
(``start_when_free``) share ``n`` slots — never more at once, and a start that declines or raises gives its slot
back, so that no later load waits forever. ``streamed.ChunkStream``: a stream takes one publication only."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.targets.postgres.overlap import OverlappedLoad
from airflow_provider_pglogical.apply.targets.postgres.snapshot import PARALLEL_GROUPS, LoadSlots
from airflow_provider_pglogical.apply.targets.postgres.streamed import PUBLISHED, ChunkStream
from airflow_provider_pglogical.snapshot.run import WrittenChunk

WAIT_S = 10.0


class Busy:
    """Counts the loads running at once."""

    def __init__(self) -> None:
        self.now = self.most = self.done = 0
        self._lock = threading.Lock()

    def run(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.002)
        with self._lock:
            self.now -= 1
            self.done += 1


def _group_load(slots: LoadSlots) -> threading.Event:
    """A group load on a thread of its own: set once it holds a slot."""
    entered = threading.Event()

    def load() -> None:
        with slots:
            entered.set()

    threading.Thread(target=load, daemon=True).start()
    return entered


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["with", "start", "refuse", "raise"]), min_size=1, max_size=12))
def test_streams_and_group_loads_together_never_exceed_the_slots_and_each_runs(kinds):
    slots, busy = LoadSlots(PARALLEL_GROUPS), Busy()
    threads: list[threading.Thread] = []
    threads_lock = threading.Lock()

    def grouped() -> None:
        with slots:
            busy.run()

    def streamed() -> None:
        try:
            busy.run()
        finally:
            slots.release()

    def start(kind: str) -> bool:
        if kind == "refuse":
            return False
        if kind == "raise":
            raise RuntimeError("can't start new thread")
        thread = threading.Thread(target=streamed)
        thread.start()
        with threads_lock:
            threads.append(thread)
        return True

    for kind in kinds:
        if kind == "with":
            thread = threading.Thread(target=grouped)
            thread.start()
            with threads_lock:
                threads.append(thread)
        else:
            slots.start_when_free(lambda k=kind: start(k))
    deadline = time.monotonic() + WAIT_S
    while busy.done < sum(k in ("with", "start") for k in kinds) and time.monotonic() < deadline:
        time.sleep(0.005)
    with threads_lock:
        ran = list(threads)
    for thread in ran:
        thread.join(WAIT_S)
    assert busy.done == sum(k in ("with", "start") for k in kinds)
    assert busy.most <= PARALLEL_GROUPS
    assert slots._free == PARALLEL_GROUPS  # every slot given back


def test_a_start_that_raises_gives_its_slot_back_and_never_raises_from_release():
    """Two starts that raise (no thread to be had) in a slot freed by a group load's end: the group load's
    ``__exit__`` does not raise, and a later ``with`` and the next start both get a slot."""
    slots = LoadSlots(1)
    slots.__enter__()  # a group load holds the one slot

    def failing() -> bool:
        raise RuntimeError("can't start new thread")

    slots.start_when_free(failing)
    slots.start_when_free(failing)
    slots.__exit__(None, None, None)  # its end hands the slot to both failing starts in turn: no error escapes
    assert _group_load(slots).wait(WAIT_S), "a later group load waits forever for a slot a failed start kept"
    started: list[bool] = []
    slots.start_when_free(lambda: started.append(True) or False)
    assert started == [True]


def test_a_waiting_group_load_wakes_once_starts_in_line_refuse():
    """A ``with`` waiter behind starts in line: when the slot frees and every start refuses, the waiter gets it."""
    slots = LoadSlots(1)
    slots.__enter__()
    refused: list[int] = []
    for i in range(3):
        slots.start_when_free(lambda i=i: refused.append(i) or False)
    entered = _group_load(slots)
    time.sleep(0.05)
    assert not entered.is_set()
    slots.release()
    assert entered.wait(WAIT_S)
    assert refused == [0, 1, 2]


def test_a_slot_released_more_often_than_taken_raises():
    """Like ``threading.BoundedSemaphore``: an extra ``release`` would let one load more run at once."""
    slots = LoadSlots(2)
    with pytest.raises(ValueError, match="released more often than taken"):
        slots.release()
    with slots:
        pass
    with pytest.raises(ValueError, match="released more often than taken"):
        slots.release()
    slots.start_when_free(lambda: True)  # a stream's loader holds one until it releases it
    slots.release()
    with pytest.raises(ValueError):
        slots.release()


def test_a_published_stream_answers_no_later_publication():
    """A stream takes the publication it was read for; a later one (another set naming the table) is not its."""
    first = WrittenChunk(table="public.wide", lsn=16, index=0, chunks=1, path="c0", sha256="0" * 64, rows=1,
                         relation={}, row_filter=None)
    stream = ChunkStream(first)
    stream.add(first)
    assert stream.claim() and stream.begin()
    stream.was_read(0, "0" * 64)
    assert stream.publish(1.0) and stream.state == PUBLISHED
    assert not stream.publish(2.0) and stream.published_s == 1.0


def test_a_slot_freed_after_the_session_ended_starts_no_loader():
    """A stream's start handed a slot once the overlapped load's session ended (or under another session than it
    was scheduled for) declines without claiming the stream: the table loads after its publication."""
    first = WrittenChunk(table="public.wide", lsn=16, index=0, chunks=2, path="c0", sha256="0" * 64, rows=1,
                         relation={}, row_filter=None)
    stream = ChunkStream(first)
    loader = OverlappedLoad(lambda: (object(), object()), log=lambda _m: None)  # type: ignore[arg-type,return-value]
    target, other = object(), object()
    assert not loader._start_stream(stream, target, object())  # type: ignore[arg-type]
    loader._session = other, object()  # type: ignore[assignment]
    assert not loader._start_stream(stream, target, object())  # type: ignore[arg-type]
    assert stream.claim() and not loader._streaming  # unclaimed until now, no loader thread
