"""Pure steps: TOAST refill, column lists, key events, truncate positions, compaction."""

from __future__ import annotations

from airflow_provider_pglogical.apply.batches import list_batches, read_changes
from airflow_provider_pglogical.apply.transforms import (
    compact,
    project_columns,
    resolve_toast_from_old,
    to_key_events,
    to_ordered_changes,
    void_before,
)
from tests.support.stage import BatchSpec, Chg, Rel, write_batch
from tests.unit.apply.conftest import ITEMS, ITEMS_FULL, PAIRS

COLS = ("id", "grp", "note")


def net(frame, key=("id",), columns=COLS, identity=("id",), truncated_at=None):
    all_columns = frame.schema["_pgl_new"].dataType.fieldNames()
    df = (frame.transform(resolve_toast_from_old(all_columns, identity))
          .transform(project_columns(columns)).transform(to_key_events(key, columns))
          .transform(void_before(truncated_at)).transform(compact(key, columns)))
    return sorted((tuple(r[k] for k in key), r["_pgl_kind"], *(r[c] for c in columns if c not in key),
                   tuple(r["_pgl_keep"])) for r in df.collect())


def test_insert_then_updates_compact_to_one_insert_with_the_last_values(changes_frame):
    frame = changes_frame(ITEMS, [
        Chg("I", 10, 0, new={"id": 1, "grp": 1, "note": "a"}),
        Chg("U", 10, 1, new={"id": 1, "grp": 2, "note": "a"}),
        Chg("U", 20, 0, new={"id": 1, "grp": 3, "note": None}, toast=("note",)),
    ])
    assert net(frame) == [((1,), "I", 3, "a", ())]


def test_update_then_delete_compacts_to_a_delete(changes_frame):
    frame = changes_frame(ITEMS, [Chg("U", 10, 0, new={"id": 1, "grp": 2}),
                                  Chg("D", 11, 0, old={"id": 1}, old_key_only=True)])
    assert net(frame) == [((1,), "D", None, None, ())]


def test_delete_then_insert_compacts_to_a_replace(changes_frame):
    frame = changes_frame(ITEMS, [Chg("D", 10, 0, old={"id": 1}, old_key_only=True),
                                  Chg("I", 10, 1, new={"id": 1, "grp": 9, "note": "n"})])
    assert net(frame) == [((1,), "R", 9, "n", ())]


def test_unchanged_toast_without_history_is_kept_from_the_target(changes_frame):
    frame = changes_frame(ITEMS, [Chg("U", 10, 0, new={"id": 1, "grp": 2}, toast=("note",))])
    assert net(frame) == [((1,), "U", 2, None, ("note",))]


def test_unchanged_toast_is_refilled_from_a_full_old_image(changes_frame):
    frame = changes_frame(ITEMS_FULL, [
        Chg("U", 10, 0, old={"id": 1, "grp": 1, "note": "big"}, new={"id": 1, "grp": 2}, toast=("note",))])
    assert net(frame, identity=COLS) == [((1,), "U", 2, "big", ())]


def test_a_key_change_deletes_the_old_key_and_inserts_the_new_one(changes_frame):
    frame = changes_frame(ITEMS, [
        Chg("U", 10, 0, old={"id": 1}, old_key_only=True, new={"id": 2, "grp": 5, "note": "x"})])
    assert net(frame) == [((1,), "D", None, None, ()), ((2,), "I", 5, "x", ())]


def test_a_key_swap_back_within_the_batch_ends_as_a_replace(changes_frame):
    frame = changes_frame(ITEMS, [
        Chg("U", 10, 0, old={"id": 1}, old_key_only=True, new={"id": 2, "grp": 5, "note": "x"}),
        Chg("U", 10, 1, old={"id": 2}, old_key_only=True, new={"id": 1, "grp": 6, "note": "y"}),
    ])
    assert net(frame) == [((1,), "R", 6, "y", ()), ((2,), "D", None, None, ())]


def test_composite_keys_compact_per_key_tuple(changes_frame):
    frame = changes_frame(PAIRS, [
        Chg("I", 10, 0, new={"a": 1, "b": "x", "v": 1}),
        Chg("I", 10, 1, new={"a": 1, "b": "y", "v": 2}),
        Chg("U", 10, 2, new={"a": 1, "b": "x", "v": 3}),
    ])
    got = net(frame, key=("a", "b"), columns=("a", "b", "v"), identity=("a", "b"))
    assert got == [((1, "x"), "I", 3, ()), ((1, "y"), "I", 2, ())]


def test_changes_at_or_before_a_truncate_position_are_void(changes_frame):
    frame = changes_frame(ITEMS, [
        Chg("I", 10, 0, new={"id": 1, "grp": 1}),
        Chg("I", 20, 0, new={"id": 2, "grp": 1}),
        Chg("U", 20, 2, new={"id": 1, "grp": 7}),
    ])
    assert net(frame, truncated_at=(20, 1)) == [((1,), "U", 7, None, ())]


def test_a_column_list_limits_the_written_columns(changes_frame):
    frame = changes_frame(ITEMS, [Chg("I", 10, 0, new={"id": 1, "grp": 1, "note": "n"})])
    assert net(frame, columns=("id", "note")) == [((1,), "I", "n", ())]


def test_an_empty_batch_compacts_to_nothing(changes_frame):
    assert net(changes_frame(ITEMS, [])) == []


def test_a_row_moved_by_a_key_change_remembers_its_old_key_for_unchanged_toast(changes_frame):
    frame = changes_frame(ITEMS, [
        Chg("U", 10, 0, old={"id": 1}, old_key_only=True, new={"id": 2, "grp": 5}, toast=("note",))])
    df = frame.transform(resolve_toast_from_old(list(COLS), ("id",))).transform(to_key_events(("id",), COLS)) \
        .transform(compact(("id",), COLS))
    got = {r["id"]: (r["_pgl_kind"], r["_pgl_from"], list(r["_pgl_keep"])) for r in df.collect()}
    assert got[2][0] == "I" and got[2][1]["id"] == 1 and got[2][2] == ["note"]
    assert got[1] == ("D", None, [])


def touched(frame):
    df = frame.transform(resolve_toast_from_old(list(COLS), ("id",))).transform(to_key_events(("id",), COLS)) \
        .transform(compact(("id",), COLS))
    return {r["id"]: r["_pgl_touched"] for r in df.collect()}


def test_a_key_changed_in_the_batch_before_its_row_moved_away_is_touched(changes_frame):
    frame = changes_frame(ITEMS, [
        Chg("U", 10, 0, new={"id": 1, "grp": 2}, toast=("note",)),  # 1 changes, then moves to 2
        Chg("U", 11, 0, old={"id": 1}, old_key_only=True, new={"id": 2, "grp": 2}, toast=("note",)),
        Chg("U", 12, 0, old={"id": 5}, old_key_only=True, new={"id": 6, "grp": 2}, toast=("note",)),  # first event
        Chg("U", 13, 0, old={"id": 6}, old_key_only=True, new={"id": 7, "grp": 2}, toast=("note",)),  # moved in, out
        Chg("U", 14, 0, new={"id": 9, "grp": 1}),  # changed, never moved
    ])
    assert touched(frame) == {1: True, 2: False, 5: False, 6: True, 7: False, 9: False}


def test_ordered_changes_keep_every_change_and_a_key_change_as_one_update(changes_frame):
    frame = changes_frame(ITEMS, [
        Chg("I", 10, 0, new={"id": 1, "grp": 1, "note": "a"}),
        Chg("U", 10, 1, old={"id": 1}, old_key_only=True, new={"id": 2, "grp": 1}, toast=("note",)),
        Chg("U", 20, 0, new={"id": 2, "grp": 3}, toast=("note",)),
        Chg("D", 30, 0, old={"id": 2}, old_key_only=True),
        Chg("I", 40, 0, new={"id": 2, "grp": 4, "note": "b"}),
    ])
    df = (frame.transform(resolve_toast_from_old(list(COLS), ("id",))).transform(to_ordered_changes(("id",), COLS))
          .transform(void_before((10, 0))))
    got = sorted((r["_pgl_seq"]["c"], r["_pgl_seq"]["o"], r["_pgl_kind"], r["_pgl_from"] and r["_pgl_from"]["id"],
                  r["id"], r["grp"], r["note"], tuple(r["_pgl_keep"])) for r in df.collect())
    assert got == [(10, 1, "U", 1, 2, 1, None, ("note",)), (20, 0, "U", 2, 2, 3, None, ("note",)),
                   (30, 0, "D", 2, None, None, None, ()), (40, 0, "I", None, 2, 4, "b", ())]


# ``items`` after ALTER TABLE items DROP COLUMN note: its second schema version.
ITEMS_DROPPED = Rel("public", "items", ITEMS.columns[:2], version=2)


def test_each_change_writes_its_own_schema_versions_columns(spark, tmp_path):
    """A value written before DROP COLUMN is kept; an UPDATE after the drop leaves the column to the target, an
    INSERT after it leaves it NULL (a native subscriber whose table keeps the column does the same)."""
    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {
        ITEMS: [Chg("U", 10, 0, new={"id": 1, "grp": 1, "note": "before the drop"})],
        ITEMS_DROPPED: [Chg("U", 20, 0, new={"id": 1, "grp": 2}), Chg("U", 20, 1, new={"id": 2, "grp": 2}),
                        Chg("I", 20, 2, new={"id": 3, "grp": 3}),
                        Chg("U", 20, 3, old={"id": 4}, old_key_only=True, new={"id": 5, "grp": 5})],
    }))
    (batch,) = list_batches(str(tmp_path), "slot")
    frame = read_changes(spark, batch, ITEMS.name)
    assert net(frame) == [((1,), "U", 2, "before the drop", ()), ((2,), "U", 2, None, ("note",)),
                          ((3,), "I", 3, None, ()), ((4,), "D", None, None, ()), ((5,), "I", 5, None, ("note",))]
    ordered = frame.transform(to_ordered_changes(("id",), COLS))
    rows = sorted(ordered.collect(), key=lambda r: (r["_pgl_seq"]["c"], r["_pgl_seq"]["o"]))
    assert [(r["id"], r["_pgl_kind"], r["note"], tuple(r["_pgl_keep"])) for r in rows] == [
        (1, "U", "before the drop", ()), (1, "U", None, ("note",)), (2, "U", None, ("note",)), (3, "I", None, ()),
        (5, "U", None, ("note",))]
