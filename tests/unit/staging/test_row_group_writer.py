"""Row groups written on a background thread: same files as writing inline, failures raised in the caller."""

from __future__ import annotations

import struct
import threading

import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.decoding.model import ColumnDef, RelationSchema, RowChange, Transaction, TupleData
from airflow_provider_pglogical.decoding.values import RowImageConverter
from airflow_provider_pglogical.staging import StagingLayout, StagingReader
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
