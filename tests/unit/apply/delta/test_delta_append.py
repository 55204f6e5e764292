"""A batch whose keys no Delta row can hold is appended instead of merged (``mirror.keys_absent``): the same table as
the MERGE (``PGLOGICAL_DELTA_APPEND=0``, the reference) on random batches, and the rule read from the log's
statistics."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.targets.delta import mirror
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from tests.unit.apply.delta.test_delta_target import COLUMNS, TYPES, net, rows_of

KINDS = st.sampled_from(["I", "I", "U", "D", "R"])


def operations(location: DeltaLocation) -> list[str]:
    return [c["operation"] for c in reversed(DeltaTable(location.table_uri("public.t")).history())]


def apply(target: DeltaTarget, start: int, end: int, rows: list[tuple], *, truncated: bool = False) -> None:
    target.apply_net("public.t", start, end, net(rows), key=("id",), columns=COLUMNS, type_names=TYPES,
                     truncated=truncated)


def batches_of(keys: list[int], kinds: list[str]) -> list[tuple]:
    return [(kind, [], None, k, k % 7, None if kind == "D" else f"v{k}") for k, kind in zip(keys, kinds, strict=False)]


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[list[tuple], bool]]:
    """Up to four batches of distinct keys each, drawn from overlapping or disjoint ranges, some truncating."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        low = draw(st.integers(-20, 40))
        keys = draw(st.lists(st.integers(low, low + 15), min_size=1, max_size=8, unique=True))
        kinds = draw(st.lists(KINDS, min_size=len(keys), max_size=len(keys)))
        out.append((batches_of(keys, kinds), draw(st.booleans()) and draw(st.booleans())))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=workloads())
def test_appending_absent_keys_gives_the_table_the_merge_gives(tmp_path_factory, monkeypatch, workload):
    tables = {}
    for append in ("1", "0"):
        monkeypatch.setenv(mirror.APPEND_SWITCH, append)
        target = DeltaTarget(DeltaLocation(str(tmp_path_factory.mktemp("lake"))), "s1")
        for i, (rows, truncated) in enumerate(workload):
            apply(target, i * 10, i * 10 + 10, rows, truncated=truncated)
        tables[append] = (rows_of(target.location), target.watermark("public.t"), operations(target.location))
    assert tables["1"][:2] == tables["0"][:2]
    assert tables["1"][2][1] == "WRITE"  # the first batch into the new table never merges


def test_the_first_batch_and_batches_beyond_every_key_append_and_others_merge(tmp_path):
    target = DeltaTarget(DeltaLocation(str(tmp_path / "lake")), "s1")
    apply(target, 0, 10, batches_of([1, 2, 3], ["I", "I", "U"]))  # empty table: an UPDATE of a missing row is skipped
    apply(target, 10, 20, batches_of([7, 8], ["I", "D"]))  # above the table's keys
    apply(target, 20, 30, batches_of([-5], ["R"]))  # below them
    apply(target, 30, 40, batches_of([5, 9], ["I", "I"]))  # 5 lies between two files' keys: stats cannot tell
    apply(target, 40, 50, batches_of([20], ["I"]), truncated=True)  # a truncate deletes every row: MERGE
    assert operations(target.location)[1:] == ["WRITE", "WRITE", "WRITE", "MERGE", "MERGE"]
    assert rows_of(target.location) == [(20, 6, "v20")]
    assert target.watermark("public.t") == 50


def test_keys_absent_answers_false_where_statistics_cannot_tell(tmp_path):
    uri = str(tmp_path / "t")
    data = pa.table({"id": pa.array([10, 20], pa.int32()), "k2": ["a", "b"]})
    write_deltalake(uri, data)
    dt = DeltaTable(uri)
    one = pa.table({"id": pa.array([30], pa.int32()), "k2": ["c"]})
    assert mirror.keys_absent(dt, one, ["id"], truncated=False)
    assert not mirror.keys_absent(dt, one, ["id"], truncated=True)  # a truncate must delete the table's rows
    assert not mirror.keys_absent(dt, one, ["id", "k2"], truncated=False)  # composite key: no range to compare
    assert not mirror.keys_absent(dt, one, ["k2"], truncated=False)  # text: statistics may be truncated prefixes
    inside = pa.table({"id": pa.array([15], pa.int32()), "k2": ["c"]})
    assert not mirror.keys_absent(dt, inside, ["id"], truncated=False)
    null = pa.table({"id": pa.array([None, 30], pa.int32()), "k2": ["c", "d"]})
    assert not mirror.keys_absent(dt, null, ["id"], truncated=False)
    empty = DeltaTable.create(str(tmp_path / "e"), schema=data.schema)
    assert mirror.keys_absent(empty, inside, ["id"], truncated=True)  # no file: nothing to match or delete


def test_statistics_of_a_file_missing_them_make_the_batch_merge(tmp_path):
    uri = str(tmp_path / "t")
    data = pa.table({"id": pa.array([10, 20], pa.int32())})
    write_deltalake(uri, data, configuration={"delta.dataSkippingNumIndexedCols": "0"})
    dt = DeltaTable(uri)
    assert not mirror.keys_absent(dt, pa.table({"id": pa.array([30], pa.int32())}), ["id"], truncated=False)


@pytest.mark.parametrize("kinds", [["U", "D"], ["D"]])
def test_a_batch_of_only_missing_rows_commits_the_watermark_alone(tmp_path, kinds):
    target = DeltaTarget(DeltaLocation(str(tmp_path / "lake")), "s1")
    apply(target, 0, 10, batches_of([1], ["I"]))
    apply(target, 10, 20, batches_of([5, 6][:len(kinds)], kinds))
    assert rows_of(target.location) == [(1, 1, "v1")]
    assert target.watermark("public.t") == 20


def test_an_appended_batch_that_no_longer_writes_a_column_leaves_it_null(tmp_path):
    """The source dropped ``body``: the batch writes ``id`` and ``n`` only, as the MERGE's insert would."""
    target = DeltaTarget(DeltaLocation(str(tmp_path / "lake")), "s1")
    apply(target, 0, 10, batches_of([1], ["I"]))
    later = net(batches_of([5], ["I"])).drop_columns(["body"])
    target.apply_net("public.t", 10, 20, later, key=("id",), columns=("id", "n"), type_names=TYPES, truncated=False)
    assert operations(target.location)[1:] == ["WRITE", "WRITE"]
    assert rows_of(target.location) == [(1, 1, "v1"), (5, 5, None)]
