"""The streamed MERGE source (``lake/stream.py``) against the collected one: the same net changes, split into
key-disjoint chunks and streamed into delta-rs, leave the same Delta table, metrics and watermark."""

from __future__ import annotations

import itertools
import tempfile
import threading

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.mirror import merge_source
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from airflow_provider_pglogical.apply.targets.delta.types import DeltaValueError
from airflow_provider_pglogical.apply.targets.lake import stream
from airflow_provider_pglogical.exceptions import ApplyError
from tests.unit.apply.delta.test_delta_target import COLUMNS, TYPES, net, rows_of

# A net change: (kind, keeps body, id, n, body). A keep only on U: an I/R keeping a column takes the collected path.
CHANGE = st.tuples(st.sampled_from("DIUR"), st.booleans(), st.integers(0, 40), st.integers(-5, 5),
                   st.one_of(st.none(), st.text(max_size=3)))


def _net_rows(changes: list[tuple]) -> list[tuple]:
    seen: dict[int, tuple] = {}
    for kind, keeps, key, n, body in changes:  # net changes: one per key
        seen[key] = (kind, ["body"] if keeps and kind == "U" else [], None, key, None if kind == "D" else n,
                     None if kind == "D" or (keeps and kind == "U") else body)
    return list(seen.values())


def _split(table: pa.Table, cuts: int) -> list[pa.Table]:
    """``table`` in ``cuts`` key-disjoint chunks (by key modulo, as Spark's buckets are by key hash)."""
    ids = table.column("id").to_pylist()
    return [table.filter(pa.array([i % cuts == c for i in ids], pa.bool_())) for c in range(cuts)]


def _kept(table: pa.Table) -> tuple[str, ...]:
    return ("body",) if any(table.column("_pgl_keep").to_pylist()) else ()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.lists(CHANGE, max_size=25), batch=st.lists(CHANGE, max_size=40), cuts=st.integers(1, 5),
       truncated=st.booleans())
def test_a_streamed_merge_source_leaves_what_the_collected_one_leaves(base, batch, cuts, truncated):
    with tempfile.TemporaryDirectory() as tmp:
        collected = DeltaTarget(DeltaLocation(f"{tmp}/collected"), "s1", chunk_rows=None)
        streamed = DeltaTarget(DeltaLocation(f"{tmp}/streamed"), "s1")
        first = [("I", [], None, key, n, body) for _, _, key, n, body in base] or [("I", [], None, 0, 0, "")]
        first = list({r[3]: r for r in first}.values())  # one row per key
        for t in (collected, streamed):
            t.apply_net("public.t", 0, 10, net(first), key=("id",), columns=COLUMNS, type_names=TYPES,
                        truncated=False)
        changes = net(_net_rows(batch))
        want = collected.apply_net("public.t", 10, 20, changes, key=("id",), columns=COLUMNS, type_names=TYPES,
                                   truncated=truncated)
        head, *rest = _split(changes, cuts)
        got = streamed.apply_net_stream("public.t", 10, 20, head, iter(rest), rows=changes.num_rows,
                                        kept=_kept(changes), key=("id",), columns=COLUMNS, type_names=TYPES,
                                        truncated=truncated)
        assert rows_of(streamed.location) == rows_of(collected.location)
        assert got.rows == want.rows
        assert got.committed and streamed.watermark("public.t") == 20
        assert DeltaTable(streamed.location.table_uri("public.t")).version() == 2  # still one commit per batch


def test_a_chunk_that_fails_to_convert_commits_nothing_and_raises_its_own_error(tmp_path):
    target = DeltaTarget(DeltaLocation(str(tmp_path / "lake")), "s1")
    target.apply_net("public.t", 0, 10, net([("I", [], None, 1, 1, "a")]), key=("id",), columns=COLUMNS,
                     type_names=TYPES, truncated=False)
    good = net([("U", [], None, 1, 2, "b")])
    bad = pa.table({**{c: good.column(c) for c in good.column_names if c != "n"},
                    "n": pa.array([1_001], pa.timestamp("ns"))}).select(good.column_names)  # a value Delta refuses
    with pytest.raises(DeltaValueError, match="nanoseconds"):
        target.apply_net_stream("public.t", 10, 20, good, iter([bad]), rows=2, kept=(), key=("id",), columns=COLUMNS,
                                type_names=TYPES, truncated=False)
    assert rows_of(target.location) == [(1, 1, "a")] and target.watermark("public.t") == 10


def test_fewer_rows_than_planned_commit_nothing(tmp_path):
    target = DeltaTarget(DeltaLocation(str(tmp_path / "lake")), "s1")
    target.apply_net("public.t", 0, 10, net([("I", [], None, 1, 1, "a")]), key=("id",), columns=COLUMNS,
                     type_names=TYPES, truncated=False)
    with pytest.raises(ApplyError, match="1 net change.s. reached the MERGE, 2 were planned"):
        target.apply_net_stream("public.t", 10, 20, net([("U", [], None, 1, 2, "b")]), iter([]), rows=2, kept=(),
                                key=("id",), columns=COLUMNS, type_names=TYPES, truncated=False)
    assert target.watermark("public.t") == 10


def test_a_keep_the_plan_did_not_expect_is_refused():
    changes = net([("U", ["body"], None, 1, 2, None)])
    with pytest.raises(ApplyError, match="column body: 1 change"):
        merge_source(changes, ("id",), COLUMNS, kept=())


def test_prefetching_keeps_order_raises_the_producers_error_and_stops_when_closed():
    made: list[int] = []

    def make(i: int) -> pa.Table:
        made.append(i)
        if i == 3:
            raise RuntimeError("bucket 3 failed")
        return pa.table({"i": [i]})

    got = stream.prefetched([lambda i=i: make(i) for i in range(5)])
    assert [t.column("i")[0].as_py() for t in itertools.islice(got, 3)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="bucket 3 failed"):
        next(got)
    early = stream.prefetched([lambda i=i: make(i) for i in range(100)], ahead=1)
    next(early)
    early.close()
    assert len(made) < 5 + 100 and not any(t.name == "pglogical-merge-source" and t.is_alive()
                                           for t in threading.enumerate())


def test_buckets_cover_the_rows_in_chunks_of_at_most_chunk_rows():
    assert stream.buckets(0, 100) == 1
    assert stream.buckets(100, 100) == 1
    assert stream.buckets(101, 100) == 2
    assert stream.buckets(1_000_000, 100_000) == 10


def test_a_table_batch_streams_only_when_its_staged_changes_may_exceed_one_bucket():
    assert not stream.worth_streaming(None, 5_000_000)  # no bucket size: the collected reference path
    assert not stream.worth_streaming(1_000, 1_000)  # fits one bucket: collected whole, no cache or summary pass
    assert stream.worth_streaming(1_000, 1_001)
    assert stream.worth_streaming(1_000, None)  # changes that cannot say how many were staged: stream
