"""The direct path against the Spark transforms: whenever ``direct.batch_files`` hands a table-batch's files over,
``direct.net_rows`` over them gives exactly the net frame ``SparkBatchChanges.net`` builds.

Random batches (``tests/support/direct_batches.py``) are mostly eligible (every key fresh) and sometimes not — a key
repeated, an unchanged-TOAST value, a row filter, an action left out of the publication — so a rule that let such a
batch through would show as a disagreement here (the property of ``decoding/speedups.py``'s tests, for the apply).
"""

from __future__ import annotations

import tempfile

import pyarrow.parquet as pq
from hypothesis import HealthCheck, event, given, settings

from airflow_provider_pglogical.apply import direct
from airflow_provider_pglogical.apply.batches import list_batches, read_relations
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.config import ACTIONS, TableApplyConfig
from airflow_provider_pglogical.apply.targets.base import Cut, PlannedTable
from tests.support.direct_batches import KEYS, batches
from tests.support.stage import BatchSpec, Chg, Rel, write_batch
from tests.unit.apply.conftest import ITEMS


def _spark_rows(frame) -> list[tuple]:
    """The net frame's rows in ``direct.net_rows``' layout (KEEP printed as the array literal it is staged as)."""
    out = []
    for r in frame.collect():
        values = list(r)
        keep = values[1]
        values[1] = "{" + ",".join(keep) + "}" if keep is not None else None
        out.append(tuple(values))
    return sorted(out, key=repr)


def _direct_rows(net: direct.DirectNet) -> list[tuple]:
    rows = []
    for path in net.files:
        table = pq.read_table(path, columns=["op", "lsn", "old", "new"])
        for batch in direct.net_rows(table, net.key, net.columns):
            rows.extend(tuple(r.values()) for r in batch.to_pylist())
    return sorted(rows, key=repr)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_when_the_rule_hands_files_over_their_net_rows_are_the_spark_transforms(spark, drawn) -> None:
    rel, changes, config = drawn
    with tempfile.TemporaryDirectory() as root:
        write_batch(root, "slot", BatchSpec(0x1000, 0x2000, {rel: changes}))
        (batch,) = list_batches(root, "slot")
        columns = tuple(c.name for c in rel.columns)
        table = PlannedTable(rel.name, rel.name, KEYS[rel], columns, read_relations(batch)[rel.name], config)
        net = direct.batch_files(table, batch, None)
        event("compacted in process" if net is not None and net.compacted else
              "direct" if net is not None else "Spark path only")
        if net is None or net.compacted:
            return  # the Spark path applies it, or the kernels net it (tests/unit/apply/test_kernels.py)
        assert config.actions == ACTIONS and not config.row_filter
        assert _direct_rows(net) == _spark_rows(SparkBatchChanges(spark, batch).net(table))


def test_a_snapshot_cut_off_is_a_cut_and_a_switched_off_path_keeps_the_spark_transforms(tmp_path, monkeypatch) -> None:
    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {ITEMS: [Chg("I", 10, 0, new={"id": 1})]}))
    (batch,) = list_batches(str(tmp_path), "slot")
    table = PlannedTable(ITEMS.name, ITEMS.name, ("id",), ("id", "grp", "note"), read_relations(batch)[ITEMS.name],
                         TableApplyConfig())
    found = direct.batch_files(table, batch, None)
    assert found is not None and found.cut is None
    cut = direct.batch_files(table, batch, 0x1800)  # the batch starts before the table's sync LSN
    assert cut is not None and cut.cut == Cut(None, 0x1800)  # test_direct_cut.py compares what it keeps with Spark
    monkeypatch.setenv(direct.ENV_SWITCH, "0")
    assert direct.batch_files(table, batch, None) is None


ITEMS_DROPPED = Rel("public", "items", ITEMS.columns[:2], version=2)  # after DROP COLUMN note


def test_a_table_batch_of_several_schema_versions_or_lacking_a_written_column_is_not_direct(tmp_path):
    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {
        ITEMS: [Chg("I", 10, 0, new={"id": 1, "grp": 1, "note": "n"})],
        ITEMS_DROPPED: [Chg("I", 20, 0, new={"id": 2, "grp": 2})]}))
    (batch,) = list_batches(str(tmp_path), "slot")
    v1, v2 = (f"{batch.ref.path}/{f}" for f in batch.table_files[ITEMS.name])
    assert not direct.same_schema([v1, v2], ("id", "grp", "note"))
    assert direct.same_schema([v1], ("id", "grp", "note"))
    assert not direct.same_schema([v2], ("id", "grp", "note"))  # note is written by the batch, v2 lacks it
    assert direct.same_schema([v2], ("id", "grp"))
