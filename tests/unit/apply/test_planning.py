"""Driver-side planning: keys, column lists, truncate sets, FK order."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.apply.batches import RelationColumn, RelationInfo, TruncateEvent
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.planning import choose_key, parents_first, plan_truncates, written_columns
from airflow_provider_pglogical.apply.targets.base import TargetTable
from airflow_provider_pglogical.exceptions import ApplyError

REL = RelationInfo("public", "t", "d", (RelationColumn("id", "int", True), RelationColumn("v", "text", False)))
FULL = RelationInfo("public", "t", "f", (RelationColumn("id", "int", True), RelationColumn("v", "text", True)))
FKS = [("public.child", "public.parent"), ("public.grandchild", "public.child")]


def test_the_key_is_the_replica_identity_or_the_target_pk_for_full_identity():
    assert choose_key(REL, TableApplyConfig(), None, ("id", "v")) == ("id",)
    assert choose_key(FULL, TableApplyConfig(), TargetTable("public.t", {}, ("id",)), ("id", "v")) == ("id",)
    assert choose_key(FULL, TableApplyConfig(), None, ("id", "v")) == ("id", "v")


def test_a_column_list_must_cover_the_identity_while_updates_are_applied():
    with pytest.raises(ApplyError, match="replica identity"):
        written_columns(REL, TableApplyConfig(columns=("v",)))
    assert written_columns(REL, TableApplyConfig(columns=("v",), actions=("insert",))) == ("v",)
    with pytest.raises(ApplyError, match="unknown"):
        written_columns(REL, TableApplyConfig(columns=("id", "nope")))


def test_cascade_follows_fks_transitively_unless_the_policy_is_never():
    targets = {"public.parent": ("public.parent", TableApplyConfig())}
    ev = [TruncateEvent(10, 0, ("public.parent",), cascade=True, restart_identity=True)]
    plan = plan_truncates(ev, targets, FKS)
    assert set(plan.position) == {"public.parent", "public.child", "public.grandchild"}
    assert plan.restart_identity == {"public.parent", "public.child", "public.grandchild"}
    never = {"public.parent": ("public.parent", TableApplyConfig(truncate_cascade="never"))}
    assert set(plan_truncates(ev, never, FKS).position) == {"public.parent"}


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
