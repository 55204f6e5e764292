"""DeltaTarget without Spark: net changes → one MERGE commit per table and batch, watermark in the Delta log."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_provider_pglogical.apply.batches import (
    RelationColumn,
    RelationInfo,
    list_batches,
    read_by_executors,
    read_relations,
)
from airflow_provider_pglogical.apply.changes import SnapshotChanges, SparkBatchChanges
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.targets.base import COMMIT, ORDER, PlannedBatch, PlannedSnapshot, PlannedTable
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation, app_id
from airflow_provider_pglogical.apply.targets.delta.names import case_clashes, check_case_distinct, nested_clashes
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from airflow_provider_pglogical.apply.transforms import FROM, KEEP, KIND, LSN, TOUCHED
from airflow_provider_pglogical.exceptions import ApplyError, CaseInsensitiveNamesError, UnresolvableToastError
from airflow_provider_pglogical.staging.layout import resolve_filesystem
from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch

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


def test_the_delta_target_answers_the_target_protocol_from_its_log(target):
    from airflow_provider_pglogical.apply.targets.base import Target

    as_target: Target = target  # mypy checks the protocol; the calls below check the behaviour
    assert as_target.describe("public.t") is None and as_target.foreign_keys() == []
    as_target.create_table("public.t", [("id", "integer"), ("n", "integer"), ("body", "text")], ("id",))
    announced = as_target.describe("public.t")
    assert announced is not None and announced.columns == TYPES and announced.primary_key == ()
    assert not DeltaTable.is_deltatable(target.location.table_uri("public.t"))  # created by its first commit
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
    assert rows_of(target.location, "public.log") == [(1, 1, "a"), (1, 1, "a"), (2, 1, "b")]
    assert not run(10, 20, [("I", [], None, 9, 9, "again")]).committed
    run(20, 30, [("I", [], None, 3, 1, "c")], truncated=True)
    assert rows_of(target.location, "public.log") == [(3, 1, "c")] and target.watermark("public.log") == 30


def test_the_runner_frames_become_the_arrow_shapes_of_the_mirror_and_the_feed():
    from datetime import UTC, datetime

    from airflow_provider_pglogical.apply.targets.base import PlannedTruncate, from_column
    from airflow_provider_pglogical.apply.targets.delta import changelog
    from airflow_provider_pglogical.apply.targets.delta.changelog import with_truncates
    from airflow_provider_pglogical.apply.targets.delta.mirror import with_from

    flat = pa.table({KIND: ["I", "U"], from_column(0): pa.array([7, None], pa.int32()),
                     "id": pa.array([1, 2], pa.int32())})
    moved = with_from(flat, ("id",))
    assert moved.column_names == [KIND, "id", FROM] and moved.column(FROM).to_pylist() == [{"id": 7}, None]
    feed = pa.table({changelog.OP: ["insert", "delete"], changelog.COMMIT_LSN: pa.array([30, 10], pa.int64()),
                     changelog.TX_ORDER: pa.array([0, 1], pa.int64()), changelog.LSN: pa.array([31, 11], pa.int64()),
                     changelog.COMMIT_TIME: pa.array([None, None], pa.timestamp("us", tz="UTC")),
                     changelog.XID: pa.array([5, 4], pa.int64()),
                     changelog.UNCHANGED: pa.array([[], []], pa.list_(pa.string())), "id": pa.array([1, 2], pa.int32())})
    at = datetime(2026, 1, 1, tzinfo=UTC)
    rows = with_truncates(feed, [PlannedTruncate("public.t", 20, 3, 21, 9, at)])
    assert rows.column(changelog.OP).to_pylist() == ["delete", "truncate", "insert"]
    assert rows.slice(1, 1).to_pylist()[0] | {"id": None} == {
        changelog.OP: "truncate", changelog.COMMIT_LSN: 20, changelog.TX_ORDER: 3, changelog.LSN: 21,
        changelog.COMMIT_TIME: at, changelog.XID: 9, changelog.UNCHANGED: [], "id": None}


def test_folded_exactness_notes_are_unwrapped_or_refused_naming_column_and_lsn():
    from airflow_provider_pglogical.apply.targets.delta.types import DeltaValueError, unwrap_notes

    folded = pa.struct([("_pgl_value", pa.decimal128(6, 2)), ("_pgl_note", pa.string())])
    arrays = pa.struct([("_pgl_value", pa.list_(pa.int32())), ("_pgl_note", pa.string()),
                        ("_pgl_element_notes", pa.list_(pa.string()))])
    clean = pa.table({LSN: pa.array([16, 17], pa.int64()),
                      "n": pa.array([{"_pgl_value": 1, "_pgl_note": None}, None], folded),
                      "a": pa.array([{"_pgl_value": [1, 2], "_pgl_note": None, "_pgl_element_notes": [None, None]},
                                     {"_pgl_value": None, "_pgl_note": None, "_pgl_element_notes": None}], arrays),
                      "_old": pa.array([{"n": {"_pgl_value": 3, "_pgl_note": None}}, None],
                                       pa.struct([("n", folded)]))})
    out = unwrap_notes(clean, "batch 0-10: public.t", LSN)
    assert out.column("n").to_pylist()[0] is not None and out.column("n").type == pa.decimal128(6, 2)
    assert out.column("a").to_pylist() == [[1, 2], None]
    assert out.column("_old").type == pa.struct([("n", pa.decimal128(6, 2))])
    nan = clean.set_column(1, "n", pa.array([None, {"_pgl_value": None, "_pgl_note": "NaN"}], folded))
    with pytest.raises(DeltaValueError, match=r"public\.t: column n \(change at LSN 11\)"):
        unwrap_notes(nan, "batch 0-10: public.t", LSN)
    element = clean.set_column(2, "a", pa.array(
        [{"_pgl_value": [1], "_pgl_note": None, "_pgl_element_notes": ["NaN"]}, None], arrays))
    with pytest.raises(DeltaValueError, match=r"column a \(change at LSN 10\)"):
        unwrap_notes(element, "batch 0-10: public.t", LSN)


def test_columns_differing_only_by_case_are_found_with_the_changelog_columns():
    assert case_clashes(["id", "Val", "val", "x", "VAL"]) == [("Val", "val", "VAL")]
    assert case_clashes(["id", "val"]) == []
    # A change feed's own columns count too: a source column _OP is Delta's _op.
    with pytest.raises(CaseInsensitiveNamesError, match='"_op" and "_OP"') as info:
        check_case_distinct("batch 1-2", "public.t", ("_op", "id", "_OP"))
    assert info.value.table == "public.t" and info.value.columns == ("_op", "_OP")
    assert "\n" not in str(info.value) and "columns:" in str(info.value)


def _planned(*columns: str) -> PlannedTable:
    relation = RelationInfo("public", "t", "d", tuple(RelationColumn(c, "integer", c == "id") for c in columns))
    return PlannedTable("public.t", "public.t", ("id",), columns, relation, TableApplyConfig())


def test_a_clash_with_the_changelog_columns_or_the_tables_own_columns_is_refused_before_anything_commits(tmp_path):
    """``changes`` is never read: every refusal comes before the first table of a batch or snapshot commits."""
    location = DeltaLocation(str(tmp_path / "lake"))
    feed = DeltaTarget(location, "s1", mode="changelog")
    with pytest.raises(CaseInsensitiveNamesError, match='"_op" and "_OP"'):  # the feed's own _op column
        feed.apply_batch(PlannedBatch("s1", 10, 20, (_planned("id", "_OP"),)), changes=None)
    mirror = DeltaTarget(location, "s1")
    apply(mirror, 0, 10, [("I", [], None, 1, 1, "a")])  # the table holds body: a source that dropped it …
    assert mirror.apply_batch(PlannedBatch("s1", 0, 10, (_planned("id", "n", "_OP"),)), changes=None).applied is False
    for planned in (_planned("id", "n", "Body"), _planned("id", "N")):  # … and adds "Body"; or a column renamed
        with pytest.raises(CaseInsensitiveNamesError, match="differ only by case"):
            mirror.apply_batch(PlannedBatch("s1", 10, 20, (planned,)), changes=None)
        with pytest.raises(CaseInsensitiveNamesError, match="differ only by case"):
            mirror.apply_snapshot(PlannedSnapshot("s1", 20, (planned,)), changes=None)
    assert mirror.watermark("public.t", "s1") == 10


def test_a_composite_whose_attributes_differ_only_by_case_is_refused_before_any_table_commits(tmp_path):
    """A composite type with attributes ``"A"`` and ``a`` (here in an array of composites): its staged struct's field
    names come from the snapshot files' footers, so the refusal comes before the first table loads, and no Spark
    session is started for it."""
    def no_spark() -> Any:
        raise AssertionError("a Spark session was started: a table was being loaded before the refusal")

    pair = pa.struct([("A", pa.int32()), ("a", pa.string())])
    images = {"public.t": pa.array([{"id": 1, "n": 2, "body": "x"}],
                                   pa.struct([("id", pa.int32()), ("n", pa.int32()), ("body", pa.string())])),
              "public.c": pa.array([{"id": 1, "p": [{"A": 1, "a": "x"}]}],
                                   pa.struct([("id", pa.int32()), ("p", pa.list_(pair))]))}
    uris = {}
    for name, new in images.items():
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"new": new}), tmp_path / name / "c1.parquet")
        uris[name] = (str(tmp_path / name), ("c1.parquet",))
    composite = RelationInfo("public", "c", "d", (RelationColumn("id", "integer", True),
                                                   RelationColumn("p", "public.pair[]", False)))
    tables = (_planned(*COLUMNS), PlannedTable("public.c", "public.c", ("id",), ("id", "p"), composite,
                                                TableApplyConfig()))
    target = DeltaTarget(DeltaLocation(str(tmp_path / "lake")), "s1")
    with pytest.raises(CaseInsensitiveNamesError, match=r'"p\[\]\.A" and "p\[\]\.a"') as info:
        target.apply_snapshot(PlannedSnapshot("s1", 20, tables), SnapshotChanges(SparkOnDemand(no_spark), uris))
    assert info.value.table == "public.c" and "\n" not in str(info.value) and "columns:" in str(info.value)
    assert target.location.open("public.t") is None
    assert nested_clashes({"m": pa.map_(pa.string(), pa.struct([("x", pa.int8()), ("X", pa.int8())])),
                           "ok": pair.field(0).type}) == [("m.value.x", "m.value.X")]


def _snapshot_of(tmp_path, name: str, new: pa.Array) -> dict[str, tuple[str, tuple[str, ...]]]:
    """A one-chunk snapshot of ``name`` whose staged ``new`` images are ``new``."""
    (tmp_path / name).mkdir()
    pq.write_table(pa.table({"new": new}), tmp_path / name / "c1.parquet")
    return {name: (str(tmp_path / name), ("c1.parquet",))}


def test_a_composite_attribute_renamed_only_by_case_is_refused_beside_the_tables_own_field(tmp_path):
    """The table holds ``p struct<val>``; the source renames the attribute to ``"Val"``: the struct would need both
    fields, so the snapshot is refused before it commits (the staged struct alone has no clash)."""
    location = DeltaLocation(str(tmp_path / "lake"))
    write_deltalake(location.table_uri("public.c"), pa.table({"id": pa.array([1], pa.int32()),
                                                              "p": pa.array([{"val": 1}], pa.struct([("val", pa.int32())]))}))
    renamed = pa.struct([("id", pa.int32()), ("p", pa.struct([("Val", pa.int32())]))])
    uris = _snapshot_of(tmp_path, "public.c", pa.array([{"id": 1, "p": {"Val": 2}}], renamed))
    composite = RelationInfo("public", "c", "d", (RelationColumn("id", "integer", True),
                                                   RelationColumn("p", "public.pair", False)))
    table = PlannedTable("public.c", "public.c", ("id",), ("id", "p"), composite, TableApplyConfig())
    target = DeltaTarget(location, "s1")
    with pytest.raises(CaseInsensitiveNamesError, match=r'"p\.val" and "p\.Val"'):
        target.apply_snapshot(PlannedSnapshot("s1", 20, (table,)), SnapshotChanges(SparkOnDemand(_no_spark), uris))
    assert DeltaTable(location.table_uri("public.c")).version() == 0
    assert nested_clashes({"p": renamed.field("p").type}) == []


def _no_spark() -> Any:
    raise AssertionError("a Spark session was started")


PAIR = pa.struct([("A", pa.int32()), ("a", pa.string())])
PAIRS_V1 = Rel("public", "c", (Col("id", pa.int32(), "integer", True), Col("p", PAIR, "public.pair")))
# A later schema version adds a composite column: its type comes from the second file's footer.
PAIRS_V2 = Rel("public", "c", (*PAIRS_V1.columns, Col("q", pa.struct([("x", pa.int8())]), "public.q")), version=2)


def test_a_batchs_staged_types_come_from_its_footers_read_here_or_surveyed_by_the_executors(spark, s3, tmp_path):
    """``SparkBatchChanges.staged_types``: staging this process reads gives its footers without a Spark session;
    staging on an object store with a master that is not local, the executors' survey. Both give every schema
    version's types, and either way a Delta batch with a composite's attributes differing only by case is refused."""
    local = tmp_path / "staging"
    write_batch(local, "slot", BatchSpec(0x1000, 0x2000, {
        PAIRS_V1: [Chg("I", 0x1100, 0, new={"id": 1, "p": {"A": 1, "a": "x"}})],
        PAIRS_V2: [Chg("I", 0x1200, 0, new={"id": 2, "p": None, "q": {"x": 3}})]}))
    fs, root = resolve_filesystem(f"s3://{s3.bucket}/staging")
    pafs.copy_files(str(local), root, destination_filesystem=fs)
    (here,) = list_batches(str(local), "slot")
    (there,) = list_batches(f"s3://{s3.bucket}/staging", "slot", local_master=False)
    assert not read_by_executors(here) and read_by_executors(there) and not there.surveyed
    table = PlannedTable("public.c", "public.c", ("id",), ("id", "p", "q"), read_relations(here)["public.c"],
                         TableApplyConfig())
    expected = {"id": pa.int32(), "p": PAIR, "q": pa.struct([("x", pa.int8())])}
    assert SparkBatchChanges(SparkOnDemand(_no_spark), here).staged_types(table) == expected
    assert SparkBatchChanges(spark, there).staged_types(table) == expected
    assert sorted(there.surveyed) == sorted(there.table_files["public.c"])  # the executors read the footers
    target = DeltaTarget(DeltaLocation(str(tmp_path / "lake")), "s1")
    for batch, session in ((here, SparkOnDemand(_no_spark)), (there, spark)):
        with pytest.raises(CaseInsensitiveNamesError, match=r'"p\.A" and "p\.a"'):
            target.apply_batch(PlannedBatch("s1", 0x1000, 0x2000, (table,)), SparkBatchChanges(session, batch))
    assert target.location.open("public.c") is None
