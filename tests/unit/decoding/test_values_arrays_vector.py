"""The vectorised array path (``ArrayCodec.arrow_column``) gives exactly what the per-value path gives."""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding.values import TypeCatalog
from airflow_provider_pglogical.decoding.values import oids as O
from airflow_provider_pglogical.decoding.values.arrays import ArrayCodec
from airflow_provider_pglogical.decoding.values.arrow import RowImageConverter
from airflow_provider_pglogical.decoding.values.codec import Notes
from airflow_provider_pglogical.decoding.values.registry import codec_for
from airflow_provider_pglogical.decoding.values.vector import Column
from airflow_provider_pglogical.exceptions import DecodeError

# array type OID → (element OID, strategy of element binary values)
ELEMENTS: dict[int, tuple[int, st.SearchStrategy[bytes]]] = {
    1007: (O.INT4, st.integers(-2**31, 2**31 - 1).map(lambda v: struct.pack("!i", v))),
    1016: (O.INT8, st.integers(-2**63, 2**63 - 1).map(lambda v: struct.pack("!q", v))),
    1022: (O.FLOAT8, st.floats(allow_nan=False).map(lambda v: struct.pack("!d", v))),
    1009: (O.TEXT, st.text(max_size=8).map(str.encode)),
    1000: (O.BOOL, st.booleans().map(lambda b: b"\x01" if b else b"\x00")),
    1185: (O.TIMESTAMPTZ, st.integers(-2**40, 2**40).map(lambda v: struct.pack("!q", v))),
}


def array_bin(elem_oid: int, dims: list[tuple[int, int]], elems: list[bytes | None]) -> bytes:
    out = struct.pack("!iiI", len(dims), int(None in elems), elem_oid)
    out += b"".join(struct.pack("!ii", d, lb) for d, lb in dims)
    return out + b"".join(struct.pack("!i", -1) if e is None else struct.pack("!i", len(e)) + e for e in elems)


@st.composite
def array_values(draw: Any, elem_oid: int, elements: st.SearchStrategy[bytes]) -> bytes:
    """Mostly 1-D arrays from 1 (empty ones, NULL elements), sometimes other bounds or two dimensions."""
    shape = draw(st.sampled_from(["1d"] * 6 + ["empty", "lb", "2d"]))
    elem = st.one_of(st.none(), elements)
    if shape == "empty":
        return array_bin(elem_oid, [], [])
    if shape == "2d":
        a, b = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        return array_bin(elem_oid, [(a, 1), (b, 1)], draw(st.lists(elem, min_size=a * b, max_size=a * b)))
    items = draw(st.lists(elem, max_size=6))
    lower = draw(st.integers(-3, 3)) if shape == "lb" else 1
    return array_bin(elem_oid, [(len(items), lower)] if items else [], items)


def per_value(codec: ArrayCodec, col: Column) -> tuple[pa.Array, dict[int, Notes]]:
    """What the converter does for a codec without a vectorised path."""
    notes: dict[int, Notes] = {}
    values = []
    for i, (kind, raw) in enumerate(zip(col.kinds_str(), col.raws(), strict=True)):
        row: Notes = {}
        values.append(None if raw is None else codec.arrow(kind, raw, row, "c"))
        if row:
            notes[i] = row
    return pa.array(values, type=codec.arrow_type), notes


def column(raws: list[bytes | None]) -> Column:
    return Column.from_raws("".join("n" if r is None else "b" for r in raws), raws)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), array_oid=st.sampled_from(sorted(ELEMENTS)))
def test_vectorised_arrays_equal_the_per_value_path(data, array_oid):
    elem_oid, elements = ELEMENTS[array_oid]
    raws = data.draw(st.lists(st.one_of(st.none(), array_values(elem_oid, elements)), max_size=30))
    codec = codec_for(array_oid, -1, TypeCatalog())
    assert isinstance(codec, ArrayCodec)
    col = column(raws)
    notes: dict[int, Notes] = {}
    got = RowImageConverter._column("c", codec, col, notes)
    want, want_notes = per_value(codec, col)
    assert got.type == want.type
    assert got.equals(want)
    assert got.to_pylist() == want.to_pylist()
    assert notes == want_notes


@settings(max_examples=150, deadline=None)
@given(data=st.data(), array_oid=st.sampled_from(sorted(ELEMENTS)))
def test_a_damaged_array_in_a_column_raises_decode_error_like_the_per_value_path(data, array_oid):
    elem_oid, elements = ELEMENTS[array_oid]
    raws: list[bytes | None] = data.draw(st.lists(array_values(elem_oid, elements), min_size=1, max_size=8))
    i = data.draw(st.integers(0, len(raws) - 1))
    value = raws[i]
    assert value is not None
    cut = data.draw(st.integers(0, len(value) + 2))
    raws[i] = value[:cut] + data.draw(st.binary(max_size=3))  # truncated, extended or rewritten tail
    codec = codec_for(array_oid, -1, TypeCatalog())
    assert isinstance(codec, ArrayCodec)
    col = column(raws)
    try:
        want: pa.Array | None = per_value(codec, col)[0]
    except DecodeError:
        want = None
    if want is None:
        with pytest.raises(DecodeError):
            RowImageConverter._column("c", codec, col, {})
    else:
        assert RowImageConverter._column("c", codec, col, {}).equals(want)


def test_the_vectorised_path_takes_1d_arrays_and_leaves_shaped_ones_to_the_per_value_path():
    codec = codec_for(1007, -1, TypeCatalog())
    assert isinstance(codec, ArrayCodec)
    one = [array_bin(O.INT4, [(2, 1)], [struct.pack("!i", 1), None]), None, array_bin(O.INT4, [], [])]
    got = codec.arrow_column(column(one))
    assert got is not None and got.to_pylist() == [[1, None], None, []]
    shaped = one + [array_bin(O.INT4, [(1, 0)], [struct.pack("!i", 5)])]
    assert codec.arrow_column(column(shaped)) is None  # lower bound 0 needs a shape note
    notes: dict[int, Notes] = {}
    assert RowImageConverter._column("c", codec, column(shaped), notes).to_pylist() == [[1, None], None, [], [5]]
    assert notes == {3: {"c": "[0:0]"}}
