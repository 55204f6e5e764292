"""``hooks.readahead.ReadAhead`` against iterating its source directly (the streamed read's reference path)."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.hooks.readahead import ReadAhead, ReadAheadClosed


class Broken(Exception):
    pass


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), max_size=6), max_size=25), st.integers(1, 40), st.booleans(),
       st.one_of(st.none(), st.integers(0, 25)), st.lists(st.sampled_from([0.0, 0.0, 0.0005]), max_size=30))
def test_read_ahead_gives_the_sources_blocks_in_order_and_holds_at_most_its_bound(blocks, limit, fails, stop_after,
                                                                                   pauses):
    """The consumer gets the source's blocks in order, then the source's error (none early, none lost); the
    thread asks the source for a block only while less than the bound waits (so less than the bound plus one block
    is held); a consumer stopping early closes the source on the thread, which then ends; iterated after close()
    it raises when close() dropped a block or the error, never ending as the source would, and ends as the source
    would when the thread had taken the source's end and everything was given."""
    size = len  # a block's bytes: its length (empty blocks weigh nothing)
    asked_held: list[int] = []  # bytes waiting whenever the thread asks the source for a block
    seen_held: list[int] = []
    closed = threading.Event()
    holder: list[ReadAhead[int]] = []

    def source():
        try:
            for block in blocks:
                if holder:
                    asked_held.append(holder[0].held)
                yield block
            if fails:
                raise Broken("the stream ended")
        finally:
            closed.set()

    ahead = ReadAhead(source(), limit, size, name="test-read-ahead")
    holder.append(ahead)
    deadline = time.monotonic() + 5  # the consumer starts late: the thread fills the bound, or takes everything
    while ahead.running and ahead.held < limit and time.monotonic() < deadline:
        time.sleep(0.0002)
    seen_held.append(ahead.held)
    got: list[list[int]] = []
    given = 0  # blocks handed to the consumer (the one it stopped at too)
    raised = None
    try:
        for i, block in enumerate(ahead):
            given += 1
            if stop_after is not None and i >= stop_after:
                break
            got.append(block)
            time.sleep(pauses[i] if i < len(pauses) else 0.0)
    except Broken as exc:
        raised = exc
    finally:
        source_ended = not ahead.running  # before close(): the thread had taken the source's end
        ahead.close()
    assert closed.wait(5) and not ahead.running
    expected = blocks if stop_after is None else blocks[:stop_after]
    assert got == expected
    assert (raised is not None) == (fails and (stop_after is None or stop_after >= len(blocks)))
    biggest = max((size(b) for b in blocks), default=0)
    assert all(held < limit for held in asked_held)
    assert all(held < limit + biggest for held in seen_held)
    ahead.close()  # again, as a stream closes it on its own end too: what the first one dropped stays dropped
    if given < len(blocks) or (fails and raised is None):  # dropped: never the source's end
        with pytest.raises(ReadAheadClosed):
            next(iter(ahead))
    elif source_ended:  # nothing dropped: ends as the source would
        assert list(ahead) == []


def test_a_read_ahead_closed_after_giving_its_last_block_ends_as_its_source():
    """The thread read to the source's end and every block was given; the consumer, paused after the last one,
    closes it (a failed confirmation closes the stream) and asks for the next: the end, as iterating the source
    directly would give, not ``ReadAheadClosed`` (nothing was dropped)."""
    ahead = ReadAhead(iter([[1], [2, 3]]), 10, len, name="test-read-ahead-end")
    blocks = iter(ahead)
    assert [next(blocks), next(blocks)] == [[1], [2, 3]]
    deadline = time.monotonic() + 5
    while ahead.running and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not ahead.running
    ahead.close()
    assert list(blocks) == []
    ahead.close()  # closed again (the stream's own close): still nothing dropped
    assert list(ahead) == []


class ClosingFails:
    """A source whose ``close()`` fails (a connection that breaks as it is closed)."""

    def __init__(self, blocks: list[list[int]]) -> None:
        self.blocks = iter(blocks)

    def __iter__(self) -> ClosingFails:
        return self

    def __next__(self) -> list[int]:
        return next(self.blocks)

    def close(self) -> None:
        raise Broken("closing failed")


def test_an_error_closing_the_source_reaches_the_consumer_after_the_blocks():
    ahead = ReadAhead(ClosingFails([[1], [2, 3]]), 10, len, name="test-read-ahead-close")
    got: list[list[int]] = []
    with pytest.raises(Broken, match="closing failed"):
        got.extend(ahead)
    ahead.close()
    assert got == [[1], [2, 3]]
