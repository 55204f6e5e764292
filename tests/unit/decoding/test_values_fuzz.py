"""Property tests: any bytes into any codec either decode or raise DecodeError — nothing else."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding.model import ColumnDef, RelationSchema, TupleData
from airflow_provider_pglogical.decoding.values import RowImageConverter, TypeCatalog, UserType, decode_value
from airflow_provider_pglogical.decoding.values import oids as O
from airflow_provider_pglogical.decoding.values.interval import parse_interval
from airflow_provider_pglogical.exceptions import DecodeError

CATALOG = TypeCatalog([
    UserType(16400, "composite", "public.c", field_names=("a", "b"), field_oids=(O.INT4, 1009), field_typmods=(-1, -1)),
    UserType(16401, "range", "public.r", subtype_oid=O.NUMERIC),
])
NUMERIC_12_2 = ((12 << 16) | 2) + 4
TYPES = sorted({*O.ARRAY_ELEMENT, *O.ARRAY_ELEMENT.values(), *O.RANGE_SUBTYPE, *O.MULTIRANGE_RANGE}) + [16400, 16401]
COLUMNS = [ColumnDef("c", oid, -1, False) for oid in TYPES] + [ColumnDef("c", O.NUMERIC, NUMERIC_12_2, False),
                                                               ColumnDef("c", 1231, NUMERIC_12_2, False)]
columns = st.sampled_from(COLUMNS)


def _decode_or_decode_error(kind: str, raw: bytes, column: ColumnDef) -> None:
    try:
        decode_value(kind, raw, column, CATALOG)
    except DecodeError:
        pass
    try:
        RowImageConverter(RelationSchema(1, "s", "t", "d", (column,)), CATALOG).to_arrow([TupleData(kind, (raw,))])
    except DecodeError:
        pass


@settings(max_examples=1500, deadline=None)
@given(column=columns, raw=st.binary(max_size=64))
def test_random_binary_values_decode_or_raise_decode_error(column, raw):
    _decode_or_decode_error("b", raw, column)



@settings(max_examples=800, deadline=None)
@given(column=columns, head=st.sampled_from([
    struct.pack("!iiI", 1, 0, 23) + struct.pack("!ii", 2, 1), struct.pack("!iiI", 2, 1, 25) + struct.pack("!iiii", 1, 1, 2, 0),
    struct.pack("!hhHh", 2, 0, 0, 2), struct.pack("!i", 2), b"\x02", b"\x12", struct.pack("!i", 8),
]), tail=st.binary(max_size=40))
def test_plausible_headers_with_random_bodies_decode_or_raise_decode_error(column, head, tail):
    _decode_or_decode_error("b", head + tail, column)


@settings(max_examples=1500, deadline=None)
@given(column=columns, text=st.text(alphabet=st.sampled_from(list('{}[](),"\\ 01-9:.+eNaIfinty BCx/')), max_size=30))
def test_random_text_values_decode_or_raise_decode_error(column, text):
    _decode_or_decode_error("t", text.encode(), column)


@given(st.text(max_size=40))
def test_interval_parser_never_raises_anything_but_decode_error(text):
    try:
        parse_interval(text)
    except DecodeError:
        pass
