"""Netting in key partitions spilled to disk (``apply/partitioned.py``) against the whole-batch netting: on random
table-batches whose keys repeat — key changes (whose two keys may hash to two partitions), deletes, unchanged-TOAST
refills under key-only and full old images, a row filter that UPDATEs cross and actions left out — split into
random row groups and netted in 2–7 partitions, the union of the partitions' net rows is exactly
``kernels.compact_changes`` of the whole published batch (the reference, itself compared with Spark in
``test_kernels.py``); the key hash groups as Arrow equality does; routed chunks and hashed slices stay within
their byte budgets whatever the rows' width; spill files are gone after success, after a failure, which is a typed
error naming a way out that fits its cause, and after a COPY that fails while a partition is being sent; an Arrow
overflow is a typed error whose way out (Spark) is followed; a batch netted whole is judged whole. The lake
mirrors take such a batch, or any covered one they stream, from spill files of its net rows, read back in chunks
joined across files (several schema versions in their union), and leave to Spark what the partitions cannot give
(a row keeping the target's TOAST value); a spill file lost, cut short or not written is a typed error that commits nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply import direct, kernels, partitioned, published, versions
from airflow_provider_pglogical.apply.batches import Batch, list_batches
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.targets.base import DirectNet, PlannedBatch, PlannedTable
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from airflow_provider_pglogical.apply.targets.lake import direct as lake_direct
from airflow_provider_pglogical.apply.targets.lake import parts as lake_parts
from airflow_provider_pglogical.apply.targets.lake.stream import NetSummary
from airflow_provider_pglogical.apply.targets.postgres import arrownet, arrowtext
from airflow_provider_pglogical.exceptions import ApplyError, UnresolvableToastError
from tests.support.stage import BatchSpec, Chg, Col, Rel, Trunc, write_batch
from tests.unit.apply.conftest import ITEMS, PAIRS
from tests.unit.apply.test_direct_versions import _planned as versions_planned
from tests.unit.apply.test_kernels import _planned, _row, _rows, _staged, _two_updates, batches

# Filters each relation's UPDATEs cross (they draw new values), and one of constants only.
FILTERS = {"items": [None, "grp = 1", "id % 2 = 0", "note IS NOT NULL AND grp IS DISTINCT FROM 0", "1 = 1"],
           "pairs": [None, "v > 0", "a % 2 = 1 OR v IS NULL"]}
ACTIONS = st.sampled_from([("insert", "update", "delete"), ("insert", "update"), ("update", "delete"), ("insert",)])


def _pieces(staged: pa.Table, cuts: list[int]) -> list[pa.Table]:
    """``staged`` in row groups cut at these positions (as the staged files' row groups would be)."""
    bounds = sorted({0, staged.num_rows, *(c % (staged.num_rows + 1) for c in cuts)})
    return [staged.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.data())
def test_netting_in_key_partitions_is_the_whole_batch_netting(drawn, data) -> None:
    rel, key, changes = drawn
    row_filter = data.draw(st.sampled_from(FILTERS["pairs" if rel is PAIRS else "items"]))
    actions = data.draw(ACTIONS)
    partitions = data.draw(st.integers(2, 7))
    cuts = data.draw(st.lists(st.integers(0, 40), max_size=4))
    with tempfile.TemporaryDirectory() as root:
        write_batch(root, "slot", BatchSpec(0x1000, 0x2000, {rel: changes}))
        (batch,) = list_batches(root, "slot")
        table = _planned(rel, key, batch)
        identity = tuple(table.relation.identity_columns)
        staged = _staged(batch, rel)
        whole = kernels.compact_changes(
            published.publish(staged, row_filter=row_filter, actions=actions, identity=identity),
            key, table.columns, identity)
        spill = Path(root) / "spill"
        spill.mkdir()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(partitioned.SPILL_SWITCH, str(spill))
            mp.setattr(partitioned, "ROUTE_ROWS", data.draw(st.integers(1, 8)))  # several routed chunks,
            mp.setattr(partitioned, "ROUTE_BYTES", data.draw(st.sampled_from([1, 2_000, 2**25])))  # by rows or bytes
            parts = list(partitioned.netted(_pieces(staged, cuts), source=rel.name, key=key, columns=table.columns,
                                            identity=identity, row_filter=row_filter, actions=actions,
                                            partitions=partitions))
        union = [r for p in parts for r in _rows(p.table(key, table.columns))]
        assert sorted(union, key=repr) == _rows(whole.table(key, table.columns))
        assert list(spill.iterdir()) == []  # every spill file and the directory removed
        event(f"{sum(1 for p in parts if len(p.kind))} non-empty partitions")
        event("a key change" if any(c.op == "U" and c.old is not None and any(
            c.old.get(k) != c.new.get(k, c.old.get(k)) for k in key) for c in changes) else "no key change")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=6), st.binary(max_size=3).map(repr)), max_size=30),
       st.integers(1, 5), st.integers(0, 30), st.integers(1, 20))
def test_equal_strings_hash_equally_wherever_they_sit(values, slice_rows, skip, slice_bytes) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(partitioned, "_HASH_SLICE", slice_rows)  # values hashed across several slices
        mp.setattr(partitioned, "_HASH_BYTES", slice_bytes)
        whole = partitioned.key_hash([pa.array(values, pa.string())])
        sliced = partitioned.key_hash([pa.array(values, pa.large_string()).slice(skip)])
    assert list(sliced) == list(whole[skip:])
    seen: dict[object, int] = {}
    for value, hashed in zip(values, whole, strict=True):
        assert seen.setdefault(value, hashed) == hashed
    assert len(set(seen.values())) == len(seen)  # no collision among a few values


def test_equal_keys_hash_equally_whatever_their_chunks_and_nulls() -> None:
    ints = pa.chunked_array([pa.array([1, 2, 3], pa.int64()), pa.array([None, 3, 1], pa.int64())])
    texts = pa.chunked_array([pa.array(["a", None, "b"]), pa.array(["b", "a", None])])
    stamps = pa.array([0, None, 5, 5, 0, None], pa.timestamp("us", "UTC"))
    decimals = pa.array([1, 2, None, 2, 1, None], pa.decimal128(12, 2))
    hashed = partitioned.key_hash([ints, texts, stamps, decimals])
    rows = list(zip(ints.to_pylist(), texts.to_pylist(), stamps.to_pylist(), decimals.to_pylist(), strict=True))
    for i, a in enumerate(rows):
        for j, b in enumerate(rows):
            if a == b:
                assert hashed[i] == hashed[j]
    alone = partitioned.key_hash([pa.array([3, 1], pa.int64())])  # no null in its chunk: the same hashes
    assert list(alone) == list(partitioned.key_hash([pa.array([3, None, 1], pa.int64())])[[0, 2]])
    assert len(set(partitioned.key_hash([pa.array(np.arange(1000))]) % np.uint64(4))) == 4  # spread


def test_the_partition_count_keeps_each_partition_within_both_bounds() -> None:
    assert partitioned.partition_count(10, 100, 10, 100) == 1
    assert partitioned.partition_count(10_000_000, 10, 2_000_000, 0) == 5
    assert partitioned.partition_count(3, 1_000, 0, 128) == 8
    assert partitioned.partition_count(0, 0, 2, 2) == 1


def test_a_failure_while_spilling_is_a_typed_error_and_leaves_no_file(tmp_path, monkeypatch) -> None:
    batch = _two_updates(tmp_path / "stage")
    table = _planned(ITEMS, ("id",), batch)
    monkeypatch.setenv(direct.ROWS_SWITCH, "1")
    net = direct.batch_files(table, batch, None)
    assert net is not None and net.partitions == 3
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv(partitioned.SPILL_SWITCH, str(blocked))
    with pytest.raises(ApplyError, match=r"^public\.items: cannot spill 3 key partitions of the table-batch to .*"
                                         r"not-a-directory .*; set PGLOGICAL_APPLY_SPILL_DIR to a writable directory$"):
        list(direct.compacted_batches(direct.staged_chunks(net.files), net))

    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv(partitioned.SPILL_SWITCH, str(spill))
    real = pa.ipc.new_file
    opened: list[str] = []

    def full_disk(path: str, schema: pa.Schema) -> pa.ipc.RecordBatchFileWriter:
        if opened:
            raise OSError(28, "No space left on device")
        opened.append(path)
        return real(path, schema)

    monkeypatch.setattr(pa.ipc, "new_file", full_disk)
    with pytest.raises(ApplyError, match=r"^public\.items: spilling key partitions of the table-batch to .* failed "
                                         r"after 0 staged changes \(No space left on device\); set "
                                         "PGLOGICAL_APPLY_SPILL_DIR to a directory with room$"):
        list(direct.compacted_batches(direct.staged_chunks(net.files), net))
    assert opened and os.listdir(spill) == []  # the partial file and its directory removed
    monkeypatch.setattr(pa.ipc, "new_file", real)
    rows = [r for b in direct.compacted_batches(direct.staged_chunks(net.files), net) for r in b.to_pylist()]
    assert sorted(rows, key=repr) == sorted(direct.compacted_rows(_staged(batch, ITEMS), net).to_pylist(), key=repr)
    assert os.listdir(spill) == []


def test_values_are_hashed_in_slices_of_a_bounded_size_whatever_their_width(monkeypatch) -> None:
    monkeypatch.setattr(partitioned, "_HASH_BYTES", 100)
    values = pa.array(["a" * 30] * 10 + ["b" * 500] + ["c"] * 300)
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)
    slices = list(partitioned._hash_slices(offsets))
    assert [a for a, _ in slices] == [0, *(b for _, b in slices[:-1])] and slices[-1][1] == len(values)
    for first, last in slices:  # a value longer than the budget alone; at most _HASH_SLICE values
        assert last - first == 1 or (offsets[last] - offsets[first] <= 100 and last - first <= partitioned._HASH_SLICE)
    assert slices[:6] == [(0, 3), (3, 6), (6, 9), (9, 10), (10, 11), (11, 111)] and len(slices) == 8  # 100 bytes each


def test_routed_chunks_stop_on_bytes_as_well_as_rows(monkeypatch) -> None:
    monkeypatch.setattr(partitioned, "ROUTE_ROWS", 1_000_000)
    monkeypatch.setattr(partitioned, "ROUTE_BYTES", 4_000)
    groups = [pa.table({"v": pa.array(["x" * 1000] * 2)}) for _ in range(5)]  # ~2 kB a row group
    gathered = list(partitioned._gathered(groups))
    assert [c.num_rows for c in gathered] == [4, 4, 2]
    assert all(c.column(0).num_chunks == 1 for c in gathered)


def _compacted(tmp_path, monkeypatch, rows_bound: str):
    """The two-update batch of ``test_kernels.py`` as a compacted ``DirectNet`` under ``rows_bound``, spilling to a
    fresh directory."""
    batch = _two_updates(tmp_path / "stage")
    table = _planned(ITEMS, ("id",), batch)
    spill = tmp_path / "spill"
    spill.mkdir(exist_ok=True)
    monkeypatch.setenv(partitioned.SPILL_SWITCH, str(spill))
    monkeypatch.setenv(direct.ROWS_SWITCH, rows_bound)
    net = direct.batch_files(table, batch, None)
    assert net is not None and net.compacted
    return batch, table, net, spill


def test_an_arrow_overflow_is_a_typed_error_whose_way_out_is_spark(tmp_path, monkeypatch) -> None:
    batch, table, net, spill = _compacted(tmp_path, monkeypatch, "1")
    assert net.partitions == 3

    def overflowing(*_: object) -> kernels.Net:  # what a column of 2 GiB or more in one array raises
        raise pa.ArrowInvalid("offset overflow while concatenating arrays")

    monkeypatch.setattr(kernels, "compact_changes", overflowing)
    with pytest.raises(ApplyError, match=r"^public\.items: netting key partition \d of 3 \(\d staged changes\), a "
                                         r"string or binary column .* 2 GiB array limit; set "
                                         r"PGLOGICAL_APPLY_INPROCESS_ROWS=0 to net such table-batches with Spark$"):
        list(direct.compacted_batches(direct.staged_chunks(net.files), net))
    assert os.listdir(spill) == []
    monkeypatch.setenv(direct.ROWS_SWITCH, "3")
    whole = direct.batch_files(table, batch, None)
    assert whole is not None and whole.partitions == 1
    with pytest.raises(ApplyError, match=r"^public\.items: netting it in one piece \(3 staged changes\), .*"
                                         "PGLOGICAL_APPLY_INPROCESS_ROWS=0"):
        list(direct.compacted_batches(direct.staged_chunks(whole.files), whole))
    monkeypatch.setenv(direct.ROWS_SWITCH, "0")  # the way out: the table-batch goes to Spark's transforms
    assert direct.batch_files(table, batch, None) is None


def test_a_batch_netted_whole_is_judged_whole_so_an_overflow_leaves_it_to_spark(tmp_path, monkeypatch) -> None:
    batch = _two_updates(tmp_path)
    (path,) = (f"{batch.ref.path}/{f}" for f in batch.table_files[ITEMS.name])
    real = published.publish

    def overflowing(staged: pa.Table, **kwargs: object) -> pa.Table:
        if staged.num_rows > 3:  # both files at once: stands for a column beyond 2 GiB once concatenated
            raise pa.ArrowInvalid("offset overflow while concatenating arrays")
        return real(staged, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(published, "publish", overflowing)
    twice = DirectNet(ITEMS.name, ITEMS.name, (path, path), ("id",), ("id", "grp", "note"), compacted=True,
                      identity=("id",), row_filter="grp > 0")
    assert not direct.publishable(twice)  # netted whole (compacted_rows concatenates): Spark's
    assert direct.publishable(replace(twice, partitions=2))  # routed a row group at a time: judged per group


def test_a_failed_copy_closes_the_netting_and_removes_its_spill_files(tmp_path, monkeypatch) -> None:
    _, table, net, spill = _compacted(tmp_path, monkeypatch, "1")
    plan = arrownet.DirectPlan(net.key, net.columns, (arrowtext.PLAIN, arrowtext.PLAIN, arrowtext.TEXT),
                               (arrowtext.PLAIN,), tuple((p, 0) for p in net.files), compacted=True,
                               identity=net.identity, partitions=net.partitions, source=net.source)
    sent: list[int] = []

    def connection_lost(_dsn: str, _staging: str, _columns: object, chunks: Iterator[tuple[bytes, int]]) -> int:
        sent.append(next(chunks)[1])  # the first partition's lines went out, then the server went away
        raise ApplyError("COPY into staging failed: [08006] server closed the connection unexpectedly")

    monkeypatch.setattr(arrownet, "copy_chunks", connection_lost)
    with pytest.raises(ApplyError, match="08006") as failed:
        list(arrownet.copy_tasks("dbname=none", "staging", ["id", "grp", "note"], plan)(plan.tasks))
    assert sent and failed.traceback  # the traceback (holding the consumer's frame) still referenced
    assert os.listdir(spill) == []


@pytest.mark.parametrize(("code", "advice"), [
    (errno.EMFILE, "raise PGLOGICAL_APPLY_INPROCESS_BYTES / PGLOGICAL_APPLY_INPROCESS_ROWS for fewer partitions, "
                   r"or the open-file limit \(ulimit -n\)"),
    (errno.EACCES, "give this user write access to it, or set PGLOGICAL_APPLY_SPILL_DIR to a writable directory"),
    (errno.EDQUOT, "set PGLOGICAL_APPLY_SPILL_DIR to a directory with room"),
])
def test_a_spill_error_names_the_way_out_its_cause_needs(tmp_path, monkeypatch, code, advice) -> None:
    _, _, net, spill = _compacted(tmp_path, monkeypatch, "1")
    real = pa.ipc.new_file
    opened: list[str] = []

    def failing(path: str, schema: pa.Schema) -> pa.ipc.RecordBatchFileWriter:
        if opened:  # the second partition's writer: one open file per partition
            raise OSError(code, os.strerror(code))
        opened.append(path)
        return real(path, schema)

    monkeypatch.setattr(pa.ipc, "new_file", failing)
    with pytest.raises(ApplyError, match=rf"^public\.items: spilling key partitions .* failed after 0 staged changes "
                                         rf"\({os.strerror(code)}\); {advice}$"):
        list(direct.compacted_batches(direct.staged_chunks(net.files), net))
    assert os.listdir(spill) == []
    monkeypatch.setattr(pa.ipc, "new_file", real)  # the way out: fewer partitions open at once
    monkeypatch.setenv(direct.ROWS_SWITCH, "3")
    assert list(direct.compacted_batches(direct.staged_chunks(net.files), replace(net, partitions=1)))


# -- lake mirrors (``apply/targets/lake/parts.py``) -------------------------------------------------------------------


def _lake(name: str, root: Path, slot: str, max_merge_rows: int | None = None) -> DeltaTarget | IcebergTarget:
    if name == "delta":
        return DeltaTarget(DeltaLocation(str(root)), slot, max_merge_rows=max_merge_rows)
    root.mkdir(parents=True, exist_ok=True)
    return IcebergTarget(IcebergLocation({"type": "sql", "uri": f"sqlite:///{root}/catalog.db",
                                          "warehouse": str(root / "warehouse")}), slot)


def _lake_rows(target: DeltaTarget | IcebergTarget, table: str) -> list[tuple]:
    if isinstance(target, DeltaTarget):
        data = DeltaTable(target.location.table_uri(table)).to_pyarrow_table()
    else:
        found = target.open(table)
        assert found is not None
        data = found.scan().to_arrow()
    return sorted((tuple(r.values()) for r in data.select(sorted(data.column_names)).to_pylist()), key=repr)


def _apply(target: DeltaTarget | IcebergTarget, spark: SparkOnDemand, batch: Batch, table: PlannedTable) -> None:
    plan = PlannedBatch("slot", batch.start_lsn, batch.end_lsn, (table,),
                        truncate=(table.target,) if table.truncated_at is not None else ())
    assert target.apply_batch(plan, SparkBatchChanges(spark, batch)).applied


def _outcome(target: DeltaTarget | IcebergTarget, spark: SparkOnDemand, batch: Batch, table: PlannedTable) -> str:
    """``_apply``'s outcome, where a random batch may update a key after deleting it keeping an unchanged-TOAST
    value the lake cannot resolve (``unchanged_toast: fail``): every way must then refuse it alike, writing nothing."""
    try:
        _apply(target, spark, batch, table)
    except UnresolvableToastError:
        return "unresolvable TOAST"
    return "applied"


def _seeded(rel: Rel, draw: st.DrawFn) -> list[Chg]:
    """The keys the random changes draw from, in the target before their batch (so they update, delete, keep)."""
    return [Chg("I", 1, n, new=_row(rel, n, draw)) for n in range(1, 7)]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.data())
def test_a_lake_mirror_takes_a_batch_netted_in_key_partitions_as_the_one_piece_and_spark(spark, drawn, data) -> None:
    """Random batches whose keys repeat (key changes across partitions, unchanged TOAST, deletes, now and then a
    TRUNCATE among them) into a seeded Delta and Iceberg table: netted in 2–7 key partitions in this process (into
    Delta also in a commit per bucket, ``max_merge_rows``), in one piece, and by Spark (``PGLOGICAL_APPLY_DIRECT=0``),
    each lake ends with the same rows and watermark."""
    rel, key, changes = drawn
    partitions = data.draw(st.integers(2, 7))
    truncs = []
    if changes and data.draw(st.integers(0, 4)) == 0:
        at = data.draw(st.sampled_from(changes))
        truncs.append(Trunc(at.commit_lsn, at.tx_order, (rel.name,)))
    used: list[str] = []
    with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as mp:
        write_batch(root, "slot", BatchSpec(0x1000, 0x2000, {rel: _seeded(rel, data.draw)}))
        write_batch(root, "slot", BatchSpec(0x2000, 0x3000, {rel: changes}, truncs))
        seed, batch = list_batches(root, "slot")
        table = replace(_planned(rel, key, batch), truncated_at=(truncs[0].commit_lsn, truncs[0].tx_order)
                        if truncs else None)
        spill = Path(root) / "spill"
        spill.mkdir()
        mp.setenv(partitioned.SPILL_SWITCH, str(spill))
        on_demand = SparkOnDemand(lambda: spark)
        real = lake_parts.spilled

        @contextlib.contextmanager
        def noted(net: DirectNet, columns: Sequence[str]) -> Iterator[lake_parts.SpilledNet]:
            with real(net, columns) as parts:
                used.append("Spark" if parts.summary.needs_collected or not parts.paths else "partitions")
                yield parts

        mp.setattr(lake_parts, "spilled", noted)
        got: dict[str, dict[str, tuple[list[tuple], int | None]]] = {}
        for name in ("delta", "iceberg"):
            ways = {"partitions": ("1", None), "one piece": ("1", direct.INPROCESS_ROWS), "spark": ("0", None)}
            if name == "delta":  # and in a commit per bucket of at most 2 net changes, the watermark in the last
                ways["partitions, buckets"] = ("1", None)
            for way, (switch, bound) in ways.items():
                mp.setenv(direct.ENV_SWITCH, switch)
                target = _lake(name, Path(root) / f"{name}-{way}".replace(" ", "-").replace(",", ""), "slot",
                               2 if way.endswith("buckets") else None)
                mp.setenv(direct.ROWS_SWITCH, str(direct.INPROCESS_ROWS))
                _apply(target, on_demand, seed, _planned(rel, key, seed))
                staged_rows = int(batch.manifest.tables.get(rel.name, {}).get("rows", 0))
                mp.setenv(direct.ROWS_SWITCH, str(bound or max(1, -(-staged_rows // partitions))))
                if way.startswith("partitions"):
                    found = direct.batch_files(table, batch, None)
                    split = found is not None and found.partitions > 1
                    before = len(used)
                outcome = _outcome(target, on_demand, batch, table)
                if way.startswith("partitions"):  # a batch netted in key partitions reaches the lake from them
                    assert len(used) == before + split, name
                got.setdefault(name, {})[way] = (outcome, _lake_rows(target, rel.name), target.watermark(rel.name))
            assert all(g == got[name]["spark"] for g in got[name].values()), (name, got[name])
            assert got[name]["spark"][2] == (0x3000 if got[name]["spark"][0] == "applied" else 0x2000)
        assert list(spill.iterdir()) == []
    event(f"lake: {used[0] if used else 'not partitioned'}")
    event(got["delta"]["spark"][0])
    event("truncated" if truncs else "no truncate")


def _no_spark() -> object:
    pytest.fail("the lake asked for Spark")


def _history(root: Path) -> tuple[Batch, Batch, list[tuple]]:
    """A seed batch of 40 rows and a batch of 47 changes to them whose keys repeat (updates, deletes, key changes),
    with the rows a lake holds after both."""
    inserts = [Chg("I", 1, n, new={"id": n, "grp": n % 3, "note": f"n{n}"}) for n in range(40)]
    changes = [Chg("U", 2, n, new={"id": n, "grp": 7, "note": f"u{n}"}) for n in range(0, 40, 2)]
    changes += [Chg("U", 3, n, new={"id": n, "grp": 8, "note": f"v{n}"}) for n in range(0, 40, 4)]  # keys repeat
    changes += [Chg("D", 4, n, old={"id": n}, old_key_only=True) for n in range(1, 40, 5)]
    changes += [Chg("U", 5, n, old={"id": n}, old_key_only=True, new={"id": n + 100, "grp": 9, "note": "moved"})
                for n in range(3, 40, 10)]
    write_batch(root, "slot", BatchSpec(0x1000, 0x2000, {ITEMS: inserts}))
    write_batch(root, "slot", BatchSpec(0x2000, 0x3000, {ITEMS: changes}))
    seed, batch = list_batches(str(root), "slot")
    live = {n: (n % 3, f"n{n}") for n in range(40)}
    for c in changes:
        if c.op == "D" or c.old is not None:
            live.pop(c.old["id"])
        if c.new is not None:
            live[c.new["id"]] = (c.new["grp"], c.new["note"])
    return seed, batch, sorted(((g, i, n) for i, (g, n) in live.items()), key=repr)


def test_spill_files_are_read_in_chunks_joined_across_partitions(tmp_path) -> None:
    """Partitions of 2, 0, 3 and 4 net rows: chunks of the size asked for whatever the partitions' sizes (Iceberg
    scans the target once per chunk), and exactly as many buckets as asked for."""
    paths = []
    for j, n in enumerate([2, 0, 3, 4]):
        paths.append(str(tmp_path / f"net-{j}.arrow"))
        with pa.OSFile(paths[-1], "wb") as f, pa.ipc.new_file(f, pa.schema([("id", pa.int64())])) as writer:
            writer.write_table(pa.table({"id": pa.array(range(10 * j, 10 * j + n), pa.int64())}))
    net = lake_parts.SpilledNet("public.items", str(tmp_path), tuple(paths), NetSummary(9, (), False))
    assert [c.num_rows for c in net.pieces(4)] == [4, 4, 1]
    assert [c.num_rows for c in net.pieces(100)] == [9]
    assert [c.num_rows for c in net.buckets(2)] == [5, 4]
    assert [c.num_rows for c in net.buckets(12)] == [1] * 9 + [0] * 3
    assert sorted(v for c in net.buckets(4) for v in c.column("id").to_pylist()) == [0, 1, 20, 21, 22, 30, 31, 32, 33]
    empty = lake_parts.SpilledNet("public.items", str(tmp_path), (paths[1],), NetSummary(0, (), False))
    assert [(c.num_rows, c.schema.names) for c in empty.pieces(4)] == [(0, ["id"])]


@pytest.mark.parametrize("name", ["delta", "iceberg"])
def test_a_batch_netted_in_one_piece_but_streamed_is_streamed_from_its_spill_file(name, tmp_path,
                                                                                 monkeypatch) -> None:
    """Within the in-process bounds (one partition) but over the lake's bucket size (streamed): the net rows the
    direct path has read reach the streamed commit from a spill file — Spark would read the staged changes again —
    and the lake ends as one whose batch was collected whole."""
    seed, batch, expected = _history(tmp_path / "stage")
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv(partitioned.SPILL_SWITCH, str(spill))
    table = _planned(ITEMS, ("id",), batch)
    found = direct.batch_files(table, batch, None)
    assert found is not None and found.compacted and found.partitions == 1
    for way, target in {"streamed": _lake(name, tmp_path / "streamed", "slot", 4 if name == "delta" else None),
                        "whole": _lake(name, tmp_path / "whole", "slot")}.items():
        target.chunk_rows = 5 if way == "streamed" else None  # 47 staged changes: streamed or collected whole
        _apply(target, SparkOnDemand(_no_spark), seed, _planned(ITEMS, ("id",), seed))
        _apply(target, SparkOnDemand(_no_spark), batch, table)
        assert (_lake_rows(target, ITEMS.name), target.watermark(ITEMS.name)) == (expected, 0x3000), way
    assert list(spill.iterdir()) == []


@pytest.mark.parametrize("name", ["delta", "iceberg"])
def test_a_lost_net_spill_file_fails_the_lake_commit_which_leaves_table_and_watermark(name, tmp_path,
                                                                                    monkeypatch) -> None:
    """The net rows of the first key partition read into the commit (Delta's MERGE stream, Iceberg's transaction),
    the other partitions' files then gone, or cut short: a typed error naming the way out, the table and its
    watermark as they were, no spill file left; a disk full while spilling, likewise before any commit; the apply
    run again commits the batch, all of it, without Spark."""
    seed, batch, expected = _history(tmp_path / "stage")
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv(partitioned.SPILL_SWITCH, str(spill))
    target = _lake(name, tmp_path / name, "slot")
    spark = SparkOnDemand(_no_spark)
    _apply(target, spark, seed, _planned(ITEMS, ("id",), seed))
    before = _lake_rows(target, ITEMS.name)
    monkeypatch.setenv(direct.ROWS_SWITCH, "10")  # 47 changes: 5 partitions
    read = lake_parts.SpilledNet._read
    reads: list[int] = []

    def failing(self: lake_parts.SpilledNet, j: int, path: str, *, spoil: bool) -> pa.Table:
        rows = read(self, j, path)
        reads.append(rows.num_rows)
        for other in self.paths[j + 1:]:  # the other partitions' files go, or are cut short, once one is read
            if spoil:
                os.truncate(other, 16)
            else:
                os.remove(other)
        return rows

    for spoil, cause in ((False, r"No such file or directory"), (True, r"not a whole Arrow IPC file")):
        monkeypatch.setattr(lake_parts.SpilledNet, "_read",
                            lambda self, j, path, spoil=spoil: failing(self, j, path, spoil=spoil))
        with pytest.raises(ApplyError, match=rf"^public\.items: reading the net changes of spill file 2 of 5 back "
                                             rf"from .* failed \({cause}\); set PGLOGICAL_APPLY_SPILL_DIR to a "
                                             "directory nothing else cleans$"):
            _apply(target, spark, batch, _planned(ITEMS, ("id",), batch))
        assert reads and reads[-1] > 0
        assert target.watermark(ITEMS.name) == 0x2000
        assert _lake_rows(target, ITEMS.name) == before
        assert list(spill.iterdir()) == []
    monkeypatch.setattr(lake_parts.SpilledNet, "_read", read)

    real = pa.ipc.new_file

    def full_disk(sink: object, schema: pa.Schema) -> pa.ipc.RecordBatchFileWriter:
        if isinstance(sink, pa.NativeFile):  # a net spill file (the partitions' spill opens paths)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(sink, schema)

    monkeypatch.setattr(pa.ipc, "new_file", full_disk)
    with pytest.raises(ApplyError, match=r"^public\.items: spilling the net changes of a key partition to .* failed "
                                         r"\(No space left on device\); set PGLOGICAL_APPLY_SPILL_DIR to a directory "
                                         "with room$"):
        _apply(target, spark, batch, _planned(ITEMS, ("id",), batch))
    assert (_lake_rows(target, ITEMS.name), target.watermark(ITEMS.name)) == (before, 0x2000)
    assert list(spill.iterdir()) == []
    monkeypatch.setattr(pa.ipc, "new_file", real)

    _apply(target, spark, batch, _planned(ITEMS, ("id",), batch))
    assert (_lake_rows(target, ITEMS.name), target.watermark(ITEMS.name)) == (expected, 0x3000)


def _both_ways(spark, root: Path, monkeypatch: pytest.MonkeyPatch, steps: Sequence[tuple[Batch, PlannedTable]]
               ) -> dict[str, dict[str, tuple[DeltaTarget | IcebergTarget, bool]]]:
    """Each lake (``delta``, ``iceberg``) with ``steps`` applied by the direct path (``"1"``) and by Spark alone
    (``"0"``): per switch, the target and whether that run started Spark."""
    runs: dict[str, dict[str, tuple[DeltaTarget | IcebergTarget, bool]]] = {}
    for name in ("delta", "iceberg"):
        for switch in ("1", "0"):
            monkeypatch.setenv(direct.ENV_SWITCH, switch)
            on_demand = SparkOnDemand(lambda: spark)
            target = _lake(name, root / f"{name}-{switch}", "slot")
            for batch, table in steps:
                _apply(target, on_demand, batch, table)
            runs.setdefault(name, {})[switch] = (target, on_demand.started)
    return runs


V1 = Rel("public", "v", (Col("id", pa.int64(), "bigint", True), Col("w", pa.int32(), "integer"),
                          Col("d", pa.string(), "text")))
V2 = replace(V1, columns=V1.columns[:2], version=2)  # d dropped


def _over_bounds(case: str, root: Path) -> tuple[Batch, Batch, PlannedTable, PlannedTable]:
    """Table-batches over the in-process bounds: a key change whose new row keeps an unchanged TOAST value (the
    target's old row holds it), and changes staged under two schema versions."""
    if case == "key change keeping TOAST":
        seed = {ITEMS: [Chg("I", 1, n, new={"id": n, "grp": 0, "note": f"n{n}"}) for n in range(1, 7)]}
        changes = {ITEMS: [Chg("U", 2, n, new={"id": n, "grp": 1, "note": f"u{n}"}) for n in (1, 3, 4)]
                   + [Chg("U", 3, 0, old={"id": 2}, old_key_only=True, new={"id": 12, "grp": 5}, toast=("note",))]}
    else:
        seed = {V1: [Chg("I", 1, n, new={"id": n, "w": n, "d": f"d{n}"}) for n in range(1, 5)]}
        changes = {V1: [Chg("U", 2, 0, new={"id": 1, "w": 5, "d": "x"}), Chg("U", 2, 1, new={"id": 1, "w": 6, "d": "y"})],
                   V2: [Chg("I", 4, 0, new={"id": 5, "w": 7}), Chg("U", 4, 1, new={"id": 2, "w": 2}),
                        Chg("D", 5, 0, old={"id": 3}, old_key_only=True)]}
    write_batch(root, "slot", BatchSpec(0x1000, 0x2000, seed))
    write_batch(root, "slot", BatchSpec(0x2000, 0x3000, changes))
    first, batch = list_batches(str(root), "slot")
    if case == "key change keeping TOAST":
        return first, batch, _planned(ITEMS, ("id",), first), _planned(ITEMS, ("id",), batch)
    return first, batch, versions_planned([V1], first, ("id",)), versions_planned([V1, V2], batch, ("id",))


@pytest.mark.parametrize("case", ["key change keeping TOAST", "two schema versions"])
def test_a_lake_takes_a_batch_netted_in_partitions_as_spark_applies_it(spark, case, tmp_path, monkeypatch) -> None:
    """Netted in key partitions (a bound of 3 changes): an inserted row keeping a column needs the target's rows
    (Spark's ordered changes), so Spark applies it and nothing is streamed from a spill file; two schema versions
    are streamed from the partitions' spill files in their union's columns. Either way no spill file is left, and
    each lake ends as Spark's alone leaves it."""
    seed, batch, seed_table, table = _over_bounds(case, tmp_path / "stage")
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv(partitioned.SPILL_SWITCH, str(spill))
    monkeypatch.setenv(direct.ROWS_SWITCH, "3")
    found = direct.batch_files(table, batch, None)
    assert found is not None and found.partitions > 1
    assert (found.union is None) == (case == "key change keeping TOAST")
    routes: list[bool] = []
    real = lake_parts.spilled

    @contextlib.contextmanager
    def noted(net: DirectNet, columns: Sequence[str]) -> Iterator[lake_parts.SpilledNet]:
        with real(net, columns) as parts:
            routes.append(parts.summary.needs_collected)
            yield parts

    def streamed(*_: object) -> object:
        pytest.fail("net rows streamed from a spill file")

    monkeypatch.setattr(lake_parts, "spilled", noted)
    streams: list[str] = []  # the switch of each run that streamed net rows from the spill files
    if case == "key change keeping TOAST":
        monkeypatch.setattr(lake_parts.SpilledNet, "pieces", streamed)
        monkeypatch.setattr(lake_parts.SpilledNet, "buckets", streamed)
    else:
        def counting(real: Any) -> Any:
            def counted(self: lake_parts.SpilledNet, n: int) -> Iterator[pa.Table]:
                streams.append(os.environ[direct.ENV_SWITCH])
                return real(self, n)
            return counted

        for method in ("pieces", "buckets"):
            monkeypatch.setattr(lake_parts.SpilledNet, method, counting(getattr(lake_parts.SpilledNet, method)))
    runs = _both_ways(spark, tmp_path, monkeypatch, [(seed, seed_table), (batch, table)])
    for name in ("delta", "iceberg"):
        got = {switch: (_lake_rows(target, table.target), target.watermark(table.target))
               for switch, (target, _) in runs[name].items()}
        assert got["1"] == got["0"] and got["0"][1] == 0x3000, (name, got)
        if case == "two schema versions":  # streamed from the spill files, no Spark at all
            assert not runs[name]["1"][1] and streams and set(streams) == {"1"}, (name, streams)
        if case == "key change keeping TOAST":
            assert (5, 12, "n2") in got["0"][0]  # the moved row keeps the old row's note
    assert routes == ([True, True] if case == "key change keeping TOAST" else [False, False])
    assert list(spill.iterdir()) == []


FULL = Rel("public", "v", (Col("id", pa.int64(), "bigint", True), Col("w", pa.int32(), "integer")),
           replica_identity="f")
ADDED = replace(FULL, columns=(*FULL.columns, Col("f", pa.int32(), "integer", missing="{5}")), version=2)


def test_a_lake_takes_a_whole_batch_filtered_on_a_column_added_with_a_default_as_spark_applies_it(
        spark, tmp_path, monkeypatch) -> None:
    """Read whole (the default row bound), ``row_filter: "f = 5"`` over ``f`` added with ``DEFAULT 5``: the DELETE
    and the UPDATE staged before the ``ADD COLUMN`` read 5 in their full old images as on the source, so row 1 is
    left out and row 2 written holding the default, in process as by Spark. An Arrow overflow as the versions are
    conformed is the typed error whose way out is Spark."""
    root = tmp_path / "stage"
    write_batch(root, "slot", BatchSpec(0x2000, 0x3000, {
        FULL: [Chg("I", 1, n, new={"id": n, "w": n}) for n in (1, 2)]
        + [Chg("D", 2, 0, old={"id": 1, "w": 1}), Chg("U", 2, 1, old={"id": 2, "w": 2}, new={"id": 2, "w": 3})],
        ADDED: [Chg("I", 4, 0, new={"id": 3, "w": 3, "f": 5})]}))
    (batch,) = list_batches(str(root), "slot")
    table = versions_planned([FULL, ADDED], batch, ("id",), TableApplyConfig(row_filter="f = 5"))
    net = direct.batch_files(table, batch, None)
    assert net is not None and net.compacted and net.union is not None and net.partitions == 1
    with monkeypatch.context() as patch:
        def overflowing(*_: object) -> pa.Array:  # what an image column of 2 GiB or more raises as it is combined
            raise pa.ArrowInvalid("offset overflow while concatenating arrays")

        patch.setattr(versions, "_image", overflowing)
        with pytest.raises(ApplyError, match=r"PGLOGICAL_APPLY_INPROCESS_ROWS=0 to net such table-batches with Spark$"):
            lake_direct.net_table(net)
    runs = _both_ways(spark, tmp_path, monkeypatch, [(batch, table)])
    for name in ("delta", "iceberg"):
        got = {switch: _lake_rows(target, table.target) for switch, (target, _) in runs[name].items()}
        assert got["1"] == got["0"] == [(5, 2, 3), (5, 3, 3)], (name, got)
        assert [runs[name][switch][1] for switch in ("1", "0")] == [False, True], name  # whether Spark started
