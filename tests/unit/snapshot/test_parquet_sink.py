"""The snapshot reader's Parquet sink writes each row group on a thread of its own while the next one is read:
the file holds the rows the converter gives for all of them, in the row groups ``write`` cuts, and a failed
background write fails the chunk with nothing published."""

from __future__ import annotations

import struct
import tempfile
from concurrent.futures import Future
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import fs as pafs

from airflow_provider_pglogical.decoding.values import RowImageConverter, TypeCatalog
from airflow_provider_pglogical.snapshot.copier import ChunkTask, _ParquetSink, relation_schema
from airflow_provider_pglogical.snapshot.copyframe import SIGNATURE, TRAILER, frame_copy_block, join_rows
from airflow_provider_pglogical.staging import schema as S
from tests.unit.snapshot.test_copyframe import copy_row, encode, row_values

RELATION = {"relid": 1, "schema": "public", "table": "t", "replica_identity": "d",
            "columns": [{"name": "id", "type_oid": 20, "type_modifier": -1, "is_identity": True},
                        {"name": "v", "type_oid": 25, "type_modifier": -1, "is_identity": False},
                        {"name": "f", "type_oid": 701, "type_modifier": -1, "is_identity": False}]}
HEADER = SIGNATURE + struct.pack(">ii", 0, 0)


def task(path: str, rows_per_group: int) -> ChunkTask:
    return ChunkTask(dsn="", snapshot_name="", lsn=0x1000, table="public.t", relation=RELATION, copy_sql="",
                     staging_uri="", path=path, index=0, commit_time_us=1, row_group_rows=rows_per_group)


def messages(rows: list[tuple]) -> list[bytes]:
    """The CopyData messages of a binary COPY of ``rows``: the header rides on the first row, the trailer alone."""
    out = [copy_row(encode(r)) for r in rows]
    out[0] = HEADER + out[0]
    return [*out, TRAILER]


def reference_table(converter: RowImageConverter, new: pa.StructArray) -> pa.Table:
    """What a snapshot chunk of ``new``'s rows stages, built value by value with ``pa.array`` (the reference for the
    sink's columns built from buffers): every row an insert at the sync LSN, in COPY order, with no old image."""
    n, lsn = len(new), 0x1000
    schema = S.row_change_schema(converter.arrow_type)
    values = {"commit_lsn": [lsn] * n, "end_lsn": [lsn] * n, "lsn": [lsn] * n, "tx_order": list(range(n)),
              "xid": [0] * n, "commit_time": [1] * n, "op": ["I"] * n, "schema_version": [1] * n, "old": [None] * n,
              "old_key_only": [False] * n, "new_unchanged_toast": [[]] * n, "old_value_notes": [[]] * n,
              "new_value_notes": [[]] * n}
    return pa.table([new if f.name == "new" else pa.array(values[f.name], type=f.type) for f in schema],
                    schema=schema)


@settings(max_examples=60, deadline=None)
@given(st.lists(row_values, min_size=1, max_size=60), st.integers(1, 9))
def test_the_staged_file_holds_every_row_in_the_row_groups_write_cuts(rows, per_group):
    converter = RowImageConverter(relation_schema(RELATION), TypeCatalog())
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/chunks/c00000.parquet"
        sink = _ParquetSink(task(path, per_group), converter, pafs.LocalFileSystem())
        for message in messages(rows):
            sink.write(message)
        sink.close()
        staged = pq.ParquetFile(path)
        groups = [staged.metadata.row_group(i).num_rows for i in range(staged.metadata.num_row_groups)]
        got = staged.read()
        assert not list(Path(tmp, "chunks").glob("_tmp-*"))
    data, sizes = join_rows([copy_row(encode(r)) for r in rows])
    new = converter.convert_framed(frame_copy_block(data, sizes, 3), len(rows)).array
    reference = reference_table(converter, new)
    assert got.schema.names == reference.schema.names
    for name in reference.schema.names:  # every column, built by ``pa.array`` from Python values
        assert got.column(name).equals(reference.column(name)), name
    # ``write`` cuts a group every ``per_group`` messages; the trailer rides in the last group's count
    full, rest = divmod(len(rows) + 1, per_group)
    assert sum(groups) == len(rows) and groups[:full - (rest == 0)] == [per_group] * (full - (rest == 0))


class _FullAfterMagic(MemoryFileSystem):
    """A file system whose chunk files take their 4-byte magic, then fail as a full disk does."""

    def _open(self, path: str, mode: str = "rb", **kwargs: object) -> MemoryFile:
        f = super()._open(path, mode, **kwargs)
        if "w" in mode:
            write = f.write

            def failing(data: bytes) -> int:
                if f.tell() >= 4:
                    raise OSError(28, "No space left on device")
                return int(write(data))

            f.write = failing
        return f


def test_a_failed_background_write_fails_the_chunk_and_leaves_no_file():
    memory = _FullAfterMagic()
    fs = pafs.PyFileSystem(pafs.FSSpecHandler(memory))
    path = "/sink-failure/chunks/c00000.parquet"
    converter = RowImageConverter(relation_schema(RELATION), TypeCatalog())
    sink = _ParquetSink(task(path, 2), converter, fs)
    with pytest.raises(OSError, match="No space left"):
        for message in messages([(i, "v", 1.0) for i in range(7)]):
            sink.write(message)
        sink.close()
    sink.abort()
    assert not memory.exists(path)
    assert not memory.exists("/sink-failure/chunks/_tmp-c00000.parquet")


def test_the_last_row_group_failing_in_close_fails_the_chunk_and_leaves_no_file():
    """The only row group is written from ``close()``: its error must be raised there, before the rename (pyarrow's
    ``ParquetWriter.close()`` returns normally after a failed write, which would publish a truncated file)."""
    memory = _FullAfterMagic()
    fs = pafs.PyFileSystem(pafs.FSSpecHandler(memory))
    path = "/close-failure/chunks/c00000.parquet"
    sink = _ParquetSink(task(path, 100), RowImageConverter(relation_schema(RELATION), TypeCatalog()), fs)
    for message in messages([(i, "v", 1.0) for i in range(3)]):
        sink.write(message)
    with pytest.raises(OSError, match="No space left"):
        sink.close()
    sink.abort()
    assert not memory.exists(path)
    assert not memory.exists("/close-failure/chunks/_tmp-c00000.parquet")


def started_sink(tmp_path: Path) -> tuple[_ParquetSink, Path]:
    """A sink whose temporary file exists (two row groups written); the temporary file's path."""
    path = tmp_path / "chunks" / "c00000.parquet"
    sink = _ParquetSink(task(str(path), 2), RowImageConverter(relation_schema(RELATION), TypeCatalog()),
                        pafs.LocalFileSystem())
    for message in messages([(i, "v", 1.0) for i in range(4)])[:-1]:
        sink.write(message)
    sink._wait()
    return sink, tmp_path / "chunks" / "_tmp-c00000.parquet"


def test_abort_deletes_the_temporary_file_when_closing_the_writer_fails(tmp_path):
    sink, tmp = started_sink(tmp_path)
    assert tmp.exists()
    writer = sink.writer

    class FailingClose:
        def close(self) -> None:
            writer.close()
            raise OSError(5, "Input/output error")

    sink.writer = FailingClose()  # type: ignore[assignment]
    sink.abort()  # cleanup never masks the chunk's own error
    assert not tmp.exists()


def test_abort_deletes_the_temporary_file_when_interrupted_again_while_waiting(tmp_path):
    """A second Ctrl-C while abort waits for the row group in writing: the interrupt goes on, the file is gone."""
    sink, tmp = started_sink(tmp_path)
    interrupted: Future[None] = Future()
    interrupted.set_exception(KeyboardInterrupt())
    sink.writing = interrupted
    with pytest.raises(KeyboardInterrupt):
        sink.abort()
    assert not tmp.exists()
    assert sink.background._shutdown
