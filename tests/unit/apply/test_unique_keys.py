"""A batch whose keys never repeat skips compaction's shuffle: the driver-side check and the shuffle-free step.

``single_event_net`` must give exactly ``compact``'s rows (every output column) whenever
``keys_never_repeat`` says yes, and the check must say no whenever a key could be netted.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_pglogical.apply.batches import keys_never_repeat, list_batches, read_changes
from airflow_provider_pglogical.apply.transforms import (
    compact,
    project_columns,
    resolve_toast_from_old,
    single_event_net,
    to_key_events,
)
from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch
from tests.unit.apply.conftest import ITEMS, ITEMS_FULL, PAIRS


@pytest.fixture
def staged(spark, tmp_path):
    counter = iter(range(1000))

    def build(rel, changes):
        root = tmp_path / f"s{next(counter)}"
        write_batch(root, "slot", BatchSpec(0x1000, 0x2000, {rel: changes}))
        (batch,) = list_batches(str(root), "slot")
        return batch, read_changes(spark, batch, rel.name)

    return build


def rows(frame, rel, key, step):
    columns = tuple(c.name for c in rel.columns)
    identity = tuple(c.name for c in rel.columns if c.identity) if rel.replica_identity != "f" else columns
    df = (frame.transform(resolve_toast_from_old(columns, identity)).transform(project_columns(columns))
          .transform(to_key_events(key, columns)).transform(step(key, columns)))
    return sorted((tuple(r.asDict(recursive=True).items()) for r in df.collect()), key=repr)


UNIQUE = [
    pytest.param(ITEMS, ("id",), [
        Chg("I", 10, 0, new={"id": 1, "grp": 1, "note": "a"}),
        Chg("U", 10, 1, new={"id": 2, "grp": 2}, toast=("note",)),
        Chg("D", 20, 0, old={"id": 3}, old_key_only=True),
        Chg("U", 20, 1, old={"id": 4}, old_key_only=True, new={"id": 5, "grp": 5}, toast=("note",)),
        Chg("U", 30, 0, old={"id": 6}, old_key_only=True, new={"id": 7, "grp": 7, "note": "m"}),
    ], id="insert-update-delete-key-changes"),
    pytest.param(ITEMS_FULL, ("id",), [
        Chg("U", 10, 0, old={"id": 1, "grp": 1, "note": "big"}, new={"id": 1, "grp": 2}, toast=("note",)),
        Chg("D", 10, 1, old={"id": 2, "grp": 1, "note": "x"}),
        Chg("U", 11, 0, old={"id": 3, "grp": 1, "note": "y"}, new={"id": 4, "grp": 1, "note": "y"}),
    ], id="replica-identity-full"),
    pytest.param(PAIRS, ("a", "b"), [
        Chg("I", 10, 0, new={"a": 1, "b": "x", "v": 1}), Chg("I", 10, 1, new={"a": 1, "b": "y", "v": 2}),
        Chg("D", 11, 0, old={"a": 2, "b": "x"}, old_key_only=True),
    ], id="composite-key"),
]


@pytest.mark.parametrize(("rel", "key", "changes"), UNIQUE)
def test_without_repeated_keys_the_shuffle_free_step_gives_compactions_rows(staged, rel, key, changes):
    batch, frame = staged(rel, changes)
    assert keys_never_repeat(batch, rel.name, key, full_identity=rel.replica_identity == "f")
    assert rows(frame, rel, key, single_event_net) == rows(frame, rel, key, compact)


FLOATS = Rel("public", "floats", (Col("k", pa.float64(), "double precision", True), Col("v", pa.int64(), "bigint")))
REPEATED = [
    pytest.param(ITEMS, ("id",), [Chg("I", 10, 0, new={"id": 1, "grp": 1, "note": "a"}),
                                  Chg("U", 11, 0, new={"id": 1, "grp": 2, "note": "a"})], id="insert-then-update"),
    pytest.param(ITEMS, ("id",), [Chg("D", 10, 0, old={"id": 1}, old_key_only=True),
                                  Chg("I", 10, 1, new={"id": 1, "grp": 9, "note": "n"})], id="delete-then-insert"),
    pytest.param(ITEMS, ("id",), [Chg("U", 10, 0, old={"id": 1}, old_key_only=True, new={"id": 2, "grp": 5}),
                                  Chg("I", 11, 0, new={"id": 1, "grp": 6, "note": "y"})], id="key-freed-and-reused"),
    pytest.param(ITEMS, ("id",), [Chg("U", 10, 0, old={"id": 1}, old_key_only=True, new={"id": 2, "grp": 5}),
                                  Chg("U", 10, 1, old={"id": 2}, old_key_only=True, new={"id": 1, "grp": 6})],
                 id="key-swap"),
    pytest.param(PAIRS, ("a", "b"), [Chg("I", 10, 0, new={"a": 1, "b": "x", "v": 1}),
                                     Chg("D", 11, 0, old={"a": 1, "b": "x"}, old_key_only=True)],
                 id="composite-key-repeated"),
    pytest.param(ITEMS, ("id",), [Chg("U", 10, 0, new={"id": None, "grp": 2}, toast=("id",))],
                 id="null-key-field-is-not-reasoned-about"),
    # PostgreSQL's float8 = holds for -0.0 and 0.0 (and for NaN and NaN); Arrow groups float bits, Spark normalises.
    pytest.param(FLOATS, ("k",), [Chg("D", 10, 0, old={"k": -0.0}, old_key_only=True),
                                  Chg("I", 10, 1, new={"k": 0.0, "v": 1})], id="minus-zero-and-zero-are-one-key"),
    pytest.param(ITEMS_FULL, ("grp",), [Chg("U", 10, 0, old={"id": 1, "grp": None, "note": "a"}, new={"id": 1, "grp": 2}),
                                        Chg("U", 11, 0, old={"id": 2, "grp": None, "note": "b"}, new={"id": 2, "grp": 3})],
                 id="null-key-in-a-full-old-image"),
]


@pytest.mark.parametrize(("rel", "key", "changes"), REPEATED)
def test_a_key_that_can_be_netted_is_a_repeat(staged, rel, key, changes):
    batch, _ = staged(rel, changes)
    assert not keys_never_repeat(batch, rel.name, key, full_identity=rel.replica_identity == "f")


def test_a_key_column_missing_from_a_staged_image_is_not_reasoned_about(staged):
    batch, _ = staged(ITEMS, [Chg("I", 10, 0, new={"id": 1, "grp": 1, "note": "a"})])
    assert not keys_never_repeat(batch, ITEMS.name, ("id", "nope"))
