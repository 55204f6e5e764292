"""The streamed net changes of the Iceberg target (``IcebergTarget.apply_net_stream``) against the collected ones
(``apply_net``, the reference): the same net changes in key-disjoint chunks leave the same table, counts and
watermark, in one catalog commit."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from airflow_provider_pglogical.apply.targets.iceberg.types import IcebergValueError
from airflow_provider_pglogical.exceptions import ApplyError
from tests.unit.apply.delta.test_delta_stream import CHANGE, _kept, _net_rows, _split
from tests.unit.apply.delta.test_delta_target import COLUMNS, TYPES, net
from tests.unit.apply.iceberg.test_iceberg_target import local, rows_of


def _commits(target: IcebergTarget) -> int:
    table = target.open("public.t")
    assert table is not None
    return len(table.metadata.metadata_log)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.lists(CHANGE, max_size=25), batch=st.lists(CHANGE, max_size=40), cuts=st.integers(1, 5),
       truncated=st.booleans())
def test_a_streamed_batch_leaves_what_the_collected_one_leaves(base, batch, cuts, truncated):
    with tempfile.TemporaryDirectory() as tmp:
        collected = IcebergTarget(local(Path(tmp) / "collected"), "s1", chunk_rows=None)
        streamed = IcebergTarget(local(Path(tmp) / "streamed"), "s1")
        (Path(tmp) / "collected").mkdir()
        (Path(tmp) / "streamed").mkdir()
        first = [("I", [], None, key, n, body) for _, _, key, n, body in base] or [("I", [], None, 0, 0, "")]
        first = list({r[3]: r for r in first}.values())  # one row per key
        for t in (collected, streamed):
            t.apply_net("public.t", 0, 10, net(first), key=("id",), columns=COLUMNS, type_names=TYPES,
                        truncated=False)
        changes = net(_net_rows(batch))
        want = collected.apply_net("public.t", 10, 20, changes, key=("id",), columns=COLUMNS, type_names=TYPES,
                                   truncated=truncated)
        before = _commits(streamed)
        head, *rest = _split(changes, cuts)
        got = streamed.apply_net_stream("public.t", 10, 20, head, iter(rest), rows=changes.num_rows,
                                        kept=_kept(changes), key=("id",), columns=COLUMNS, type_names=TYPES,
                                        truncated=truncated)
        assert rows_of(streamed) == rows_of(collected)
        assert got.rows == want.rows
        assert got.committed and streamed.watermark("public.t") == 20
        assert _commits(streamed) == before + 1  # one catalog commit for the batch


def test_a_chunk_that_fails_to_convert_or_a_short_stream_commits_nothing(tmp_path):
    target = IcebergTarget(local(tmp_path), "s1")
    target.apply_net("public.t", 0, 10, net([("I", [], None, 1, 1, "a")]), key=("id",), columns=COLUMNS,
                     type_names=TYPES, truncated=False)
    good = net([("U", [], None, 1, 2, "b")])
    bad = pa.table({**{c: good.column(c) for c in good.column_names if c != "n"},
                    "n": pa.array([1_001], pa.timestamp("ns"))}).select(good.column_names)  # a value Iceberg refuses
    with pytest.raises(IcebergValueError):
        target.apply_net_stream("public.t", 10, 20, good, iter([bad]), rows=2, kept=(), key=("id",), columns=COLUMNS,
                                type_names=TYPES, truncated=False)
    with pytest.raises(ApplyError, match="1 net change.s. reached the commit, 2 were planned"):
        target.apply_net_stream("public.t", 10, 20, good, iter([]), rows=2, kept=(), key=("id",), columns=COLUMNS,
                                type_names=TYPES, truncated=False)
    assert rows_of(target) == [(1, 1, "a")] and target.watermark("public.t") == 10
