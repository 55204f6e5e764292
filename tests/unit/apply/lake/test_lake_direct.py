"""The lake targets' direct path against Spark's net frame: whenever ``direct.batch_files`` hands a table-batch's files
over, ``lake/direct.net_table`` gives exactly the rows ``SparkBatchChanges.net`` collects with ``toArrow`` (plain
batches by the per-row rewrite, repeated keys and unchanged TOAST by the Arrow kernels), in the same columns."""

from __future__ import annotations

import os
import tempfile
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply import direct, planning
from airflow_provider_pglogical.apply.batches import list_batches, read_relations
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.targets.base import PlannedTable, from_column
from airflow_provider_pglogical.apply.targets.lake import direct as lake_direct
from airflow_provider_pglogical.apply.transforms import KEEP
from airflow_provider_pglogical.exceptions import ReplicaIdentityError
from tests.support.case_union import CASE, by_case, case_key, union_branches, write_case, write_union
from tests.support.direct_batches import EVENTS, KEYLESS_CONFIGS, KEYS, case_lists, keyless_changes, refused
from tests.support.stage import ITEMS, BatchSpec, Chg, Trunc, write_batch


def _rows(rows: list[dict]) -> list[dict]:
    """Rows with the keep list sorted (a set of column names) and null as empty."""
    return [{**r, KEEP: sorted(r[KEEP] or [])} for r in rows]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case_lists(4))
def test_when_the_rule_hands_files_over_the_lake_reads_spark_s_net_rows(spark, drawn) -> None:
    """20 examples of 4 cases (table-batches under one config) each: 80 batches, with one Spark query per example
    over the union of the cases handed over (tests/support/case_union.py). The trade-off: 20 config draws per run
    where 40 examples of one case each drew 40; ``CONFIGS`` holds three distinct configs, the rarest drawn with
    probability 1/5, so 20 draws miss it in about 1% of runs (40: 0.01%); 40 examples of 4 cost about as much
    again as the 40 single cases (measured side by side: 31 s for 40 single cases, 15 s for 10 examples of 4)."""
    rel, cases, config = drawn
    columns = tuple(c.name for c in rel.columns)
    with tempfile.TemporaryDirectory() as root:
        handed: dict[int, pa.Table] = {}
        for case, changes in enumerate(cases):
            batch = write_case(root, rel, changes, case)
            table = PlannedTable(rel.name, rel.name, KEYS[rel], columns, read_relations(batch)[rel.name], config)
            net = direct.batch_files(table, batch, None)
            rows = lake_direct.net_table(net) if net is not None else None
            event("compacted in process" if rows is not None and net is not None and net.compacted else
                  "direct" if rows is not None else "Spark path only")
            if rows is not None:
                handed[case] = rows
        if not handed:
            return
        union = write_union(root, rel, {case: cases[case] for case in handed})
        table = PlannedTable(rel.name, rel.name, case_key(KEYS[rel]), (*columns, CASE),
                             read_relations(union)[rel.name], config)
        event(union_branches(union, table))
        spark_table = SparkBatchChanges(spark, union).net(table).toArrow()
        spark_rows = by_case(_rows(spark_table.to_pylist()), KEYS[rel])
        assert set(spark_rows) <= set(handed), "Spark rows outside the compared cases"
        for case, rows in handed.items():
            assert rows.column_names == [n for n in spark_table.column_names
                                         if n not in (CASE, from_column(len(KEYS[rel])))], f"case {case}"
            assert sorted((tuple(r.values()) for r in _rows(rows.to_pylist())), key=repr) == \
                spark_rows.get(case, []), f"case {case}"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(keyless_changes(), min_size=4, max_size=4), KEYLESS_CONFIGS, st.sampled_from([None, "2"]))
def test_a_keyless_table_batch_reaches_the_lake_as_spark_s_appends_without_spark(spark, cases, config,
                                                                                 rows_bound) -> None:
    """Keyless table-batches (identical INSERTs, a row filter or actions left out) read from their staged files as
    the lake receives them, in one piece or (``rows_bound`` "2") above the in-process bounds: Spark's appended rows
    in the net frame's columns, one Spark query over the cases' union (the case number a written column of its own:
    nothing is grouped by it). A published UPDATE or DELETE is refused in this process."""
    columns = tuple(c.name for c in EVENTS.columns)
    with tempfile.TemporaryDirectory() as root, mock.patch.dict(os.environ, {direct.ROWS_SWITCH: rows_bound or ""}):
        handed: dict[int, pa.Table] = {}
        for case, changes in enumerate(cases):
            batch = write_case(root, EVENTS, changes, case)
            table = PlannedTable(EVENTS.name, EVENTS.name, (), columns, read_relations(batch)[EVENTS.name], config,
                                 update_delete_problem=planning.update_delete_problem(
                                     read_relations(batch)[EVENTS.name], config, ()))
            if refused(changes, config):
                with pytest.raises(ReplicaIdentityError):
                    direct.batch_files(table, batch, None)
                continue
            net = direct.batch_files(table, batch, None)
            rows = lake_direct.net_table(net) if net is not None else None
            assert rows is not None, f"case {case}"
            handed[case] = rows
        if not handed:
            return
        union = write_union(root, EVENTS, {case: cases[case] for case in handed})
        table = PlannedTable(EVENTS.name, EVENTS.name, (), (*columns, CASE), read_relations(union)[EVENTS.name],
                             config)
        spark_table = SparkBatchChanges(spark, union).net(table).toArrow()
        spark_rows = by_case(_rows(spark_table.to_pylist()))
        assert set(spark_rows) <= set(handed), "Spark rows outside the compared cases"
        for case, rows in handed.items():
            assert rows.column_names == [n for n in spark_table.column_names if n != CASE], f"case {case}"
            assert sorted((tuple(r.values()) for r in _rows(rows.to_pylist())), key=repr) == \
                spark_rows.get(case, []), f"case {case}"


def test_a_column_of_a_type_outside_the_flat_ones_leaves_the_batch_to_spark() -> None:
    assert lake_direct.flat_type(pa.decimal128(12, 2)) and lake_direct.flat_type(pa.timestamp("us", tz="UTC"))
    for dtype in (pa.list_(pa.int32()), pa.struct([("a", pa.int32())]), pa.time64("us"), pa.decimal256(50, 2),
                  pa.timestamp("ns")):
        assert not lake_direct.flat_type(dtype), dtype


def test_a_table_batch_whose_every_change_precedes_its_truncate_is_an_empty_typed_frame_without_spark(tmp_path) -> None:
    # INSERTs, then a TRUNCATE of the table: no change counts. The per-row route gives the net frame's columns and
    # types with no row, so the lake applies the truncate from it (``apply_mirror``) instead of asking Spark.
    inserts = [Chg("I", 0x1100, 0, new={"id": 1, "grp": 1, "note": "a"}),
               Chg("I", 0x1200, 0, new={"id": 2, "grp": 2, "note": "b"})]
    truncate = Trunc(0x1200, 2, (ITEMS.name,))
    write_batch(tmp_path / "cut", "slot", BatchSpec(0x1000, 0x2000, {ITEMS: inserts}, [truncate]))
    write_batch(tmp_path / "kept", "slot", BatchSpec(0x1000, 0x2000, {ITEMS: inserts}))
    frames = []
    for name, truncated_at in (("cut", (0x1200, 2)), ("kept", None)):
        (batch,) = list_batches(str(tmp_path / name), "slot")
        table = PlannedTable(ITEMS.name, ITEMS.name, ("id",), ("id", "grp", "note"), read_relations(batch)[ITEMS.name],
                             TableApplyConfig(), truncated_at)
        net = direct.batch_files(table, batch, None)
        assert net is not None and not net.compacted
        frames.append(lake_direct.net_table(net))
    cut, kept = frames
    assert cut is not None and kept is not None
    assert cut.num_rows == 0 and kept.num_rows == 2
    assert cut.schema == kept.schema
