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
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply import planning
from airflow_provider_pglogical.apply.batches import list_batches, read_changes, read_relations
from airflow_provider_pglogical.apply.changes import SparkBatchChanges, net_changes, ordered_changes, published_changes
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.targets.base import PlannedTable
from airflow_provider_pglogical.apply.transforms import KEEP
from tests.support.stage import BatchSpec, Chg, write_batch
from tests.unit.apply.conftest import ITEMS_FULL

COLUMNS = ("id", "grp", "note")
FILTERS = (None, "grp % 2 = 0", "note = 'a' OR grp > 2", "id < 3")


def _row(draw: Any, key: int) -> dict[str, Any]:
    return {"id": key, "grp": draw(st.one_of(st.none(), st.integers(0, 5))),
            "note": draw(st.one_of(st.none(), st.sampled_from(["a", "b", ""])))}


@st.composite
def batches(draw: Any) -> tuple[list[Chg], TableApplyConfig]:
    """Changes of a FULL-identity table over few keys (so they repeat), each UPDATE/DELETE with its full old row."""
    rows: dict[int, dict[str, Any]] = {}
    changes = []
    for i in range(draw(st.integers(0, 14))):
        commit, order = 10 + i // 3, i % 3
        key = draw(st.integers(0, 5))
        op = draw(st.sampled_from(["I", "U", "U", "D"])) if key in rows else "I"
        if op == "I":
            rows[key] = _row(draw, key)
            changes.append(Chg("I", commit, order, new=dict(rows[key])))
        elif op == "U":
            new_key = draw(st.sampled_from([key, key, draw(st.integers(0, 5))]))
            old, new = rows.pop(key), _row(draw, new_key)
            toast = ("note",) if draw(st.integers(0, 6)) == 0 else ()
            changes.append(Chg("U", commit, order, old=dict(old), new={k: v for k, v in new.items() if k not in toast},
                               toast=toast))
            rows[new_key] = {**new, **({"note": old["note"]} if toast else {})}
        else:
            changes.append(Chg("D", commit, order, old=dict(rows.pop(key))))
    config = TableApplyConfig(row_filter=draw(st.sampled_from(FILTERS)),
                              columns=draw(st.sampled_from([None, ("id", "grp")])))
    return changes, config


def _rows(frame: Any) -> list[tuple]:
    return sorted((tuple(r) for r in frame.collect()), key=repr)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_the_planned_transforms_give_the_reference_pipelines_rows(spark, drawn) -> None:
    changes, config = drawn
    with tempfile.TemporaryDirectory() as root:
        write_batch(root, "slot", BatchSpec(0x1000, 0x2000, {ITEMS_FULL: changes}))
        (batch,) = list_batches(root, "slot")
        rel = read_relations(batch)[ITEMS_FULL.name]
        columns = config.columns or COLUMNS
        table = PlannedTable(ITEMS_FULL.name, ITEMS_FULL.name, ("id",), columns, rel, config)
        shape = planning.TableShape(table.source, table.target, table.key, table.columns)
        staged = read_changes(spark, batch, table.source)
        event(f"toast={any(c.toast for c in changes)} filter={config.row_filter is not None}")
        reference = net_changes(staged, rel, config, shape, None, toast=True)
        planned = SparkBatchChanges(spark, batch)
        names = [KEEP, "_pgl_kind", "_pgl_lsn", "_pgl_touched", *columns]
        assert _rows(planned.net(table).select(*names)) == _rows(reference.select(*names))
        reference_ordered = ordered_changes(staged, rel, config, shape, None, toast=True)
        ordered_names = [KEEP, "_pgl_kind", "_pgl_lsn", *columns]
        assert _rows(planned.ordered(table).select(*ordered_names)) == _rows(reference_ordered.select(*ordered_names))


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
    assert _rows(frame) == _rows(reference)
