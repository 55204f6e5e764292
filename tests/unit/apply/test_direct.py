"""The direct path's file rule (``apply/direct.py``): one schema version holding every written column, or Spark."""

from __future__ import annotations

from airflow_provider_pglogical.apply.batches import list_batches
from airflow_provider_pglogical.apply.direct import same_schema
from tests.unit.apply.conftest import ITEMS
from tests.unit.apply.stage import BatchSpec, Chg, Rel, write_batch

ITEMS_DROPPED = Rel("public", "items", ITEMS.columns[:2], version=2)  # after DROP COLUMN note


def test_a_table_batch_of_several_schema_versions_or_lacking_a_written_column_is_not_direct(tmp_path):
    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {
        ITEMS: [Chg("I", 10, 0, new={"id": 1, "grp": 1, "note": "n"})],
        ITEMS_DROPPED: [Chg("I", 20, 0, new={"id": 2, "grp": 2})]}))
    (batch,) = list_batches(str(tmp_path), "slot")
    v1, v2 = (f"{batch.ref.path}/{f}" for f in batch.table_files[ITEMS.name])
    assert not same_schema([v1, v2], ("id", "grp", "note"))
    assert same_schema([v1], ("id", "grp", "note"))
    assert not same_schema([v2], ("id", "grp", "note"))  # note is written by the batch, v2 lacks it
    assert same_schema([v2], ("id", "grp"))
