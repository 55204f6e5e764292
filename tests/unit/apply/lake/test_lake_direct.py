"""The lake targets' direct path against Spark's net frame: whenever ``direct.batch_files`` hands a table-batch's files
over, ``lake/direct.net_table`` gives exactly the rows ``SparkBatchChanges.net`` collects with ``toArrow`` (plain
batches by the per-row rewrite, repeated keys and unchanged TOAST by the Arrow kernels), in the same columns."""

from __future__ import annotations

import tempfile

import pyarrow as pa
from hypothesis import HealthCheck, event, given, settings

from airflow_provider_pglogical.apply import direct
from airflow_provider_pglogical.apply.batches import read_relations
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.targets.base import PlannedTable, from_column
from airflow_provider_pglogical.apply.targets.lake import direct as lake_direct
from airflow_provider_pglogical.apply.transforms import KEEP
from tests.support.case_union import CASE, by_case, case_key, write_case, write_union
from tests.support.direct_batches import KEYS, case_lists


def _rows(rows: list[dict]) -> list[dict]:
    """Rows with the keep list sorted (a set of column names) and null as empty."""
    return [{**r, KEEP: sorted(r[KEEP] or [])} for r in rows]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case_lists(4))
def test_when_the_rule_hands_files_over_the_lake_reads_spark_s_net_rows(spark, drawn) -> None:
    """10 examples of 4 cases (table-batches under one config) each: 40 batches, as many as 40 examples of one each
    did, with one Spark query per example over the union of the cases handed over (tests/support/case_union.py)."""
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
        spark_table = SparkBatchChanges(spark, union).net(table).toArrow()
        spark_rows = by_case(_rows(spark_table.to_pylist()), KEYS[rel])
        for case, rows in handed.items():
            assert rows.column_names == [n for n in spark_table.column_names
                                         if n not in (CASE, from_column(len(KEYS[rel])))], f"case {case}"
            assert sorted((tuple(r.values()) for r in _rows(rows.to_pylist())), key=repr) == \
                spark_rows.get(case, []), f"case {case}"


def test_a_column_of_a_type_outside_the_flat_ones_leaves_the_batch_to_spark() -> None:
    assert lake_direct.flat_type(pa.decimal128(12, 2)) and lake_direct.flat_type(pa.timestamp("us", tz="UTC"))
    for dtype in (pa.list_(pa.int32()), pa.struct([("a", pa.int32())]), pa.time64("us"), pa.decimal256(50, 2),
                  pa.timestamp("ns")):
        assert not lake_direct.flat_type(dtype), dtype
