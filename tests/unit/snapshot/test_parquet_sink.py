"""The snapshot reader's Parquet sink writes each row group on a thread of its own while the next one is read:
the file holds the rows the converter gives for all of them, in the row groups ``write`` cuts, and a failed
background write fails the chunk with nothing published."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import fs as pafs

from airflow_provider_pglogical.decoding.values import RowImageConverter, TypeCatalog
from airflow_provider_pglogical.snapshot.copier import ChunkTask, _ParquetSink, relation_schema
from airflow_provider_pglogical.snapshot.copyframe import SIGNATURE, TRAILER, frame_copy_block, join_rows
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
    expected = converter.convert_framed(frame_copy_block(data, sizes, 3), len(rows)).array
    assert got.column("new").combine_chunks().equals(expected)
    assert got.column("tx_order").to_pylist() == list(range(len(rows)))
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
