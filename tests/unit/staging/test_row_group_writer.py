"""Row groups written on a background thread (same files as inline, failures raised in the caller), and
row changes handed to their sink a run at a time (same files as one add per row)."""

from __future__ import annotations

import dataclasses
import struct
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding import ChangeAssembler, SpilledChanges
from airflow_provider_pglogical.decoding.model import (
    ColumnDef,
    RelationSchema,
    RowChange,
    Transaction,
    TruncateChange,
    TupleData,
)
from airflow_provider_pglogical.decoding.values import RowImageConverter
from airflow_provider_pglogical.staging import StagingLayout, StagingReader
from airflow_provider_pglogical.staging import schema as S
from airflow_provider_pglogical.staging.writer import BatchWriter, RowGroupWriter

REL = RelationSchema(16384, "public", "t", "d", (ColumnDef("id", 23, -1, True), ColumnDef("body", 25, -1, False)))
OTHER = RelationSchema(16385, "public", "u", "d", (ColumnDef("id", 23, -1, True), ColumnDef("body", 25, -1, False)))


class Resolver:
    def converter(self, relation):
        return RowImageConverter(relation)

    def type_names(self, relation):
        return ["integer", "text"]


def img(i: int) -> TupleData:
    return TupleData("bb", (struct.pack("!i", i), f"body {i}".encode()))


def transactions(n: int = 12, rows: int = 9) -> list[Transaction]:
    out = []
    for t in range(1, n + 1):
        changes = [RowChange("I", REL if k % 3 else OTHER, 1000 * t - 20 + k, None, img(100 * t + k))
                   for k in range(rows)]
        out.append(Transaction(xid=700 + t, commit_lsn=1000 * t, end_lsn=1000 * t + 8, commit_time_us=10**12 + t,
                               changes=tuple(changes)))
    return out


def write(root, *, background: bool) -> BatchWriter:
    w = BatchWriter(StagingLayout.from_uri(str(root), "s"), start_lsn=10, slot="s", publication="p",
                    resolver=Resolver(), row_group_rows=5, background_writes=background)
    for tx in transactions():
        w.write_transaction(tx)
    return w


def test_the_thread_writes_in_submission_order_and_wait_raises_the_first_failure():
    done: list[int] = []
    pool = RowGroupWriter(depth=1)
    threads = set()

    def job(i: int):
        def run() -> None:
            threads.add(threading.current_thread().name)
            if i in (3, 5):
                raise OSError(f"disk full at {i}")
            done.append(i)
        return run

    for i in range(3):
        pool.submit(job(i))
    pool.wait()
    assert done == [0, 1, 2] and threads == {"pglogical-row-groups"}
    for i in range(3, 7):
        try:
            pool.submit(job(i))
        except OSError as exc:  # the failure of 3 may already be known at a later submit
            assert "at 3" in str(exc)
            break
    with pytest.raises(OSError, match="disk full at 3"):
        pool.wait()
    assert done == [0, 1, 2]  # nothing after the failure was written


def test_background_writes_give_the_same_bytes_as_inline_writes(tmp_path):
    paths = []
    for name, background in (("inline", False), ("thread", True)):
        w = write(tmp_path / name, background=background)
        paths.append(w.finish_files())
        w.publish({"format": 1, "relations": [], "types": []})
    for rel in ("tables/public.t/v1.parquet", "tables/public.u/v1.parquet", "transactions.parquet"):
        a, b = (open(f"{p}/{rel}", "rb").read() for p in paths)
        assert a == b, rel
    f = pq.ParquetFile(f"{paths[1]}/tables/public.t/v1.parquet")
    assert f.metadata.num_rows == 72 and f.metadata.num_row_groups == 15


def test_a_failed_background_write_surfaces_and_nothing_is_published(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = pq.ParquetWriter.write_table

    def failing(self, table, row_group_size=None):
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError("No space left on device")
        return real(self, table, row_group_size=row_group_size)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    layout = StagingLayout.from_uri(str(tmp_path), "s")
    w = BatchWriter(layout, start_lsn=10, slot="s", publication="p", resolver=Resolver(), row_group_rows=5)
    with pytest.raises(OSError, match="No space left"):
        for tx in transactions():
            w.write_transaction(tx)
        w.finish_files()
        pytest.fail("finish_files must raise the background failure")  # pragma: no cover
    w.abort()
    assert StagingReader(layout).batches() == []
    assert not layout.exists(w.dir)


def _per_row(self, tx):
    """The reference for ``BatchWriter.write_transaction``: one ``add`` per row change (the code before runs)."""
    time = S.to_unix_us(tx.commit_time_us)
    tx_fields = (tx.commit_lsn, tx.end_lsn, tx.xid, time)
    order = -1
    for order, change in enumerate(tx.changes):
        if type(change) is RowChange:
            self._note_relation(change.relation, change.lsn)
            self._table_sink(change.relation).add(tx_fields, order, change)
        else:
            self._write_other(tx, (tx.commit_lsn, tx.end_lsn), time, order, change)
    self.changes += order + 1
    self._transactions.append(tx.xid, tx.commit_lsn, tx.end_lsn, time, tx.origin, tx.origin_lsn, order + 1,
                              tx.streamed)
    self.manifest.transactions += 1
    self.manifest.end_lsn_int = tx.end_lsn


def _files(path: str) -> dict[str, bytes]:
    root = Path(path)
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*.parquet"))}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.lists(st.sampled_from("rrroT"), min_size=0, max_size=40), row_group_rows=st.integers(1, 7),
       txs=st.integers(1, 3))
def test_runs_of_row_changes_stage_exactly_what_one_add_per_row_stages(tmp_path_factory, layout, row_group_rows, txs):
    """write_transaction hands runs of one relation's changes to ``add_run``: same files, byte for byte,
    as one ``add`` per row change, whatever the mix of relations, truncates and messages and the row-group size."""
    out = []
    for name, per_row in (("runs", False), ("rows", True)):
        root = tmp_path_factory.mktemp(name)
        with pytest.MonkeyPatch.context() as mp:
            if per_row:
                mp.setattr(BatchWriter, "write_transaction", _per_row)
            w = BatchWriter(StagingLayout.from_uri(str(root), "s"), start_lsn=10, slot="s", publication="p",
                            resolver=Resolver(), row_group_rows=row_group_rows)
            for t in range(1, txs + 1):
                changes = []
                for k, kind in enumerate(layout):
                    lsn = 1000 * t + k
                    if kind == "r":
                        changes.append(RowChange("I", REL, lsn, None, img(100 * t + k)))
                    elif kind == "o":
                        changes.append(RowChange("D", OTHER, lsn, img(100 * t + k), None, True))
                    elif kind == "T":
                        changes.append(TruncateChange(lsn, (REL,), False, False))
                w.write_transaction(Transaction(xid=700 + t, commit_lsn=1000 * t + 500, end_lsn=1000 * t + 508,
                                                commit_time_us=10**12 + t, changes=tuple(changes)))
            assert w.changes == txs * len(layout)
            out.append(_files(w.finish_files()))
    assert out[0] == out[1]
    for name, data in out[0].items():  # a row change's tx_order is its place in the transaction (lsn - 1000 t)
        if name.startswith("tables/"):
            t = pq.read_table(pa.BufferReader(data)).to_pydict()
            assert t["tx_order"] == [lsn - c + 500 for lsn, c in zip(t["lsn"], t["commit_lsn"], strict=True)]


def test_a_spilled_transaction_stages_the_same_files_as_the_same_changes_in_memory(tmp_path):
    """A spilled transaction reaches the writer a spill slice at a time (SpilledChanges.chunks), with a
    schema change, a truncate and a message inside the spilled part: same files as its changes held in a tuple."""
    from tests.support import wire as w

    narrow = w.relation(1, "t", w.T_COLUMNS)
    wide = w.relation(1, "t", w.T_COLUMNS + [("extra", w.INT4, -1, 0)])
    rows, n = [w.begin(0x90000, 7), narrow], 3000
    for i in range(n):
        cols = [w.int4(i), ("b", ("v" * (i % 50)).encode())] + ([w.int4(-i)] if i > n // 2 else [])
        rows.append(w.insert(1, w.tup(*cols)))
        if i == n // 2:
            rows += [wide, w.truncate([1], 1), w.message("p", b"mid", transactional=True)]
        if i % 7 == 0:
            rows.append(w.delete(1, w.tup(w.int4(i), ("n",), *([("n",)] if i > n // 2 else [])), "K"))
    rows.append(w.commit(0x90000, 0x90100))
    paths = []
    with ChangeAssembler(memory_budget=300, spill_dir=tmp_path) as asm:
        [tx] = [e for i, r in enumerate(rows) if (e := asm.feed(0x100 + i, 7, r)) is not None]
        assert isinstance(tx.changes, SpilledChanges) and len(list(tx.changes.chunks())) >= 2
        for name, changes in (("spilled", tx.changes), ("tuple", tuple(tx.changes))):
            w = BatchWriter(StagingLayout.from_uri(str(tmp_path / name), "s"), start_lsn=10, slot="s",
                            publication="p", resolver=WireResolver(), row_group_rows=1000)
            w.write_transaction(dataclasses.replace(tx, changes=changes))
            assert w.changes == len(tx.changes)
            paths.append(w.finish_files())
    files = [_files(p) for p in paths]
    assert files[0] == files[1] and {"tables/public.t/v1.parquet", "tables/public.t/v2.parquet", "truncates.parquet",
                                     "messages.parquet"} <= set(files[0])


class WireResolver(Resolver):
    def type_names(self, relation):
        return [None] * len(relation.columns)
