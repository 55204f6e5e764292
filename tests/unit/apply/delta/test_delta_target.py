"""DeltaTarget without Spark: net changes → one MERGE commit per table and batch, watermark in the Delta log."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation, app_id
from airflow_provider_pglogical.apply.targets.delta.mirror import COMMIT, ORDER
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from airflow_provider_pglogical.apply.transforms import FROM, KEEP, KIND, LSN, TOUCHED
from airflow_provider_pglogical.exceptions import UnresolvableToastError

COLUMNS = ("id", "n", "body")
TYPES = {"id": "integer", "n": "integer", "body": "text"}
FROM_TYPE = pa.struct([("id", pa.int32())])


def net(rows: list[tuple]) -> pa.Table:
    """rows: (kind, keep, from_id, id, n, body)."""
    return pa.table({
        KIND: pa.array([r[0] for r in rows], pa.string()),
        KEEP: pa.array([r[1] for r in rows], pa.list_(pa.string())),
        LSN: pa.array(range(100, 100 + len(rows)), pa.int64()),
        FROM: pa.array([None if r[2] is None else {"id": r[2]} for r in rows], FROM_TYPE),
        TOUCHED: pa.array([False] * len(rows)),
        "id": pa.array([r[3] for r in rows], pa.int32()),
        "n": pa.array([r[4] for r in rows], pa.int32()),
        "body": pa.array([r[5] for r in rows], pa.string()),
    })


def ordered(rows: list[tuple]) -> pa.Table:
    """rows: (kind, keep, from_id, id, n, body) in commit order."""
    table = net(rows).drop_columns([TOUCHED])
    return table.append_column(COMMIT, pa.array([1] * len(rows), pa.int64())).append_column(
        ORDER, pa.array(range(len(rows)), pa.int64()))


def rows_of(location: DeltaLocation, target: str = "public.t") -> list[tuple]:
    table = DeltaTable(location.table_uri(target)).to_pyarrow_table().sort_by("id")
    return [tuple(r.values()) for r in table.to_pylist()]


def apply(target: DeltaTarget, start: int, end: int, rows: list[tuple], *, truncated: bool = False, **kw):
    return target.apply_net("public.t", start, end, net(rows), key=("id",), columns=COLUMNS, type_names=TYPES,
                            truncated=truncated, **kw)


@pytest.fixture
def target(tmp_path) -> DeltaTarget:
    return DeltaTarget(DeltaLocation(str(tmp_path / "lake")), "s1")


def test_inserts_updates_and_deletes_are_one_commit_with_the_watermark(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a"), ("I", [], None, 2, 1, "b"), ("I", [], None, 3, 1, "c")])
    outcome = apply(target, 10, 20, [("U", [], None, 1, 2, "a2"), ("D", [], None, 2, None, None),
                                     ("R", [], None, 3, 5, "c5"), ("I", [], None, 4, 1, "d")])
    assert rows_of(target.location) == [(1, 2, "a2"), (3, 5, "c5"), (4, 1, "d")]
    assert outcome.rows == {"inserted": 1, "updated": 2, "deleted": 1}
    table = DeltaTable(target.location.table_uri("public.t"))
    assert table.version() == 2  # create + one commit per batch
    assert table.transaction_version(app_id("s1", "public.t")) == 20 == target.watermark("public.t")
    assert table.history(1)[0]["pglogical.end_lsn"] == "20"


def test_a_batch_at_or_below_the_watermark_changes_nothing(target):
    batch = [("I", [], None, 1, 1, "a")]
    assert apply(target, 0, 10, batch).committed
    assert not apply(target, 0, 10, [("D", [], None, 1, None, None)]).committed
    assert rows_of(target.location) == [(1, 1, "a")]


def test_unchanged_toast_columns_keep_the_target_value_never_null(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "x" * 9000), ("I", [], None, 2, 1, "y")])
    apply(target, 10, 20, [("U", ["body"], None, 1, 2, None), ("U", [], None, 2, 3, None)])
    assert rows_of(target.location) == [(1, 2, "x" * 9000), (2, 3, None)]


def test_a_truncate_before_the_changes_empties_the_table_in_the_same_commit(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a"), ("I", [], None, 2, 1, "b")])
    apply(target, 10, 20, [("I", [], None, 2, 7, "new"), ("U", [], None, 1, 9, "gone")], truncated=True)
    assert rows_of(target.location) == [(2, 7, "new")]
    assert DeltaTable(target.location.table_uri("public.t")).version() == 2


def test_a_batch_that_changes_nothing_still_records_its_watermark(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a")])
    apply(target, 10, 20, [("U", [], None, 99, 1, "missing row: skipped as natively")])
    assert target.watermark("public.t") == 20 and rows_of(target.location) == [(1, 1, "a")]
    assert target.truncate("public.t", 20, 30).rows == {"deleted_rows": 1}
    assert target.watermark("public.t") == 30 and rows_of(target.location) == []


def test_an_unchanged_toast_value_that_exists_nowhere_fails_or_is_rejected_in_the_commit(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a")])
    with pytest.raises(UnresolvableToastError, match="column\\(s\\) body of the change at LSN 64") as err:
        apply(target, 10, 20, [("I", ["body"], None, 5, 1, None)])
    assert "None" not in str(err.value)
    outcome = apply(target, 10, 20, [("I", ["body"], None, 5, 1, None), ("I", ["body"], None, 1, 3, None)],
                    unchanged_toast="reject_and_continue")
    assert rows_of(target.location) == [(1, 3, "a")]  # key 1 existed: upsert keeps its value
    assert outcome.rejects == [{"table": "public.t", "lsn": 100, "columns": ["body"], "key": {"id": 5}}]
    meta = DeltaTable(target.location.table_uri("public.t")).history(1)[0]
    assert json.loads(meta["pglogical.rejects"]) == outcome.rejects


def test_a_moved_row_takes_its_unchanged_toast_value_along_a_key_change_chain(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "x" * 9000)])
    # 1 → 2 (n changed), then 2 → 3: net says I at 3 from key 2, which the target never had.
    changes = [("U", ["body"], 1, 2, 2, None), ("U", ["body"], 2, 3, 3, None)]
    outcome = apply(target, 10, 20, [("D", [], None, 1, None, None), ("D", [], None, 2, None, None),
                                     ("I", ["body"], 2, 3, 3, None)], ordered=lambda: ordered(changes))
    assert outcome.replayed
    assert rows_of(target.location) == [(3, 3, "x" * 9000)]


def test_partition_columns_come_from_the_spec(tmp_path):
    target = DeltaTarget(DeltaLocation(str(tmp_path / "lake")), "s1", partition_by={"public.t": ["n"]})
    apply(target, 0, 10, [("I", [], None, 1, 1, "a"), ("I", [], None, 2, 2, "b")])
    assert DeltaTable(target.location.table_uri("public.t")).metadata().partition_columns == ["n"]
    apply(target, 10, 20, [("U", [], None, 1, 2, "a2")])
    assert rows_of(target.location) == [(1, 2, "a2"), (2, 2, "b")]


def test_crash_before_the_commit_leaves_nothing_and_the_rerun_applies_once(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a")])

    def crash(name: str, table: str) -> None:
        if name == "before_commit":
            raise RuntimeError("crash")

    target.checkpoint = crash
    with pytest.raises(RuntimeError):
        apply(target, 10, 20, [("U", [], None, 1, 2, "b"), ("I", [], None, 2, 1, "c")])
    assert target.watermark("public.t") == 10 and rows_of(target.location) == [(1, 1, "a")]
    target.checkpoint = lambda name, table: None
    apply(target, 10, 20, [("U", [], None, 1, 2, "b"), ("I", [], None, 2, 1, "c")])
    assert rows_of(target.location) == [(1, 2, "b"), (2, 1, "c")]


def test_a_key_of_all_columns_matches_rows_whose_columns_are_null(target):
    columns = {"id": "integer", "n": "integer", "body": "text"}
    key = ("id", "n", "body")

    def run(start: int, end: int, rows: list[tuple]):
        return target.apply_net("public.full", start, end, net(rows).drop_columns([FROM]).append_column(
            FROM, pa.nulls(len(rows), pa.struct([(k, pa.int32() if k != "body" else pa.string()) for k in key]))),
            key=key, columns=tuple(columns), type_names=columns, truncated=False, null_safe_key=True)

    run(0, 10, [("I", [], None, 1, None, "a"), ("I", [], None, 2, None, None)])
    run(10, 20, [("D", [], None, 2, None, None)])
    assert rows_of(target.location, "public.full") == [(1, None, "a")]
