"""prefetched: same chunks in the same order, errors re-raised in the consumer, the worker always joined."""

from __future__ import annotations

import threading

import pytest

from airflow_provider_pglogical.hooks.prefetch import prefetched


def chunks_of(n: int, size: int):
    data = list(range(n))
    pieces = iter([data[i:i + size] for i in range(0, n, size)] + [[]])
    return lambda: next(pieces)


def test_chunks_arrive_complete_and_in_order():
    assert [x for chunk in prefetched(chunks_of(1000, 7)) for x in chunk] == list(range(1000))


def test_an_error_in_fetch_is_raised_in_the_consumer_after_the_chunks_before_it():
    calls = iter([[1], [2]])

    def fetch():
        try:
            return next(calls)
        except StopIteration:
            raise ValueError("server went away") from None

    got = []
    with pytest.raises(ValueError, match="server went away"):
        for chunk in prefetched(fetch):
            got += chunk
    assert got == [1, 2]


def test_closing_early_stops_the_worker_before_returning():
    fetched = []

    def fetch():
        fetched.append(len(fetched))
        return [len(fetched)]  # never runs dry

    gen = prefetched(fetch, depth=2)
    assert next(gen) == [1]
    gen.close()
    assert not [t for t in threading.enumerate() if t.name == "pglogical-prefetch"]
    settled = len(fetched)
    assert settled <= 5  # at most `depth` chunks ahead, plus the one in flight
    assert len(fetched) == settled  # nothing fetches after close returned
