"""The shares of a snapshot table's row groups that the COPY streams of a created table's load take
(``snapshot.contiguous_shares``): in order, each row group once, so the streams' rows are the one COPY's rows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.targets.postgres.snapshot import contiguous_shares


@given(st.lists(st.tuples(st.text(max_size=3), st.integers(0, 50)), max_size=40).map(tuple), st.integers(1, 12))
def test_the_shares_concatenate_to_the_row_groups_in_order(tasks, n):
    shares = contiguous_shares(tasks, n)
    assert tuple(t for share in shares for t in share) == tasks
    assert len(shares) == max(1, min(n, len(tasks)))
    if tasks:
        sizes = [len(s) for s in shares]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_one_stream_takes_every_row_group():
    assert contiguous_shares((("a", 0), ("a", 1), ("b", 0)), 1) == [(("a", 0), ("a", 1), ("b", 0))]
    assert contiguous_shares((("a", 0), ("a", 1), ("b", 0)), 2) == [(("a", 0),), (("a", 1), ("b", 0))]
