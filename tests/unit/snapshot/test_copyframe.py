"""Binary COPY rows frame into the decoder's columns: same Arrow values as pgoutput binary tuples."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding.model import ColumnDef, RelationSchema, TupleData
from airflow_provider_pglogical.decoding.values import RowImageConverter, oids
from airflow_provider_pglogical.exceptions import DecodeError
from airflow_provider_pglogical.snapshot.copyframe import SIGNATURE, TRAILER, frame_copy_block, header_length, join_rows
from airflow_provider_pglogical.snapshot.run import plan_chunks
from airflow_provider_pglogical.snapshot.source import TableRead

REL = RelationSchema(1, "public", "t", "d", (ColumnDef("id", oids.INT8, -1, True), ColumnDef("v", oids.TEXT, -1, False),
                                              ColumnDef("f", oids.FLOAT8, -1, False)))


def copy_row(values: list[bytes | None]) -> bytes:
    parts = [struct.pack(">h", len(values))]
    for v in values:
        parts.append(struct.pack(">i", -1) if v is None else struct.pack(">i", len(v)) + v)
    return b"".join(parts)


row_values = st.tuples(st.integers(-2**63, 2**63 - 1), st.one_of(st.none(), st.text(max_size=20)),
                       st.one_of(st.none(), st.floats(allow_nan=False)))


def encode(row: tuple) -> list[bytes | None]:
    i, v, f = row
    return [struct.pack(">q", i), None if v is None else v.encode(), None if f is None else struct.pack(">d", f)]


@settings(deadline=None)
@given(st.lists(row_values, min_size=1, max_size=40))
def test_copy_rows_convert_like_pgoutput_tuples(rows):
    conv = RowImageConverter(REL)
    raw = [encode(r) for r in rows]
    framed = frame_copy_block(*join_rows([copy_row(r) for r in raw]), 3)
    got = conv.convert_framed(framed, len(rows))
    tuples = [TupleData("".join("n" if x is None else "b" for x in r), tuple(r)) for r in raw]
    expected = conv.convert(tuples)
    assert got.array.equals(expected.array)
    assert got.array.to_pylist() == [{"id": i, "v": v, "f": f} for i, v, f in rows]
    assert got.unchanged.to_pylist() == [[]] * len(rows)


def test_header_and_trailer():
    first = SIGNATURE + struct.pack(">ii", 0, 0) + copy_row([b"\0" * 8, None, None])
    assert first[header_length(first):] == copy_row([b"\0" * 8, None, None])
    assert TRAILER == struct.pack(">h", -1)
    with pytest.raises(DecodeError):
        header_length(b"not a copy header at all")
    with pytest.raises(DecodeError):
        header_length(SIGNATURE + struct.pack(">ii", 1 << 16, 0))


@pytest.mark.parametrize("row", [
    copy_row([b"\0" * 8, b"x"]),                      # too few fields
    copy_row([b"\0" * 8, b"x", b"\0" * 8]) + b"!",    # trailing byte
    copy_row([b"\0" * 8, b"x", b"\0" * 8])[:-1],      # short
    struct.pack(">h", 3) + struct.pack(">i", -5),     # negative length other than -1
])
def test_malformed_rows_raise(row):
    with pytest.raises(DecodeError):
        frame_copy_block(*join_rows([copy_row([b"\0" * 8, None, None]), row]), 3)


def test_chunk_plan_covers_every_page_once():
    read = TableRead("public.t", 1, "public", "t", "d", (), None, heap_bytes=8192 * 1000, block_size=8192)
    chunks = plan_chunks(read, 8192 * 300)
    assert chunks == [(0, 300), (300, 600), (600, 900), (900, None)]
    assert plan_chunks(read, 8192 * 5000) == [None]
    sql = read.select_sql((300, 600))
    assert "ctid" in repr(sql)
