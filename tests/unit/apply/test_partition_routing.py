"""Leaf partitions routed to their root's target: the routed config, several sources planned into one target
table, and a leaf's TRUNCATE as a delete by its partition constraint (no I/O)."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.apply.batches import RelationColumn, RelationInfo, TruncateEvent
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.planning import pending_tables, plan_batch
from airflow_provider_pglogical.apply.targets.base import PlannedLeafTruncate, TargetTable
from airflow_provider_pglogical.exceptions import ApplyError

COLS = (RelationColumn("id", "integer", True), RelationColumn("region", "text", True), RelationColumn("v", "integer", False))
EU = RelationInfo("public", "meas_eu", "d", COLS, ("public.meas",), "((region IS NOT NULL) AND (region = 'eu'::text))")
# attached with another column order: the same key, listed in its own order
ASIA = RelationInfo("public", "meas_asia", "d", (COLS[2], COLS[1], COLS[0]), ("public.meas",),
                    "((region IS NOT NULL) AND (region = 'asia'::text))")
# a sub-partitioned leaf: its ancestors, parent first
US_1 = RelationInfo("public", "meas_us_1", "d", COLS, ("public.meas_us", "public.meas"), "(region = 'us'::text)")
PLAIN = RelationInfo("public", "other", "d", COLS)
RELS = {r.qualified_name: r for r in (EU, ASIA, US_1, PLAIN)}
TARGET = TargetTable("dw.meas", {"id": "integer", "region": "text", "v": "integer"}, ("id", "region"))


def routed(**root) -> ApplyConfig:
    return ApplyConfig("s", "/x", tables={"public.meas": TableApplyConfig(leaves="route_to_root", **root),
                                          "public.other": TableApplyConfig()}).routed(RELS)


def test_leaves_get_their_top_most_routing_ancestors_entry_and_target():
    config = routed(target="dw.meas", actions=("insert", "truncate"))
    for leaf in ("public.meas_eu", "public.meas_asia", "public.meas_us_1"):
        cfg = config.table_config(leaf)
        assert (cfg.target, cfg.partition_of, cfg.leaves, cfg.actions) == \
            ("dw.meas", "public.meas", "own", ("insert", "truncate"))
    assert config.table_config("public.other").partition_of is None
    assert routed().table_config("public.meas_eu").target == "public.meas"  # default: the root's own name
    # a leaf with an entry of its own keeps it; without any routing entry nothing changes
    own = ApplyConfig("s", "/x", tables={"public.meas": TableApplyConfig(leaves="route_to_root"),
                                         "public.meas_eu": TableApplyConfig(target="x.eu")}).routed(RELS)
    assert own.table_config("public.meas_eu").target == "x.eu" and own.table_config("public.meas_asia").partition_of
    plain = ApplyConfig("s", "/x", tables={"public.meas": TableApplyConfig()})
    assert plain.routed(RELS) is plain and plain.table_config("public.meas_eu") is None
    # the JSON the Spark app receives keeps the settings
    assert ApplyConfig.from_json(config.to_json()) == config


def plan(sources, truncates=(), marks=None, existing=None):
    config = routed(target="dw.meas")
    pending = pending_tables(set(sources) | {r for t in truncates for r in t.relations}, config, marks or {}, 100)
    return plan_batch("s", 10, 100, set(sources), pending, RELS, list(truncates), marks or {}, [],
                      existing if existing is not None else {"dw.meas": TARGET})


def test_routed_leaves_are_one_planned_table_with_a_part_per_leaf_in_the_first_ones_column_order():
    batch = plan(["public.meas_eu", "public.meas_asia"])
    [table] = batch.tables
    assert table.target == "dw.meas" and [p.source for p in table.parts] == ["public.meas_asia", "public.meas_eu"]
    assert table.columns == ("v", "region", "id") and {p.key for p in table.parts} == {table.key}
    assert set(table.key) == {"id", "region"}
    assert batch.watermark_tables == ("dw.meas",) and batch.truncate == () and batch.leaf_truncates == ()
    [single] = plan(["public.meas_eu"]).tables
    assert single.parts == () and single.source == "public.meas_eu"


def test_a_leaf_truncate_empties_only_its_rows_and_voids_only_its_own_earlier_changes():
    ev = TruncateEvent(50, 3, ("public.meas_eu", "public.meas_asia"), cascade=False, restart_identity=False, lsn=55)
    batch = plan(["public.meas_eu", "public.meas_us_1"], [ev])
    assert batch.truncate == () and batch.truncates == ()  # the shared target is not emptied
    assert batch.leaf_truncates == (
        PlannedLeafTruncate("dw.meas", "public.meas_eu", EU.partition_constraint, 50, 3, 55),
        PlannedLeafTruncate("dw.meas", "public.meas_asia", ASIA.partition_constraint, 50, 3, 55))
    parts = {p.source: p.truncated_at for p in batch.tables[0].parts}
    assert parts == {"public.meas_eu": (50, 3), "public.meas_us_1": None}
    # already applied to the target: nothing
    assert plan(["public.meas_eu"], [ev], marks={"dw.meas": 100}).leaf_truncates == ()


def test_a_leaf_truncate_without_a_staged_constraint_and_unrelated_sources_sharing_a_target_are_refused():
    import dataclasses

    old = dataclasses.replace(EU, partition_constraint=None)
    ev = TruncateEvent(50, 3, ("public.meas_eu",), cascade=False, restart_identity=False, lsn=0x16B3748)
    config = routed(target="dw.meas")
    pending = pending_tables({"public.meas_eu"}, config, {}, 100)
    with pytest.raises(ApplyError, match=r"TRUNCATE of leaf partition public\.meas_eu at LSN 0/16B3748 cannot empty "
                                         r"only its rows of dw\.meas"):
        plan_batch("s", 10, 100, set(), pending, {**RELS, "public.meas_eu": old}, [ev], {}, [], {"dw.meas": TARGET})
    shared = {"public.meas_eu": ("dw.meas", TableApplyConfig(target="dw.meas")),
              "public.other": ("dw.meas", TableApplyConfig(target="dw.meas"))}
    with pytest.raises(ApplyError, match="only leaf partitions routed to their root's target"):
        plan_batch("s", 10, 100, set(shared), shared, RELS, [], {}, [], {"dw.meas": TARGET})
