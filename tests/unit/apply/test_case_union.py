"""The case union of the Spark-comparing property tests (tests/support/case_union.py) keeps its cases apart.

Cases drawn independently reuse the same key values; staged as one batch with the case number in the key, each
case's net rows out of Spark are the rows its own batch nets to in process. Netted by the key alone, the same
union mixes the cases (what a union that let cases leak into each other would compare), and the per-case
comparison sees it.
"""

from __future__ import annotations

from airflow_provider_pglogical.apply import kernels
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from tests.support.case_union import by_case, case_key, with_case, write_case, write_union
from tests.support.stage import Chg
from tests.unit.apply.conftest import ITEMS
from tests.unit.apply.test_kernels import _planned, _rows, _staged

# Every case names id 1; case 2 moves it to id 2, which case 0 inserts too.
CASES = {
    0: [Chg("I", 10, 0, new={"id": 1, "grp": 1, "note": "a"}), Chg("I", 10, 1, new={"id": 2, "grp": 5, "note": "z"})],
    1: [Chg("U", 10, 0, new={"id": 1, "grp": 2}, toast=("note",)), Chg("D", 11, 0, old={"id": 1}, old_key_only=True)],
    2: [Chg("U", 10, 0, old={"id": 1}, old_key_only=True, new={"id": 2, "grp": 3, "note": "b"})],
}


def test_cases_sharing_key_values_net_apart_in_the_union_and_apart_only_by_the_case_key(spark, tmp_path) -> None:
    expected = {}
    for case, changes in CASES.items():
        batch = write_case(tmp_path, ITEMS, changes, case)
        table = _planned(ITEMS, ("id",), batch)
        net = kernels.compact_changes(_staged(batch, ITEMS), ("id",), table.columns, table.relation.identity_columns)
        expected[case] = _rows(net.table(("id",), table.columns))
    union = write_union(tmp_path, ITEMS, CASES)
    apart = SparkBatchChanges(spark, union).net(_planned(with_case(ITEMS), case_key(("id",)), union))
    assert by_case((r.asDict() for r in apart.collect()), ("id",)) == expected
    leaking = SparkBatchChanges(spark, union).net(_planned(with_case(ITEMS), ("id",), union))
    mixed = by_case(r.asDict() for r in leaking.collect())  # two ids for three cases: a case loses or gains rows
    assert any(mixed.get(case) != rows for case, rows in expected.items())
