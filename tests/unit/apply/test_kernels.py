"""The in-process net changes (``apply/kernels.py``) against the Spark transforms: on random table-batches whose keys
repeat — updated twice, moved by key changes and back, deleted and inserted again, exact duplicates of a change,
unchanged-TOAST values under key-only and full old images — ``kernels.compact_changes`` gives exactly the frame
``SparkBatchChanges.net`` builds with ``transforms.compact`` (kinds, keep lists, moved-from keys, touched flags,
values), and the direct rule hands such a batch over as a compacted one (``direct.compacted_rows``), netted in
key partitions above the in-memory bounds (``direct.compacted_batches``; ``test_partitioned.py`` compares those).
"""

from __future__ import annotations

import re
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply import direct, kernels, partitioned
from airflow_provider_pglogical.apply.batches import Batch, list_batches, read_relations
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.targets.base import PlannedTable
from airflow_provider_pglogical.exceptions import ApplyError
from tests.support.case_union import by_case, case_key, union_branches, with_case, write_case, write_union
from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch
from tests.unit.apply.conftest import ITEMS, ITEMS_FULL, PAIRS

# (relation, apply key): a primary key, a two-column key, a FULL identity keyed by id and by (id, grp), whose
# grp may be NULL (null keys group together, as Spark groups them), and by every column (a target without a primary
# key), so an UPDATE may leave a key column's TOAST value unchanged: the new key is then the old image's value.
CASES = [(ITEMS, ("id",)), (PAIRS, ("a", "b")), (ITEMS_FULL, ("id",)), (ITEMS_FULL, ("id", "grp")),
         (ITEMS_FULL, ("id", "grp", "note"))]


def _key_value(rel: Rel, n: int) -> dict:
    if rel is PAIRS:
        return {"a": n, "b": f"k{n % 3}"}
    return {"id": n}


def _row(rel: Rel, n: int, draw: st.DrawFn) -> dict:
    row = _key_value(rel, n)
    if rel is PAIRS:
        row.update(v=draw(st.one_of(st.none(), st.integers(-5, 5))))
    else:
        row.update(grp=draw(st.one_of(st.none(), st.integers(0, 1))), note=draw(st.one_of(st.none(), st.text(max_size=2))))
    return row


@st.composite
def changes_of(draw: st.DrawFn, rel: Rel, repeat: bool = True, toast_ok: bool = True) -> list[Chg]:
    """A table's changes: inserts, updates (some leaving note unchanged-TOAST when ``toast_ok``), key changes,
    deletes. With ``repeat``, over a few keys, so keys repeat, and now and then an exact duplicate of an earlier
    change; without, every change names keys of its own (the batch Spark nets without compaction's shuffle)."""
    full = rel.replica_identity == "f"
    fresh = iter(range(1, 1000))
    pool = st.integers(1, draw(st.integers(1, 6))) if repeat else st.builds(lambda: next(fresh))
    changes: list[Chg] = []
    for i in range(draw(st.integers(0, 14))):
        if repeat and changes and draw(st.integers(0, 8)) == 0:
            changes.append(draw(st.sampled_from(changes)))  # the same change staged twice
            continue
        commit, order = 10 + i // 3, i % 3
        op = draw(st.sampled_from(["I", "U", "U", "U_moved", "D"]))
        toast = ("note",) if toast_ok and rel is not PAIRS and op in ("U", "U_moved") and draw(st.booleans()) else ()

        def image(row: dict, toast: tuple[str, ...] = toast) -> dict:
            return {k: v for k, v in row.items() if k not in toast}

        if op == "I":
            changes.append(Chg("I", commit, order, new=_row(rel, draw(pool), draw)))
        elif op == "U":
            n = draw(pool)
            new = _row(rel, n, draw)
            if full:  # REPLICA IDENTITY FULL: every UPDATE has its full old image
                changes.append(Chg("U", commit, order, old=_row(rel, n, draw), new=image(new), toast=toast))
            else:  # key kept: no old image
                changes.append(Chg("U", commit, order, new=image(new), toast=toast))
        elif op == "U_moved":
            old_n, new_n = draw(pool), draw(pool)
            old = _row(rel, old_n, draw) if full else _key_value(rel, old_n)
            changes.append(Chg("U", commit, order, old=old, old_key_only=not full,
                               new=image(_row(rel, new_n, draw)), toast=toast))
        else:
            n = draw(pool)
            changes.append(Chg("D", commit, order, old=_row(rel, n, draw) if full else _key_value(rel, n),
                               old_key_only=not full))
    return changes


@st.composite
def batches(draw: st.DrawFn) -> tuple[Rel, tuple[str, ...], list[Chg]]:
    """A relation, its apply key and one table-batch of its changes."""
    rel, key = draw(st.sampled_from(CASES))
    return rel, key, draw(changes_of(rel))


# Cases per example of the properties batched over a union (tests/support/case_union.py).
CASES_PER_EXAMPLE = 4


@st.composite
def case_lists(draw: st.DrawFn) -> tuple[Rel, tuple[str, ...], list[list[Chg]]]:
    """A relation, its apply key and CASES_PER_EXAMPLE independent table-batches of its changes. Spark decides for
    the whole union whether to compact (some key repeats) and to refill TOAST (some change lists an unchanged-TOAST
    value), so whether any case may repeat a key or leave a value unchanged-TOAST is drawn once per example: the
    plans without compaction and without the refill stay as often compared as with one case per example."""
    rel, key = draw(st.sampled_from(CASES))
    repeat, toast_ok = draw(st.booleans()), draw(st.booleans())
    return rel, key, draw(st.lists(changes_of(rel, repeat, toast_ok), min_size=CASES_PER_EXAMPLE,
                                   max_size=CASES_PER_EXAMPLE))


def _planned(rel: Rel, key: tuple[str, ...], batch: Batch) -> PlannedTable:
    return PlannedTable(rel.name, rel.name, key, tuple(c.name for c in rel.columns), read_relations(batch)[rel.name],
                        TableApplyConfig())


def _staged(batch: Batch, rel: Rel) -> pa.Table:
    return pa.concat_tables([pq.read_table(f"{batch.ref.path}/{f}", columns=list(kernels.STAGED_COLUMNS))
                             for f in batch.table_files[rel.name]])


def _rows(table: pa.Table | pa.RecordBatch) -> list[tuple]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case_lists())
def test_the_kernels_net_changes_are_the_spark_transforms(spark, drawn) -> None:
    """15 examples of 4 cases each: 60 table-batches compared, as many as 60 examples of one each did, with one
    Spark query per example over their union (its key: the case's key and the case number)."""
    rel, key, cases = drawn
    with tempfile.TemporaryDirectory() as root:
        union = write_union(root, rel, dict(enumerate(cases)))
        planned = _planned(with_case(rel), case_key(key), union)
        event(union_branches(union, planned))
        spark_rows = by_case((r.asDict() for r in SparkBatchChanges(spark, union).net(planned).collect()), key)
        assert set(spark_rows) <= set(range(len(cases))), "Spark rows outside the compared cases"
        for case, changes in enumerate(cases):
            batch = write_case(root, rel, changes, case)
            table = _planned(rel, key, batch)
            net = kernels.compact_changes(_staged(batch, rel), key, table.columns, table.relation.identity_columns)
            assert _rows(net.table(key, table.columns)) == spark_rows.get(case, []), f"case {case}"
            handed = direct.batch_files(table, batch, None)
            event("compacted" if handed is not None and handed.compacted else
                  "per-row direct" if handed is not None else "Spark only")
            if handed is not None and handed.compacted:  # what the target prints: the same rows
                assert _rows(direct.compacted_rows(_staged(batch, rel), handed)) == spark_rows.get(case, []), \
                    f"case {case}"


def _two_updates(tmp_path, rel: Rel = ITEMS) -> Batch:
    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {rel: [
        Chg("I", 10, 0, new={"id": 1, "grp": 1, "note": "a"}),
        Chg("U", 11, 0, new={"id": 1, "grp": 2}, toast=("note",)),
        Chg("U", 12, 0, old={"id": 1}, old_key_only=True, new={"id": 2, "grp": 3, "note": "b"})]}))
    (batch,) = list_batches(str(tmp_path), "slot")
    return batch


def test_a_small_batch_with_repeated_keys_is_compacted_in_process_up_to_the_threshold(tmp_path, monkeypatch) -> None:
    batch = _two_updates(tmp_path)
    table = _planned(ITEMS, ("id",), batch)
    net = direct.batch_files(table, batch, None)
    assert net is not None and net.compacted and net.identity == ("id",)
    rows = direct.compacted_rows(_staged(batch, ITEMS), net).to_pylist()
    # id 1: inserted, updated keeping its TOASTed note, then moved to id 2 (touched before it moved away).
    assert sorted(rows, key=lambda r: r["op"]) == [
        {"op": "D", "keep": [], "lsn": -88, "from0": None, "touched": True, "c0": 1, "c1": None, "c2": None},
        {"op": "I", "keep": [], "lsn": -88, "from0": 1, "touched": False, "c0": 2, "c1": 3, "c2": "b"}]
    monkeypatch.setenv(direct.ROWS_SWITCH, "2")  # three staged changes: above it, netted in two key partitions
    parted = direct.batch_files(table, batch, None)
    assert parted is not None and parted.compacted and parted.partitions == 2
    chunks = direct.staged_chunks(parted.files)
    assert sorted((r for b in direct.compacted_batches(chunks, parted) for r in b.to_pylist()),
                  key=lambda r: r["op"]) == sorted(rows, key=lambda r: r["op"])
    monkeypatch.setenv(direct.ROWS_SWITCH, "0")
    assert direct.batch_files(table, batch, None) is None
    monkeypatch.setenv(direct.ROWS_SWITCH, "3")
    found = direct.batch_files(table, batch, None)
    assert found is not None and found.partitions == 1
    monkeypatch.setenv(direct.ENV_SWITCH, "0")  # the reference path: Spark's transforms
    assert direct.batch_files(table, batch, None) is None


FLOATS = Rel("public", "floats", (Col("x", pa.float64(), "double precision", True), Col("v", pa.int64(), "bigint")))


def test_a_floating_point_key_keeps_spark_which_normalises_it(tmp_path) -> None:
    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {FLOATS: [
        Chg("I", 10, 0, new={"x": 1.5, "v": 1}), Chg("U", 11, 0, new={"x": 1.5, "v": 2})]}))
    (batch,) = list_batches(str(tmp_path), "slot")
    assert not kernels.groupable(pa.float64()) and kernels.groupable(pa.string())
    assert direct.batch_files(_planned(FLOATS, ("x",), batch), batch, None) is None


def test_a_batch_over_the_byte_bound_is_netted_in_key_partitions(tmp_path, monkeypatch) -> None:
    batch = _two_updates(tmp_path)
    table = _planned(ITEMS, ("id",), batch)
    paths = [f"{batch.ref.path}/{f}" for f in batch.table_files[ITEMS.name]]
    whole = direct.batch_files(table, batch, None)
    assert direct.in_process(table, batch, paths) == 1 and whole is not None and whole.partitions == 1
    total, _ = direct.staged_bytes(paths)
    monkeypatch.setenv(direct.BYTES_SWITCH, "100")  # three changes stage more than 100 bytes: several partitions
    assert direct.in_process(table, batch, paths) == partitioned.partition_count(3, total, direct.inprocess_rows(),
                                                                                  100) > 1
    parted = direct.batch_files(table, batch, None)
    assert parted is not None and parted.compacted and parted.partitions == -(-total // 100) > 1
    monkeypatch.setenv(direct.BYTES_SWITCH, "0")  # no byte bound
    found = direct.batch_files(table, batch, None)
    assert found is not None and found.partitions == 1


def test_a_string_column_near_arrows_offsets_is_not_netted_in_process(tmp_path, monkeypatch) -> None:
    batch = _two_updates(tmp_path)
    table = _planned(ITEMS, ("id",), batch)
    monkeypatch.setattr(direct, "COLUMN_BYTES", 4)  # every text column "too wide" for 32-bit offsets
    monkeypatch.setenv(direct.BYTES_SWITCH, "0")
    assert direct.batch_files(table, batch, None) is None
    monkeypatch.setenv(direct.ROWS_SWITCH, "1")  # three partitions: a column's share is still too wide
    assert direct.batch_files(table, batch, None) is None


@pytest.mark.parametrize(("switch", "read", "bad", "message"), [
    (direct.ROWS_SWITCH, direct.inprocess_rows, "lots",
     "PGLOGICAL_APPLY_INPROCESS_ROWS='lots' is not a whole number of staged changes "
     "(0 switches the in-process netting off; unset means 2000000)"),
    (direct.BYTES_SWITCH, direct.inprocess_bytes, "1GB",
     "PGLOGICAL_APPLY_INPROCESS_BYTES='1GB' is not a whole number of bytes "
     "(0 switches the byte bound off; unset means 134217728)"),
])
def test_a_bad_in_process_bound_is_a_clear_error(monkeypatch, switch, read, bad, message) -> None:
    monkeypatch.setenv(switch, bad)
    with pytest.raises(ApplyError, match=re.escape(message) + "$"):
        read()
    monkeypatch.setenv(switch, "-5")
    with pytest.raises(ApplyError, match="negative"):
        read()
    monkeypatch.delenv(switch)
    assert read() == {direct.ROWS_SWITCH: direct.INPROCESS_ROWS, direct.BYTES_SWITCH: direct.INPROCESS_BYTES}[switch]
