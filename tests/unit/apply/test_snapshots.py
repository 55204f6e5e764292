"""The apply's per-table sync-LSN rule (worker.c ``should_apply_changes_for_rel``: a table synchronised
at sync LSN S gets the changes of transactions whose commit record starts at or after S — S ≤ final_lsn)
and the held tables of open snapshot requests."""

from __future__ import annotations

from airflow_provider_pglogical.apply.batches import list_batches, read_relations
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import SparkBatchChanges
from airflow_provider_pglogical.apply.snapshots import drop_synced_truncates, without
from airflow_provider_pglogical.apply.targets.base import PlannedTable
from airflow_provider_pglogical.staging.reader import TruncateEvent
from tests.unit.apply.conftest import ITEMS
from tests.unit.apply.stage import BatchSpec, Chg, write_batch

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
    assert held.table_config("public.a") is None and held.table_config("public.c") is not None


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
