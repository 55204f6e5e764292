"""Driver-side planning: keys, column lists, truncate sets, FK order."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_pglogical.apply.batches import RelationColumn, RelationInfo, TruncateEvent
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.planning import (
    batch_columns,
    choose_key,
    created_key,
    parents_first,
    plan_batch,
    plan_truncates,
    update_delete_problem,
    written_columns,
)
from airflow_provider_pglogical.apply.targets.base import TargetTable
from airflow_provider_pglogical.exceptions import ApplyError, InternalColumnNameError, SchemaChangeError

REL = RelationInfo("public", "t", "d", (RelationColumn("id", "int", True), RelationColumn("v", "text", False)))
FULL = RelationInfo("public", "t", "f", (RelationColumn("id", "int", True), RelationColumn("v", "text", True)))
NO_RI = RelationInfo("public", "t", "n", (RelationColumn("id", "int", False), RelationColumn("v", "text", False)))
NO_PK = RelationInfo("public", "t", "d", NO_RI.columns)
FKS = [("public.child", "public.parent"), ("public.grandchild", "public.child")]



def test_a_created_table_gets_the_source_primary_key_not_every_column_of_a_replica_identity_full_table():
    import dataclasses

    with_pk = dataclasses.replace(FULL, primary_key=("id",))
    assert created_key(with_pk, TableApplyConfig(), ("id", "v")) == ("id",)
    assert created_key(dataclasses.replace(FULL, primary_key=()), TableApplyConfig(), ("id", "v")) == ()
    assert created_key(FULL, TableApplyConfig(), ("id", "v")) == ()  # not recorded (older staging): no key
    assert created_key(with_pk, TableApplyConfig(), ("v",)) == ()  # the column list leaves the key out
    assert created_key(with_pk, TableApplyConfig(key_columns=("v",)), ("id", "v")) == ("v",)
    assert created_key(dataclasses.replace(REL, primary_key=("id",)), TableApplyConfig(), ("id", "v")) == ("id",)

def test_the_key_is_the_replica_identity_or_the_target_pk_for_full_identity():
    assert choose_key(REL, TableApplyConfig(), None, ("id", "v")) == ("id",)
    assert choose_key(FULL, TableApplyConfig(), TargetTable("public.t", {}, ("id",)), ("id", "v")) == ("id",)
    assert choose_key(FULL, TableApplyConfig(), None, ("id", "v")) == ("id", "v")


@pytest.mark.parametrize("rel", [NO_RI, NO_PK], ids=["nothing", "default-without-pk"])
def test_a_table_without_replica_identity_is_keyless_unless_key_columns_name_a_target_key(rel):
    assert choose_key(rel, TableApplyConfig(), None, ("id", "v")) == ()
    # Any replicated columns may key its INSERTs (upserts): UPDATE/DELETE never match by them.
    assert choose_key(rel, TableApplyConfig(key_columns=("v",)), None, ("id", "v")) == ("v",)
    with pytest.raises(ApplyError, match="not replicated"):
        choose_key(rel, TableApplyConfig(key_columns=("zz",)), None, ("id", "v"))
    assert "no replica identity" in update_delete_problem(rel, TableApplyConfig(), ())
    assert "no replica identity" in update_delete_problem(rel, TableApplyConfig(key_columns=("v",)), ())
    assert update_delete_problem(rel, TableApplyConfig(actions=("insert", "truncate")), ()) is None


def test_a_key_with_replica_identity_must_stay_within_it():
    with pytest.raises(ApplyError, match="within its replica identity"):
        choose_key(REL, TableApplyConfig(key_columns=("v",)), None, ("id", "v"))


def test_filter_columns_outside_the_identity_block_updates_and_deletes_only():
    assert "outside the replica identity" in update_delete_problem(REL, TableApplyConfig(), ("V",))
    assert update_delete_problem(REL, TableApplyConfig(), ("id",)) is None
    assert update_delete_problem(FULL, TableApplyConfig(), ("v",)) is None
    assert update_delete_problem(REL, TableApplyConfig(actions=("insert",)), ("v",)) is None
    assert "outside" in update_delete_problem(REL, TableApplyConfig(actions=("delete",)), ("v",))
    # "V" in the identity does not cover a filter on v: PostgreSQL's names are case-sensitive.
    cased = RelationInfo("public", "t", "d", (RelationColumn("V", "int", True), RelationColumn("v", "text", False)))
    assert "column(s) v outside" in update_delete_problem(cased, TableApplyConfig(), ("v",))


def test_a_column_list_must_cover_the_identity_while_updates_are_applied():
    with pytest.raises(ApplyError, match="replica identity"):
        written_columns(REL, TableApplyConfig(columns=("v",)))
    assert written_columns(REL, TableApplyConfig(columns=("v",), actions=("insert",))) == ("v",)
    with pytest.raises(ApplyError, match="unknown"):
        written_columns(REL, TableApplyConfig(columns=("id", "nope")))


def test_a_column_named_like_the_applys_own_is_refused_unless_the_column_list_leaves_it_out():
    odd = RelationInfo("public", "t", "d", (*REL.columns, RelationColumn("_pgl_after", "int", False),
                                            RelationColumn("_PGL_Kind", "int", False)))
    for written in (lambda: written_columns(odd, TableApplyConfig()), lambda: batch_columns([REL, odd], TableApplyConfig())):
        with pytest.raises(InternalColumnNameError, match='"_pgl_after", "_PGL_Kind" start with _pgl_') as info:
            written()
        assert info.value.columns == ("_pgl_after", "_PGL_Kind") and "columns:" in str(info.value)
    assert written_columns(odd, TableApplyConfig(columns=("id", "v"))) == ("id", "v")
    assert batch_columns([odd, REL], TableApplyConfig(columns=("id", "v"))) == ("id", "v")
    # a row filter's columns sit beside the working columns while it is evaluated, listed or not
    filtered = TableApplyConfig(columns=("id", "v"), row_filter='v > 1 AND "_PGL_Kind" IS NOT NULL')
    for written in (lambda: written_columns(odd, filtered), lambda: batch_columns([odd], filtered)):
        with pytest.raises(InternalColumnNameError, match='"_PGL_Kind" start with') as info:
            written()
        assert info.value.columns == ("_PGL_Kind",) and "row_filter" in str(info.value)


def test_cascade_follows_fks_transitively_unless_the_policy_is_never():
    targets = {"public.parent": ("public.parent", TableApplyConfig())}
    ev = [TruncateEvent(10, 0, ("public.parent",), cascade=True, restart_identity=True)]
    plan = plan_truncates(ev, targets, FKS)
    assert set(plan.position) == {"public.parent", "public.child", "public.grandchild"}
    assert plan.restart_identity == {"public.parent", "public.child", "public.grandchild"}
    never = {"public.parent": ("public.parent", TableApplyConfig(truncate_cascade="never"))}
    assert set(plan_truncates(ev, never, FKS).position) == {"public.parent"}


def test_cascade_leaves_a_table_whose_snapshot_is_newer_than_the_truncate():
    # TRUNCATE parent CASCADE at 10; the child was resynced at 15: its snapshot holds the rows inserted
    # after the truncate (as the source and a native subscriber do), so emptying it would lose them.
    targets = {"public.parent": ("public.parent", TableApplyConfig())}
    ev = [TruncateEvent(10, 0, ("public.parent",), cascade=True, restart_identity=False)]
    plan = plan_truncates(ev, targets, FKS, synced={"public.child": 15})
    assert set(plan.position) == {"public.parent", "public.grandchild"}
    assert [t for t, _ in plan.events] == ["public.grandchild", "public.parent"]
    # A snapshot taken before the truncate (or at it) does not hold it: the child is emptied as before.
    assert set(plan_truncates(ev, targets, FKS, synced={"public.child": 10}).position) == \
        {"public.parent", "public.child", "public.grandchild"}
    # A later truncate in the same batch, after the child's sync LSN, empties it again.
    later = [*ev, TruncateEvent(20, 0, ("public.parent",), cascade=True, restart_identity=False)]
    assert plan_truncates(later, targets, FKS, synced={"public.child": 15}).position["public.child"] == (20, 0)


def test_a_batch_plan_keeps_a_resynced_child_and_refuses_to_empty_the_parent_it_references():
    child = RelationInfo("public", "child", "d", REL.columns)
    pending = {"public.parent": ("public.parent", TableApplyConfig()),
               "public.child": ("public.child", TableApplyConfig())}
    existing = {t: TargetTable(t, {"id": "int", "v": "text"}, ("id",)) for t in ("public.parent", "public.child")}
    ev = [TruncateEvent(10, 0, ("public.parent",), cascade=True, restart_identity=False)]
    fks = [("public.child", "public.parent")]

    def plan(synced: dict[str, int], events: list[TruncateEvent] = ev) -> Any:
        return plan_batch("s", 5, 40, {"public.child"}, pending, {"public.child": child}, events, {}, fks,
                          existing, synced=synced)

    # The child's snapshot (sync LSN 15) holds rows the truncate at 10 did not remove: it is not emptied, and the
    # parent cannot be emptied under it (PostgreSQL refuses): one line naming both and the way out.
    with pytest.raises(ApplyError, match=r"0/F\) is newer than the truncate: resync both \(pglogical resync "
                                         r"--table public.parent --table public.child\)$"):
        plan({"public.child": 15})
    # Both resynced after the truncate: the runner drops it (snapshots.drop_synced_truncates), nothing is emptied.
    assert plan({"public.child": 15, "public.parent": 15}, []).truncate == ()
    # A snapshot from before the truncate: both are emptied, as before.
    assert plan({"public.child": 8}).truncate == ("public.parent", "public.child")
    # A later truncate of the batch after the child's sync LSN empties both again.
    again = [*ev, TruncateEvent(20, 0, ("public.parent",), cascade=True, restart_identity=False)]
    assert plan({"public.child": 15}, again).truncate == ("public.parent", "public.child")
    assert plan({"public.child": 15}, again).tables[0].truncated_at == (20, 0)


def test_the_last_truncate_position_wins_and_unconfigured_relations_are_ignored():
    targets = {"public.parent": ("public.parent", TableApplyConfig())}
    ev = [TruncateEvent(20, 3, ("public.parent", "public.other"), False, False),
          TruncateEvent(10, 0, ("public.parent",), False, False)]
    assert plan_truncates(ev, targets, FKS).position == {"public.parent": (20, 3)}


def test_parents_come_before_children():
    assert parents_first(["public.grandchild", "public.child", "public.parent"], FKS) == \
        ["public.parent", "public.child", "public.grandchild"]


def test_config_round_trips_through_json_and_rejects_unknown_policies():
    cfg = ApplyConfig("s", "/tmp/x", {"public.t": TableApplyConfig(row_filter="id > 1", columns=("id",))})
    assert ApplyConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ApplyError):
        TableApplyConfig(conflict="ignore")


def test_wildcard_entries_select_tables_like_a_publication_with_exact_names_first():
    cfg = ApplyConfig(slot="s", staging_root="/x", tables={
        "*": TableApplyConfig(conflict="strict"), "sales.*": TableApplyConfig(actions=("insert",)),
        "sales.orders": TableApplyConfig(target="dw.orders")})
    assert cfg.table_config("sales.orders").target == "dw.orders"
    assert cfg.table_config("sales.new_table").actions == ("insert",)
    assert cfg.table_config("public.anything").conflict == "strict"
    only_sales = ApplyConfig(slot="s", staging_root="/x", tables={"sales.*": TableApplyConfig()})
    assert only_sales.table_config("public.t") is None
    bad = ApplyConfig(slot="s", staging_root="/x", tables={"*": TableApplyConfig(target="public.one")})
    with pytest.raises(ApplyError, match="wildcard"):
        bad.table_config("public.t")


def test_plan_batch_carries_schema_changes_and_the_update_delete_rule_to_the_target():
    v1 = RelationInfo("public", "t", "d", (RelationColumn("id", "integer", True), RelationColumn("v", "text", False)))
    v2 = RelationInfo("public", "t", "d", (*v1.columns, RelationColumn("w", "bigint", False)))
    table = TargetTable("public.t", {"id": "integer", "v": "text", "gone": "text"}, ("id",), ("gone",))

    def plan(cfg: TableApplyConfig):
        return plan_batch("s", 10, 20, {"public.t"}, {"public.t": ("public.t", cfg)}, {"public.t": v2}, [], {}, [],
                          {"public.t": table}, {"public.t": [(10, v1), (15, v2)]}, {"public.t": frozenset({"v"})})

    planned = plan(TableApplyConfig(row_filter="v > 'a'")).tables[0]
    assert [(c.kind, c.column, c.new_type) for c in planned.column_changes] == [
        ("add", "w", "bigint"), ("drop_not_null", "gone", None)]
    assert "outside the replica identity" in planned.update_delete_problem
    assert table.after(planned.column_changes) == TargetTable(
        "public.t", {"id": "integer", "v": "text", "gone": "text", "w": "bigint"}, ("id",), ())
    assert plan(TableApplyConfig(row_filter="v > 'a'", actions=("insert",))).tables[0].update_delete_problem is None
    with pytest.raises(SchemaChangeError, match="new column w"):
        plan(TableApplyConfig(schema_changes="fail"))


def test_plan_batch_writes_the_columns_of_every_schema_version_and_keys_by_the_latest():
    """A column dropped (or added and dropped) inside the batch is written by the changes that have it: the
    planned columns are those of all versions, in the order they appear, each typed as in its last version."""
    v1 = RelationInfo("public", "t", "f", (RelationColumn("id", "integer", True), RelationColumn("c", "integer", True)))
    v2 = RelationInfo("public", "t", "f", (RelationColumn("id", "integer", True), RelationColumn("x", "text", True)))
    v3 = RelationInfo("public", "t", "f", (RelationColumn("id", "integer", True),))
    table = TargetTable("public.t", {"id": "integer", "c": "integer"}, ())
    planned = plan_batch("s", 10, 40, {"public.t"}, {"public.t": ("public.t", TableApplyConfig())}, {"public.t": v3},
                         [], {}, [], {"public.t": table}, {"public.t": [(10, v1), (20, v2), (30, v3)]}).tables[0]
    assert planned.columns == ("id", "c", "x")
    assert planned.key == ("id",)  # full identity without a target key: the latest version's columns
    assert [(c.kind, c.column, c.new_type) for c in planned.column_changes] == [("add", "x", "text")]
    assert planned.type_names() == {"id": "integer", "c": "integer", "x": "text"}
    listed = plan_batch("s", 10, 40, {"public.t"}, {"public.t": ("public.t", TableApplyConfig(columns=("id",)))},
                        {"public.t": v3}, [], {}, [], {"public.t": table},
                        {"public.t": [(10, v1), (20, v2), (30, v3)]}).tables[0]
    assert listed.columns == ("id",) and listed.column_changes == ()
