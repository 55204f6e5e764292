"""IcebergTarget without Spark: net changes → one Iceberg commit per table and batch (copy-on-write), watermark in
the same commit, on the embedded SQL catalog (SQLite) and a local warehouse."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pytest

from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation, watermark_key
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from airflow_provider_pglogical.apply.transforms import FROM, LSN
from airflow_provider_pglogical.exceptions import ApplyError, UnresolvableToastError
from tests.unit.apply.delta.test_delta_target import COLUMNS, TYPES, net, ordered


def local(tmp_path, namespace: str | None = None) -> IcebergLocation:
    return IcebergLocation({"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                            "warehouse": str(tmp_path / "warehouse")}, namespace=namespace)


def rows_of(target: IcebergTarget, name: str = "public.t") -> list[tuple]:
    table = target.open(name)
    assert table is not None
    data = table.scan().to_arrow().sort_by("id")
    return [tuple(r.values()) for r in data.to_pylist()]


def apply(target: IcebergTarget, start: int, end: int, rows: list[tuple], *, truncated: bool = False, **kw):
    return target.apply_net("public.t", start, end, net(rows), key=("id",), columns=COLUMNS, type_names=TYPES,
                            truncated=truncated, **kw)


@pytest.fixture
def target(tmp_path) -> IcebergTarget:
    return IcebergTarget(local(tmp_path), "s1")


def test_inserts_updates_and_deletes_are_one_commit_with_the_watermark(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a"), ("I", [], None, 2, 1, "b"), ("I", [], None, 3, 1, "c")])
    table = target.open("public.t")
    assert table is not None
    metadata_before = table.metadata_location
    outcome = apply(target, 10, 20, [("U", [], None, 1, 2, "a2"), ("D", [], None, 2, None, None),
                                     ("R", [], None, 3, 5, "c5"), ("I", [], None, 4, 1, "d")])
    assert rows_of(target) == [(1, 2, "a2"), (3, 5, "c5"), (4, 1, "d")]
    assert outcome.rows == {"inserted": 1, "updated": 2, "deleted": 1}
    table = target.open("public.t")
    assert table is not None
    # One catalog commit: the metadata before it is the previous one, and its snapshots carry the batch.
    assert table.metadata.metadata_log[-1].metadata_file == metadata_before
    assert table.properties[watermark_key("s1")] == "20" and target.watermark("public.t") == 20
    current = table.current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary["pglogical.end-lsn"] == "20" and current.summary["pglogical.slot"] == "s1"
    # Copy-on-write: no delete files, so a reader of the plain Parquet files (DuckDB) sees the table's rows.
    assert current.summary["total-delete-files"] == "0"
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert all(not task.delete_files for task in table.scan().plan_files())
    paths = [f.removeprefix("file://") for f in files]
    assert sorted(duckdb.connect().execute("SELECT id, n, body FROM read_parquet(?)", [paths]).fetchall()) == \
        [(1, 2, "a2"), (3, 5, "c5"), (4, 1, "d")]


def test_a_batch_at_or_below_the_watermark_changes_nothing(target):
    batch = [("I", [], None, 1, 1, "a")]
    assert apply(target, 0, 10, batch).committed
    assert not apply(target, 0, 10, [("D", [], None, 1, None, None)]).committed
    assert rows_of(target) == [(1, 1, "a")]


def test_unchanged_toast_columns_keep_the_target_value_never_null(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "x" * 9000), ("I", [], None, 2, 1, "y")])
    apply(target, 10, 20, [("U", ["body"], None, 1, 2, None), ("U", [], None, 2, 3, None)])
    assert rows_of(target) == [(1, 2, "x" * 9000), (2, 3, None)]


def test_a_truncate_before_the_changes_empties_the_table_in_the_same_commit(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a"), ("I", [], None, 2, 1, "b")])
    apply(target, 10, 20, [("I", [], None, 2, 7, "new"), ("U", [], None, 1, 9, "gone")], truncated=True)
    assert rows_of(target) == [(2, 7, "new")] and target.watermark("public.t") == 20


def test_a_batch_that_changes_nothing_still_records_its_watermark(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a")])
    apply(target, 10, 20, [("U", [], None, 99, 1, "missing row: skipped as natively")])
    assert target.watermark("public.t") == 20 and rows_of(target) == [(1, 1, "a")]
    assert target.truncate("public.t", 20, 30).rows == {"deleted_rows": 1}
    assert target.watermark("public.t") == 30 and rows_of(target) == []


def test_an_unchanged_toast_value_that_exists_nowhere_fails_or_is_rejected_in_the_commit(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a")])
    with pytest.raises(UnresolvableToastError, match="column\\(s\\) body of the change at LSN 64") as err:
        apply(target, 10, 20, [("I", ["body"], None, 5, 1, None)])
    assert "None" not in str(err.value)
    outcome = apply(target, 10, 20, [("I", ["body"], None, 5, 1, None), ("I", ["body"], None, 1, 3, None)],
                    unchanged_toast="reject_and_continue")
    assert rows_of(target) == [(1, 3, "a")]  # key 1 existed: upsert keeps its value
    assert outcome.rejects == [{"table": "public.t", "lsn": 100, "columns": ["body"], "key": {"id": 5}}]
    table = target.open("public.t")
    assert table is not None and table.current_snapshot() is not None
    assert json.loads(table.current_snapshot().summary["pglogical.rejects"]) == outcome.rejects


def test_a_moved_row_takes_its_unchanged_toast_value_along_a_key_change_chain(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "x" * 9000)])
    changes = [("U", ["body"], 1, 2, 2, None), ("U", ["body"], 2, 3, 3, None)]
    outcome = apply(target, 10, 20, [("D", [], None, 1, None, None), ("D", [], None, 2, None, None),
                                     ("I", ["body"], 2, 3, 3, None)], ordered=lambda: ordered(changes))
    assert outcome.replayed
    assert rows_of(target) == [(3, 3, "x" * 9000)]


def test_partition_columns_come_from_the_spec(tmp_path):
    target = IcebergTarget(local(tmp_path), "s1", partition_by={"public.t": ["n"]})
    apply(target, 0, 10, [("I", [], None, 1, 1, "a"), ("I", [], None, 2, 2, "b")])
    table = target.open("public.t")
    assert table is not None and [f.name for f in table.spec().fields] == ["n"]
    apply(target, 10, 20, [("U", [], None, 1, 2, "a2")])
    assert rows_of(target) == [(1, 2, "a2"), (2, 2, "b")]


def test_crash_before_the_commit_leaves_nothing_and_the_rerun_applies_once(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a")])

    def crash(name: str, table: str) -> None:
        if name == "before_commit":
            raise RuntimeError("crash")

    target.checkpoint = crash
    with pytest.raises(RuntimeError):
        apply(target, 10, 20, [("U", [], None, 1, 2, "b"), ("I", [], None, 2, 1, "c")])
    assert target.watermark("public.t") == 10 and rows_of(target) == [(1, 1, "a")]
    target.checkpoint = lambda name, table: None
    apply(target, 10, 20, [("U", [], None, 1, 2, "b"), ("I", [], None, 2, 1, "c")])
    assert rows_of(target) == [(1, 2, "b"), (2, 1, "c")]


def test_a_key_of_all_columns_matches_rows_whose_columns_are_null(target):
    columns = {"id": "integer", "n": "integer", "body": "text"}
    key = ("id", "n", "body")

    def run(start: int, end: int, rows: list[tuple]):
        return target.apply_net("public.full", start, end, net(rows).drop_columns([FROM]).append_column(
            FROM, pa.nulls(len(rows), pa.struct([(k, pa.int32() if k != "body" else pa.string()) for k in key]))),
            key=key, columns=tuple(columns), type_names=columns, truncated=False)

    run(0, 10, [("I", [], None, 1, None, "a"), ("I", [], None, 2, None, None)])
    run(10, 20, [("D", [], None, 2, None, None)])
    assert rows_of(target, "public.full") == [(1, None, "a")]


def test_the_iceberg_target_answers_the_target_protocol_from_its_catalog(target):
    from airflow_provider_pglogical.apply.targets.base import Target

    as_target: Target = target  # mypy checks the protocol; the calls below check the behaviour
    assert as_target.describe("public.t") is None and as_target.foreign_keys() == []
    as_target.create_table("public.t", [("id", "integer"), ("n", "integer"), ("body", "text")], ("id",))
    announced = as_target.describe("public.t")
    assert announced is not None and announced.columns == TYPES and announced.primary_key == ()
    assert target.open("public.t") is None  # created by its first commit
    apply(target, 0, 10, [("I", [], None, 1, 1, "a")])
    described = as_target.describe("public.t")
    assert described is not None and described.columns == TYPES  # the recorded source types
    with as_target.session("s1"):
        assert as_target.watermarks("s1", ["public.t", "public.missing"]) == {"public.t": 10}
        assert as_target.watermarks("other_slot", ["public.t"]) == {}
    with pytest.raises(ApplyError, match="writes slot s1"), as_target.session("s2"):
        pass


def test_a_keyless_table_is_appended_to_and_replaced_after_a_truncate(target):
    def run(start: int, end: int, rows: list[tuple], truncated: bool = False):
        return target.apply_net("public.log", start, end, net(rows).drop_columns([FROM]), key=(), columns=COLUMNS,
                                type_names=TYPES, truncated=truncated)

    run(0, 10, [("I", [], None, 1, 1, "a"), ("I", [], None, 1, 1, "a")])
    run(10, 20, [("I", [], None, 2, 1, "b")])
    assert rows_of(target, "public.log") == [(1, 1, "a"), (1, 1, "a"), (2, 1, "b")]
    assert not run(10, 20, [("I", [], None, 9, 9, "again")]).committed
    run(20, 30, [("I", [], None, 3, 1, "c")], truncated=True)
    assert rows_of(target, "public.log") == [(3, 1, "c")] and target.watermark("public.log") == 30


def test_a_namespace_puts_every_target_table_in_it(tmp_path):
    target = IcebergTarget(local(tmp_path, namespace="lake.cdc"), "s1")
    apply(target, 0, 10, [("I", [], None, 1, 1, "a")])
    assert target.catalog.list_tables(("lake", "cdc")) == [("lake", "cdc", "t")]
    assert rows_of(target) == [(1, 1, "a")]


def test_rows_in_files_the_batch_does_not_touch_are_not_rewritten(target):
    """Copy-on-write per data file: a file is rewritten only when it holds a key the batch replaces or deletes."""
    apply(target, 0, 10, [("I", [], None, 1, 1, "a")])
    apply(target, 10, 20, [("I", [], None, 100, 1, "far")])
    before = {t.file.file_path for t in target.open("public.t").scan().plan_files()}  # type: ignore[union-attr]
    apply(target, 20, 30, [("U", [], None, 100, 2, "far2"), ("I", [], None, 200, 1, "new")])
    after = {t.file.file_path for t in target.open("public.t").scan().plan_files()}  # type: ignore[union-attr]
    assert len(before & after) == 1  # the file of key 1 stays; key 100's file is replaced
    assert rows_of(target) == [(1, 1, "a"), (100, 2, "far2"), (200, 1, "new")]


def test_lsns_of_a_net_frame_are_not_written(target):
    apply(target, 0, 10, [("I", [], None, 1, 1, "a")])
    table = target.open("public.t")
    assert table is not None and LSN not in [f.name for f in table.schema().fields]
