"""The direct path of a table-batch with a truncate or a snapshot cut-off against the Spark transforms: the changes
``direct.after_cut`` keeps, netted by the per-row rewrite as the targets read it (``direct.plain_net_rows``) or the
kernels (in one piece or in key partitions, ``direct.compacted_batches``), are exactly the net frame
``SparkBatchChanges.net`` builds with ``transforms.void_before`` and its sync LSN filter.

Random batches of both kinds (``tests/support/direct_batches.py``: keys mostly fresh; ``test_kernels.batches``: keys
repeat) get truncates at random positions — before every change, between two, at the very position of a change (the
tie ``void_before`` voids), inside a transaction with later changes of the table, several in one batch, after the last
change — and now and then a snapshot's sync LSN inside the batch. A cut compared with ``>=`` instead of ``>`` (or the
sync LSN with ``>``) shows as a disagreement here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply import direct, planning, snapshots
from airflow_provider_pglogical.apply.batches import Batch, list_batches, read_relations, read_truncates
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.targets.base import Cut, PlannedTable
from airflow_provider_pglogical.exceptions import ApplyError
from tests.support import direct_batches
from tests.support.case_union import rows_of
from tests.support.stage import ITEMS, BatchSpec, Chg, Col, Rel, Trunc, write_batch
from tests.unit.apply import test_kernels

START = 1  # the batch starts before every commit, so a sync LSN among them cuts it


@st.composite
def cut_batches(draw: st.DrawFn, keyless: bool = False
                ) -> tuple[Rel, tuple[str, ...], list[Chg], TableApplyConfig, list[Trunc], int | None]:
    """A table-batch, its config, its truncates and the sync LSN of the snapshot its target holds (or None);
    ``keyless``: of a table without a replica identity (``direct_batches.EVENTS``, the empty key)."""
    if keyless:
        rel, key, changes = direct_batches.EVENTS, (), draw(direct_batches.keyless_changes())
        config = draw(direct_batches.KEYLESS_CONFIGS)
    elif draw(st.booleans()):
        rel, changes, config = draw(direct_batches.batches())
        key = direct_batches.KEYS[rel]
    else:
        rel, key, changes = draw(test_kernels.batches())
        config = TableApplyConfig()
    # Orders 2*i, as the decoder numbers a transaction's events with its truncates among them: a truncate between
    # two changes of one transaction takes an odd order of its own.
    changes = [dataclasses.replace(c, tx_order=2 * c.tx_order) for c in changes]
    positions = sorted({(c.commit_lsn, c.tx_order) for c in changes}) or [(10, 0)]
    last, orders = positions[-1][0], max(o for _, o in positions)
    position = st.one_of(st.sampled_from(positions),  # a change's own position: the tie void_before voids
                         st.tuples(st.integers(9, last + 1), st.integers(0, orders + 1)))
    truncates = [Trunc(c, o, (rel.name,), cascade=draw(st.booleans()), restart_identity=draw(st.booleans()))
                 for c, o in draw(st.lists(position, min_size=draw(st.sampled_from([0, 1, 1, 1])), max_size=3))]
    sync = draw(st.one_of(st.none(), st.sampled_from([c for c, _ in positions]), st.integers(9, last + 2)))
    return rel, key, changes, config, truncates, sync


def _planned(rel: Rel, key: tuple[str, ...], config: TableApplyConfig, batch: Batch, sync: int | None
             ) -> PlannedTable:
    """The table as the runner plans it: its truncates (those after the snapshot) placed by ``plan_truncates``."""
    events = snapshots.drop_synced_truncates(read_truncates(batch), {rel.name: sync} if sync is not None else {})
    truncated_at = planning.plan_truncates(events, {rel.name: (rel.name, config)}, []).position.get(rel.name)
    relation = read_relations(batch)[rel.name]
    return PlannedTable(rel.name, rel.name, key, tuple(c.name for c in rel.columns), relation, config, truncated_at,
                        update_delete_problem=planning.update_delete_problem(relation, config, ()))


def _direct_rows(net: direct.DirectNet) -> list[tuple]:
    """The net rows the target prints: the staged files read as the target reads them, the cut applied there."""
    if net.compacted:
        batches = list(direct.compacted_batches(direct.staged_chunks(net.files, net.filesystem), net))
    else:  # the production reader of the per-row route, a row group at a time as the PostgreSQL target reads
        batches = [b for p in net.files for parquet in [pq.ParquetFile(p, filesystem=net.filesystem)]
                   for g in range(parquet.metadata.num_row_groups)
                   for b in direct.plain_net_rows(parquet, g, net.key, net.columns, net.cut)]
    rows = []
    for batch in batches:
        for r in batch.to_pylist():
            values = list(r.values())
            values[1] = [] if values[1] == "{}" else values[1]  # the per-row rewrite's keep, printed as COPY text
            rows.append(tuple(values))
    return sorted(rows, key=repr)


# Staged files of one row group, or of row groups of two changes: the direct path reads them a row group at a time.
ROW_GROUPS = st.sampled_from([None, 2])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut_batches(), st.sampled_from([None, "2"]), ROW_GROUPS)
def test_a_truncated_or_synced_table_batch_handed_over_nets_as_the_spark_transforms(spark, drawn, rows_bound,
                                                                                    row_group_size) -> None:
    _compare(spark, drawn, rows_bound, row_group_size)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut_batches(keyless=True), st.sampled_from([None, "2"]), ROW_GROUPS)
def test_a_keyless_table_batch_is_handed_over_and_appends_as_the_spark_transforms(spark, drawn, rows_bound,
                                                                                  row_group_size) -> None:
    """Every INSERT its own row (identical ones too) after the cut, through the publication's filter and actions:
    per row group, or ``appended_rows`` a row group at a time above the bound. A published UPDATE or DELETE
    committed at or after the sync LSN (a truncate spares none) stops the batch in this process with Spark's
    typed error, as the publisher refuses it; nothing leaves the table-batch to Spark."""
    _, _, changes, config, _, sync = drawn
    outcome = _compare(spark, drawn, rows_bound, row_group_size)
    counted = [c for c in changes if sync is None or c.commit_lsn >= sync]
    assert outcome == ("refused" if direct_batches.refused(counted, config) else "direct")


def _compare(spark, drawn, rows_bound: str | None, row_group_size: int | None = None) -> str:
    """How ``direct.batch_files`` took the drawn table-batch: "direct" (its rows are Spark's), "refused" (Spark's
    net frame raises the same error) or "spark" (not handed over)."""
    rel, key, changes, config, truncates, sync = drawn
    with tempfile.TemporaryDirectory() as root:
        write_batch(root, "slot", BatchSpec(START, 0x2000, {rel: changes}, truncates, row_group_size))
        (batch,) = list_batches(root, "slot")
        table = _planned(rel, key, config, batch, sync)
        spark_net = SparkBatchChanges(spark, batch, {rel.name: sync} if sync is not None else None).net
        with _rows_bound(rows_bound):
            try:
                net = direct.batch_files(table, batch, sync)
            except ApplyError as refused:
                with pytest.raises(type(refused)) as spark_refused:
                    spark_net(table)
                assert str(spark_refused.value) == str(refused)
                event("refused")
                return "refused"
            event("Spark path only" if net is None else
                  f"{'compacted' if net.compacted else 'per-row'} in {'one piece' if net.partitions <= 1 else 'parts'}")
            event("truncated" if table.truncated_at is not None else "no truncate")
            event("sync cut-off" if sync is not None else "no sync LSN")
            if net is None:
                return "spark"
            direct_rows = _direct_rows(net)
        assert direct_rows == rows_of(spark_net(table))
    return "direct"


@contextlib.contextmanager
def _rows_bound(rows_bound: str | None) -> Iterator[None]:
    """``PGLOGICAL_APPLY_INPROCESS_ROWS`` set to ``rows_bound`` meanwhile (None: as it is)."""
    saved = os.environ.get(direct.ROWS_SWITCH)
    if rows_bound is not None:  # "2": above two staged changes, netted in key partitions
        os.environ[direct.ROWS_SWITCH] = rows_bound
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(direct.ROWS_SWITCH, None)
        else:
            os.environ[direct.ROWS_SWITCH] = saved


@pytest.mark.parametrize("row_filter", [None, "src = 'x' OR grp = 2"])
def test_a_keyless_table_batch_of_two_schema_versions_appends_in_process_as_spark(spark, tmp_path, row_filter
                                                                                  ) -> None:
    """``ALTER TABLE events ADD COLUMN src text DEFAULT 'x'`` inside the batch: the INSERTs staged before it get the
    fast default, as Spark's union of the versions gives them, in one piece and a row group at a time; a row filter
    over the added column reads that default in them."""
    v2 = dataclasses.replace(direct_batches.EVENTS, version=2,
                             columns=(*direct_batches.EVENTS.columns, Col("src", pa.string(), "text", missing="{x}")))
    before = [Chg("I", 10, i, new={"at": 1, "grp": i, "note": "old"}) for i in range(3)]
    after = [Chg("I", 30, i, new={"at": 2, "grp": i, "note": None, "src": None if i else "y"}) for i in range(3)]
    write_batch(tmp_path, "slot", BatchSpec(START, 0x2000, {direct_batches.EVENTS: before, v2: after},
                                            row_group_size=2))
    (batch,) = list_batches(str(tmp_path), "slot")
    table = PlannedTable(v2.name, v2.name, (), tuple(c.name for c in v2.columns), read_relations(batch)[v2.name],
                         TableApplyConfig(row_filter=row_filter))
    spark_rows = rows_of(SparkBatchChanges(spark, batch).net(table))
    assert [r[-1] for r in spark_rows].count("x") == 3  # not vacuous: the default filled in
    assert len(spark_rows) == (4 if row_filter else 6)  # and filtered: the rows after the ADD COLUMN but grp 2
    for rows_bound in (None, "2"):
        with _rows_bound(rows_bound):
            net = direct.batch_files(table, batch, None)
            assert net is not None and net.union is not None, rows_bound
            assert _direct_rows(net) == spark_rows, rows_bound


def test_a_truncate_and_a_sync_lsn_inside_the_batch_are_a_cut_not_a_reason_for_spark(tmp_path) -> None:
    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {ITEMS: [
        Chg("I", 0x1100, 0, new={"id": 1, "grp": 1, "note": "gone"}),
        Chg("I", 0x1200, 1, new={"id": 2, "grp": 2, "note": "void with the truncate"}),
        Chg("I", 0x1200, 3, new={"id": 1, "grp": 3, "note": "kept"})]}, [Trunc(0x1200, 2, (ITEMS.name,))]))
    (batch,) = list_batches(str(tmp_path), "slot")
    table = _planned(ITEMS, ("id",), TableApplyConfig(), batch, None)
    assert table.truncated_at == (0x1200, 2)
    net = direct.batch_files(table, batch, 0x1180)
    assert net is not None and net.cut == Cut((0x1200, 2), 0x1180)
    assert [r[-2:] for r in _direct_rows(net)] == [(3, "kept")]
    assert direct.batch_files(table, batch, 0x1000).cut == Cut((0x1200, 2), None)  # type: ignore[union-attr]
