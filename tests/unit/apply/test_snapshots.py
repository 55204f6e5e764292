"""The apply's per-table sync-LSN rule (worker.c ``should_apply_changes_for_rel``: a table synchronised
at sync LSN S gets the changes of transactions whose commit record starts at or after S — S ≤ final_lsn)
and the held tables of open snapshot requests."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.apply import planning
from airflow_provider_pglogical.apply.batches import list_batches, read_relations
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.direct import filtered_on_source
from airflow_provider_pglogical.apply.snapshots import drop_synced_truncates, routed_sync_lsns, routed_table, without
from airflow_provider_pglogical.apply.targets.base import PlannedTable, TargetTable
from airflow_provider_pglogical.exceptions import ApplyError
from airflow_provider_pglogical.staging.reader import RelationColumn, RelationInfo, TruncateEvent
from tests.support.stage import BatchSpec, Chg, write_batch
from tests.unit.apply.conftest import ITEMS

SYNC = 0x1500


def _event(commit_lsn: int, *relations: str) -> TruncateEvent:
    return TruncateEvent(commit_lsn=commit_lsn, tx_order=0, relations=relations, cascade=False,
                         restart_identity=False)


def test_truncates_committed_before_the_sync_lsn_are_dropped_at_and_after_kept():
    events = [_event(SYNC - 1, "public.a", "public.b"), _event(SYNC, "public.a"), _event(SYNC + 1, "public.a")]
    kept = drop_synced_truncates(events, {"public.a": SYNC})
    assert [(e.commit_lsn, e.relations) for e in kept] == [(SYNC - 1, ("public.b",)), (SYNC, ("public.a",)),
                                                           (SYNC + 1, ("public.a",))]
    assert drop_synced_truncates(events, {}) == events


def test_without_leaves_out_held_tables_also_when_every_staged_table_is_applied(tmp_path):
    config = ApplyConfig(staging_root=str(tmp_path), slot="slot",
                         tables={"public.a": TableApplyConfig(), "public.b": TableApplyConfig()})
    assert without(config, set()) is config
    assert set(without(config, {"public.a"}).tables) == {"public.b"}
    every = ApplyConfig(staging_root=str(tmp_path), slot="slot")  # no tables: every staged one
    held = without(every, {"public.a"}, known={"public.a", "public.c"})
    assert held is not None
    assert held.table_config("public.a") is None and held.table_config("public.c") is not None


def test_without_is_none_when_every_table_is_held_not_a_config_of_every_table(tmp_path):
    config = ApplyConfig(staging_root=str(tmp_path), slot="slot", tables={"public.a": TableApplyConfig()})
    assert without(config, {"public.a"}) is None
    every = ApplyConfig(staging_root=str(tmp_path), slot="slot")
    assert without(every, {"public.a", "public.c"}, known={"public.a", "public.c"}) is None


def _ids(spark, tmp_path, start: int, sync: dict[str, int]) -> list[int]:
    changes = [Chg("I", SYNC - 0x100, 0, new={"id": 1, "grp": 1, "note": "before"}),
               Chg("I", SYNC, 0, new={"id": 2, "grp": 1, "note": "at"}),
               Chg("I", SYNC + 0x100, 0, new={"id": 3, "grp": 1, "note": "after"})]
    root = tmp_path / f"s{start:X}{len(sync)}"
    write_batch(root, "slot", BatchSpec(start, 0x2000, {ITEMS: changes}))
    (batch,) = list_batches(str(root), "slot")
    table = PlannedTable(ITEMS.name, ITEMS.name, ("id",), ("id", "grp", "note"), read_relations(batch)[ITEMS.name],
                         TableApplyConfig())
    frame = SparkBatchChanges(spark, batch, sync).net(table)
    return sorted(r["id"] for r in frame.select("id").collect())


def test_a_batch_across_the_sync_lsn_keeps_changes_committed_at_or_after_it(spark, tmp_path):
    assert _ids(spark, tmp_path, 0x1000, {ITEMS.name: SYNC}) == [2, 3]
    assert _ids(spark, tmp_path, 0x1000, {}) == [1, 2, 3]  # not synchronised later: everything


def _rel(table: str, columns: list[str], identity: tuple[str, ...], ancestors: tuple[str, ...] = ()) -> RelationInfo:
    return RelationInfo("public", table, "d", tuple(RelationColumn(c, "integer", c in identity) for c in columns),
                        partition_ancestors=ancestors)


def test_routed_leaves_take_their_roots_sync_lsn():
    """A routed root's snapshot holds every leaf's rows: each leaf ``ApplyConfig.routed`` sends to the root's
    target gets the root's sync LSN (a leaf with an entry of its own keeps its own, and none without one)."""
    config = ApplyConfig(staging_root="/x", slot="slot", tables={
        "public.meas": TableApplyConfig(leaves="route_to_root"), "public.meas_own": TableApplyConfig()})
    rels = {"public.meas_a": _rel("meas_a", ["id"], ("id",), ("public.meas_mid", "public.meas")),
            "public.meas_own": _rel("meas_own", ["id"], ("id",), ("public.meas",)),
            "public.other": _rel("other", ["id"], ("id",))}
    routed = config.routed(rels)
    sync = routed_sync_lsns(routed, {"public.meas": SYNC, "public.meas_own": SYNC + 5})
    assert sync == {"public.meas": SYNC, "public.meas_a": SYNC, "public.meas_own": SYNC + 5}
    assert routed_sync_lsns(routed, {}) == {}  # the root has no snapshot: its leaves' changes all apply
    kept = drop_synced_truncates([_event(SYNC - 1, "public.meas_a"), _event(SYNC, "public.meas_a")], sync)
    assert [e.commit_lsn for e in kept] == [SYNC]


def test_a_routed_snapshot_is_planned_as_the_roots_columns_with_one_part_per_leaf():
    """Leaves with another column order line up by name; their keys must agree (the change batches' rule)."""
    root = _rel("meas", ["id", "region", "v"], ("id", "region"))
    parts = [{"table": "public.meas_eu", "relation": {"schema": "public", "table": "meas_eu", "replica_identity": "d",
                                                     "columns": [{"name": c, "type_name": "integer",
                                                                  "is_identity": c != "v"} for c in ("id", "region", "v")]}},
             {"table": "public.meas_us", "relation": {"schema": "public", "table": "meas_us", "replica_identity": "d",
                                                     "columns": [{"name": c, "type_name": "integer",
                                                                  "is_identity": c != "v"} for c in ("v", "region", "id")]}}]
    cfg = TableApplyConfig(leaves="route_to_root", row_filter="id > 1")
    shape = planning.TableShape("public.meas", "dw.meas", ("id", "region"), ("id", "region", "v"))
    existing = TargetTable("dw.meas", {"id": "integer", "region": "integer", "v": "integer"}, ("id", "region"))
    table = routed_table("public.meas", "dw.meas", shape, root, cfg, parts, existing)
    assert (table.source, table.target, table.columns, table.key) == ("public.meas", "dw.meas", ("id", "region", "v"),
                                                                     ("id", "region"))
    assert [(p.source, p.columns, p.key, p.config.partition_of, p.config.row_filter) for p in table.parts] == [
        ("public.meas_eu", ("id", "region", "v"), ("id", "region"), "public.meas", "id > 1"),
        ("public.meas_us", ("v", "region", "id"), ("id", "region"), "public.meas", "id > 1")]
    assert routed_table("public.meas", "dw.meas", shape, root, cfg, [], existing).parts == ()
    other = dict(parts[1], relation=dict(parts[1]["relation"], columns=[
        {"name": c, "type_name": "integer", "is_identity": c == "id"} for c in ("v", "region", "id")]))
    with pytest.raises(ApplyError, match=r"public\.meas_eu and public\.meas_us routed to dw\.meas have different keys"):
        routed_table("public.meas", "dw.meas", shape, root, cfg, [parts[0], other], existing)


def test_a_configured_filter_is_found_in_the_snapshots_deparsed_filter_however_it_is_written():
    assert filtered_on_source("(id <= 5) AND (CAST(v AS integer) > 0)", "v::int > 0 -- positive")
    assert filtered_on_source("(id > 1)", "((id > 1))")
    assert not filtered_on_source("(id <= 5)", "id > 1")
    assert not filtered_on_source("(id <= 5) AND (id > 1)", "id > 1 AND")  # does not parse: evaluated again
    assert filtered_on_source(None, None) and not filtered_on_source(None, "id > 1")
