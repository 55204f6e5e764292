"""The planned transforms of a table-batch against the reference pipeline, on random batches (hypothesis).

``SparkBatchChanges`` leaves steps out of the Spark plan that cannot change its rows — the TOAST refill when no
staged change lists an unchanged-TOAST column, a column list naming every column in order — and skips
compaction's shuffle where keys never repeat. The reference is the whole pipeline with every step
(``net_changes`` / ``ordered_changes`` with ``toast=True`` and ``compact``). Random batches of a REPLICA
IDENTITY FULL table (full old images) with row filters every UPDATE may cross, repeated keys, key changes
and now and then an unchanged-TOAST value must give the same net and ordered rows both ways.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from functools import reduce
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply import planning
from airflow_provider_pglogical.apply.batches import keys_never_repeat, list_batches, read_changes, read_relations
from airflow_provider_pglogical.apply.changes import SparkBatchChanges, net_changes, ordered_changes, published_changes
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.targets.base import PlannedTable, from_column
from airflow_provider_pglogical.apply.transforms import FROM, KEEP
from tests.support.case_union import CASE, by_case, case_key, rows_of, write_union
from tests.support.stage import BatchSpec, Chg, write_batch
from tests.unit.apply.conftest import ITEMS_FULL

COLUMNS = ("id", "grp", "note")
FILTERS = (None, "grp % 2 = 0", "note = 'a' OR grp > 2", "id < 3")


def _row(draw: Any, key: int) -> dict[str, Any]:
    return {"id": key, "grp": draw(st.one_of(st.none(), st.integers(0, 5))),
            "note": draw(st.one_of(st.none(), st.sampled_from(["a", "b", ""])))}


@st.composite
def changes_of(draw: Any, toast_ok: bool, repeat: bool = True) -> list[Chg]:
    """Changes of a FULL-identity table, each UPDATE/DELETE with its full old row; with ``repeat`` over few keys
    (so they repeat), without over keys no other change names (UPDATEs and DELETEs of rows from before the
    batch); when ``toast_ok``, about one UPDATE in three leaves note unchanged-TOAST."""
    rows: dict[int, dict[str, Any]] = {}
    fresh = iter(range(10, 1000))
    changes = []
    for i in range(draw(st.integers(0, 14))):
        commit, order = 10 + i // 3, i % 3
        key = draw(st.integers(0, 5)) if repeat else next(fresh)
        if not repeat and draw(st.booleans()):
            rows[key] = _row(draw, key)  # a row from before the batch
        op = draw(st.sampled_from(["I", "U", "U", "D"])) if key in rows else "I"
        if op == "I":
            rows[key] = _row(draw, key)
            changes.append(Chg("I", commit, order, new=dict(rows[key])))
        elif op == "U":
            new_key = (draw(st.sampled_from([key, key, draw(st.integers(0, 5))])) if repeat
                       else draw(st.sampled_from([key, next(fresh)])))
            old, new = rows.pop(key), _row(draw, new_key)
            toast = ("note",) if toast_ok and draw(st.integers(0, 2)) == 0 else ()
            changes.append(Chg("U", commit, order, old=dict(old), new={k: v for k, v in new.items() if k not in toast},
                               toast=toast))
            rows[new_key] = {**new, **({"note": old["note"]} if toast else {})}
        else:
            changes.append(Chg("D", commit, order, old=dict(rows.pop(key))))
    return changes


# Cases per example, staged as one batch (tests/support/case_union.py).
CASES_PER_EXAMPLE = 4


@st.composite
def case_lists(draw: Any) -> tuple[list[list[Chg]], TableApplyConfig]:
    """CASES_PER_EXAMPLE table-batches under one config. Whether any may hold an unchanged-TOAST value is drawn per
    example, so the plan without the TOAST refill (no change of the union lists one) stays as often exercised; whether
    any may repeat a key likewise, for the plan without compaction (no key of the union repeats)."""
    toast_ok, repeat = draw(st.booleans()), draw(st.booleans())
    cases = draw(st.lists(changes_of(toast_ok, repeat), min_size=CASES_PER_EXAMPLE, max_size=CASES_PER_EXAMPLE))
    config = TableApplyConfig(row_filter=draw(st.sampled_from(FILTERS)),
                              columns=draw(st.sampled_from([None, ("id", "grp")])))
    return cases, config


def _same_per_case(*pairs: tuple[Any, Any]) -> None:
    """Each pair's two frames' rows per case, from one query over the union of every frame (a column tells them
    apart; a column one pair has and another lacks is NULL in both frames of the pair that lacks it)."""
    sides = [frame.withColumn("_side", F.lit(side)) for side, frame in enumerate(f for pair in pairs for f in pair)]
    rows = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), sides).collect()
    per_side = [by_case({k: v for k, v in r.asDict().items() if k != "_side"} for r in rows if r["_side"] == side)
                for side in range(len(sides))]
    for pair in range(len(pairs)):
        mine, theirs = per_side[2 * pair], per_side[2 * pair + 1]
        for case in sorted(mine.keys() | theirs.keys()):
            assert mine.get(case) == theirs.get(case), f"pair {pair}, case {case}"


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case_lists())
def test_the_planned_transforms_give_the_reference_pipelines_rows(spark, drawn) -> None:
    """20 examples (configs drawn) of 4 cases each, staged as one batch keyed by (id, case): 80 table-batches
    compared where 20 examples of one each compared 20, with one Spark query per example (net rows and ordered rows,
    each over the planned and the reference frame, all four together) where there were four."""
    cases, config = drawn
    with tempfile.TemporaryDirectory() as root:
        batch = write_union(root, ITEMS_FULL, dict(enumerate(cases)))
        rel = read_relations(batch)[ITEMS_FULL.name]
        columns = (*(config.columns or COLUMNS), CASE)
        config = replace(config, columns=config.columns and columns)
        table = PlannedTable(ITEMS_FULL.name, ITEMS_FULL.name, case_key(("id",)), columns, rel, config)
        shape = planning.TableShape(table.source, table.target, table.key, table.columns)
        staged = read_changes(spark, batch, table.source)
        event(f"toast={any(c.toast for cs in cases for c in cs)} filter={config.row_filter is not None} "
              f"keys repeat={not keys_never_repeat(batch, table.source, table.key, full_identity=True)}")
        reference = net_changes(staged, rel, config, shape, None, toast=True)
        planned = SparkBatchChanges(spark, batch)
        names = [KEEP, "_pgl_kind", "_pgl_lsn", "_pgl_touched", *columns]
        reference_ordered = ordered_changes(staged, rel, config, shape, None, toast=True)
        ordered_names = [KEEP, "_pgl_kind", "_pgl_lsn", *columns[:-1]]
        # A DELETE's row has no new image: its case is its old key's (the key a change is matched by).
        _same_per_case(
            (planned.net(table).select(*names), reference.select(*names)),
            (planned.ordered(table).select(*ordered_names, F.coalesce(CASE, from_column(1)).alias(CASE)),
             reference_ordered.select(*ordered_names, F.coalesce(F.col(CASE), F.col(FROM).getField(CASE)).alias(CASE))))


def test_without_unchanged_toast_and_with_every_column_the_images_are_not_rebuilt(spark, tmp_path) -> None:
    """The plan of a table-batch with no unchanged-TOAST value and no narrowing column list reads the images as
    staged: no TOAST refill (``array_contains`` over the list) and no column projection (struct rebuilt)."""
    changes = [Chg("I", 10, 0, new={"id": 1, "grp": 2, "note": "a"}),
               Chg("U", 11, 0, old={"id": 1, "grp": 2, "note": "a"}, new={"id": 1, "grp": 3, "note": "a"})]
    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {ITEMS_FULL: changes}))
    (batch,) = list_batches(str(tmp_path), "slot")
    rel = read_relations(batch)[ITEMS_FULL.name]
    config = TableApplyConfig(row_filter="grp % 2 = 0")
    table = PlannedTable(ITEMS_FULL.name, ITEMS_FULL.name, ("id",), COLUMNS, rel, config)
    shape = planning.TableShape(table.source, table.target, table.key, table.columns)
    frame = SparkBatchChanges(spark, batch).published(table)
    plan = frame._jdf.queryExecution().optimizedPlan().toString()
    assert "array_contains" not in plan and "struct(" not in plan
    reference = published_changes(read_changes(spark, batch, table.source), rel, config, shape)
    assert "array_contains" in reference._jdf.queryExecution().optimizedPlan().toString()
    assert rows_of(frame) == rows_of(reference)
