"""Arrays, ranges, multiranges, composites, enums, domains and the TypeCatalog."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_provider_pglogical.decoding.model import ColumnDef, RelationSchema, TupleData, TypeInfo
from airflow_provider_pglogical.decoding.values import (
    INFINITY,
    PgArray,
    Range,
    RowImageConverter,
    TypeCatalog,
    UserType,
    arrow_type_for,
    decode_value,
)
from airflow_provider_pglogical.decoding.values import oids as O
from airflow_provider_pglogical.exceptions import DecodeError

INT4_ARRAY, TEXT_ARRAY, NUMERIC_ARRAY = 1007, 1009, 1231
MOOD, POSINT, ADDR, FLOATRANGE, MOOD_ARRAY, PRICE = 16400, 16401, 16402, 16403, 16404, 16405
CATALOG = TypeCatalog([
    UserType(MOOD, "enum", "public.mood", labels=("sad", "ok")),
    UserType(POSINT, "domain", "public.posint", base_oid=O.INT4),
    UserType(PRICE, "domain", "public.price", base_oid=O.NUMERIC, base_typmod=((10 << 16) | 2) + 4),
    UserType(ADDR, "composite", "public.addr", field_names=("street", "zip", "tags"),
             field_oids=(O.TEXT, O.INT4, TEXT_ARRAY), field_typmods=(-1, -1, -1)),
    UserType(FLOATRANGE, "range", "public.floatrange", subtype_oid=O.FLOAT8),
    UserType(MOOD_ARRAY, "array", "public._mood", element_oid=MOOD),
])


def col(oid: int, typmod: int = -1) -> ColumnDef:
    return ColumnDef("c", oid, typmod, False)


def dec(oid: int, kind: str, raw: bytes | str, typmod: int = -1):
    return decode_value(kind, raw.encode() if isinstance(raw, str) else raw, col(oid, typmod), CATALOG)


def arrow_notes(oid: int, kind: str, raw: bytes | str, typmod: int = -1):
    conv = RowImageConverter(RelationSchema(1, "s", "t", "d", (col(oid, typmod),)), CATALOG)
    arr, notes = conv.to_arrow_with_notes([TupleData(kind, (raw.encode() if isinstance(raw, str) else raw,))])
    return arr.field(0).to_pylist()[0], notes[0]


def arrow_array(oid: int, kind: str, raw: bytes | str) -> pa.Array:
    conv = RowImageConverter(RelationSchema(1, "s", "t", "d", (col(oid),)), CATALOG)
    return conv.to_arrow([TupleData(kind, (raw.encode() if isinstance(raw, str) else raw,))]).field(0)


def array_bin(elem_oid: int, dims: list[tuple[int, int]], elems: list[bytes | None]) -> bytes:
    out = struct.pack("!iiI", len(dims), int(None in elems), elem_oid)
    out += b"".join(struct.pack("!ii", d, lb) for d, lb in dims)
    return out + b"".join(struct.pack("!i", -1) if e is None else struct.pack("!i", len(e)) + e for e in elems)


def i4(v: int) -> bytes:
    return struct.pack("!i", v)


ARRAY_CASES = [
    (array_bin(O.INT4, [], []), "{}", [], [], {}),
    (array_bin(O.INT4, [(3, 1)], [i4(1), None, i4(3)]), "{1,NULL,3}", [1, None, 3], [1, None, 3], {}),
    (array_bin(O.INT4, [(2, 1), (2, 1)], [i4(1), i4(2), i4(3), None]), "{{1,2},{3,NULL}}",
     [[1, 2], [3, None]], [1, 2, 3, None], {"c": "[1:2][1:2]"}),
    (array_bin(O.INT4, [(2, 0), (1, -2)], [i4(7), i4(8)]), "[0:1][-2:-2]={{7},{8}}",
     PgArray((0, -2), [[7], [8]]), [7, 8], {"c": "[0:1][-2:-2]"}),
    (array_bin(O.INT4, [(1, 5)], [i4(9)]), "[5:5]={9}", PgArray((5,), [9]), [9], {"c": "[5:5]"}),
]


@pytest.mark.parametrize(("raw", "text", "py", "arrow", "notes"), ARRAY_CASES)
def test_int_arrays_in_both_forms(raw, text, py, arrow, notes):
    assert dec(INT4_ARRAY, "b", raw) == py == dec(INT4_ARRAY, "t", text)
    assert arrow_notes(INT4_ARRAY, "b", raw) == (arrow, notes) == arrow_notes(INT4_ARRAY, "t", text)


def test_text_array_quoting_matches_array_out():
    text = '{"a b","with \\"quote\\"","NULL",NULL,"","back\\\\slash",plain,"{}","a,b"}'
    want = ["a b", 'with "quote"', "NULL", None, "", "back\\slash", "plain", "{}", "a,b"]
    assert dec(TEXT_ARRAY, "t", text) == want
    raw = array_bin(O.TEXT, [(len(want), 1)], [None if w is None else w.encode() for w in want])
    assert dec(TEXT_ARRAY, "b", raw) == want


def test_numeric_array_nan_elements_get_path_notes():
    tm = ((6 << 16) | 2) + 4
    value, notes = arrow_notes(NUMERIC_ARRAY, "t", "[2:3]={NaN,-1.50}", tm)
    assert value == [None, Decimal("-1.50")] and notes == {"c": "[2:3]", "c[0]": "NaN"}
    assert arrow_type_for(col(NUMERIC_ARRAY, tm)) == pa.list_(pa.decimal128(6, 2))


@pytest.mark.parametrize("text", ["{1,2", "{{1,2},{3}}", "1,2", "{1,2}x", "[1:2]={1}", '{"a}', "{,}"])
def test_malformed_array_text_raises(text):
    with pytest.raises(DecodeError):
        dec(INT4_ARRAY, "t", text)


@pytest.mark.parametrize("raw", [
    b"", struct.pack("!iiI", 7, 0, 23), struct.pack("!iiI", 1, 2, 23) + struct.pack("!ii", 1, 1) + i4(4) + i4(1),
    struct.pack("!iiI", 1, 0, 23) + struct.pack("!ii", -1, 1), struct.pack("!iiI", 1, 0, 23) + struct.pack("!ii", 2, 1) + i4(4) + i4(1),
    array_bin(O.INT4, [(1, 1)], [i4(1)]) + b"x", struct.pack("!iiI", 2, 0, 23) + struct.pack("!iiii", 60000, 1, 60000, 1),
])
def test_malformed_array_binary_raises(raw):
    with pytest.raises(DecodeError):
        dec(INT4_ARRAY, "b", raw)


def range_bin(flags: int, lower: bytes | None, upper: bytes | None) -> bytes:
    out = bytes([flags])
    for b in (lower, upper):
        if b is not None:
            out += struct.pack("!i", len(b)) + b
    return out


@pytest.mark.parametrize(("oid", "raw", "text", "want"), [
    (O.INT4RANGE, range_bin(0x02, i4(1), i4(10)), "[1,10)", Range(1, 10, True, False)),
    (O.INT4RANGE, range_bin(0x01, None, None), "empty", Range(None, None, False, False, True)),
    (O.INT4RANGE, range_bin(0x18, None, None), "(,)", Range(None, None, False, False)),
    (O.NUMRANGE, range_bin(0x04, b"\x00\x01\x00\x00\x00\x00\x00\x01\x00\x0f\xa0\x00"[:0] + struct.pack("!hhHhh", 1, 0, 0, 1, 1),
                           struct.pack("!hhHhhh", 2, 0, 0, 2, 2, 2500)), "(1.0,2.25]",
     Range(Decimal("1.0"), Decimal("2.25"), False, True)),
    (O.TSTZRANGE, range_bin(0x12, struct.pack("!q", 0), None), '["2000-01-01 00:00:00+00",)',
     Range(dt.datetime(2000, 1, 1, tzinfo=dt.UTC), None, True, False)),
    (O.DATERANGE, range_bin(0x02, i4(0), i4(2**31 - 1)), "[2000-01-01,infinity)",
     Range(dt.date(2000, 1, 1), INFINITY, True, False)),
    (FLOATRANGE, range_bin(0x02, struct.pack("!d", float("-inf")), struct.pack("!d", 0.5)), "[-Infinity,0.5)",
     Range(float("-inf"), 0.5, True, False)),
])
def test_ranges_in_both_forms(oid, raw, text, want):
    assert dec(oid, "b", raw) == want == dec(oid, "t", text)
    assert arrow_array(oid, "b", raw).equals(arrow_array(oid, "t", text))


def test_range_arrow_struct_and_multirange_list():
    value, _ = arrow_notes(O.INT4RANGE, "t", "[1,10)")
    assert value == {"lower": 1, "upper": 10, "lower_inclusive": True, "upper_inclusive": False, "empty": False}
    raw = struct.pack("!i", 2) + b"".join(struct.pack("!i", len(r)) + r for r in (
        range_bin(0x02, i4(0), i4(31)), range_bin(0x12, i4(60), None)))
    want = [Range(dt.date(2000, 1, 1), dt.date(2000, 2, 1), True, False), Range(dt.date(2000, 3, 1), None, True, False)]
    assert dec(O.DATEMULTIRANGE, "b", raw) == want == dec(O.DATEMULTIRANGE, "t", "{[2000-01-01,2000-02-01),[2000-03-01,)}")
    assert dec(O.DATEMULTIRANGE, "t", "{}") == []


@pytest.mark.parametrize("text", ["[1,2", "1,2)", "[1)", "(1,2,3)", "{[1,2)"])
def test_malformed_range_text_raises(text):
    with pytest.raises(DecodeError):
        dec(O.INT4RANGE if not text.startswith("{") else O.INT4MULTIRANGE, "t", text)


def record_bin(fields: list[tuple[int, bytes | None]]) -> bytes:
    out = struct.pack("!i", len(fields))
    for oid, b in fields:
        out += struct.pack("!I", oid) + (struct.pack("!i", -1) if b is None else struct.pack("!i", len(b)) + b)
    return out


def test_composites_in_both_forms():
    raw = record_bin([(O.TEXT, b'Main St, "1"'), (O.INT4, i4(12345)),
                      (TEXT_ARRAY, array_bin(O.TEXT, [(2, 1)], [b"x", b"y"]))])
    want = {"street": 'Main St, "1"', "zip": 12345, "tags": ["x", "y"]}
    assert dec(ADDR, "b", raw) == want == dec(ADDR, "t", '("Main St, ""1""",12345,"{x,y}")')
    assert dec(ADDR, "t", '("",,)') == {"street": "", "zip": None, "tags": None}
    assert arrow_type_for(col(ADDR), CATALOG) == pa.struct(
        [("street", pa.string()), ("zip", pa.int32()), ("tags", pa.list_(pa.string()))])


@pytest.mark.parametrize("text", ["(a,1)", "a,1,{}", '("a,1,{})'])
def test_malformed_record_text_raises(text):
    with pytest.raises(DecodeError):
        dec(ADDR, "t", text)


def test_record_binary_with_wrong_field_count_raises():
    with pytest.raises(DecodeError):
        dec(ADDR, "b", record_bin([(O.TEXT, b"x")]))


def test_enums_domains_and_user_arrays_resolve_through_the_catalog():
    assert dec(MOOD, "b", b"ok") == "ok" and dec(POSINT, "b", i4(7)) == 7
    assert arrow_type_for(col(PRICE), CATALOG) == pa.decimal128(10, 2)
    assert dec(MOOD_ARRAY, "t", "{sad,ok}") == ["sad", "ok"]
    assert arrow_type_for(col(MOOD_ARRAY), CATALOG) == pa.list_(pa.string())


def test_unknown_user_types_keep_their_raw_bytes():
    assert arrow_type_for(col(77777)) == pa.binary()
    assert decode_value("b", b"\x00\x01", col(77777)) == b"\x00\x01"
    assert decode_value("t", b"(1,2)", col(77777)) == "(1,2)"
    value, _ = arrow_notes(77777, "t", "(1,2)")
    assert value == b"(1,2)"


def test_type_messages_map_domains_over_builtins():
    cat = TypeCatalog.from_type_messages([TypeInfo(20000, "", "int4"), TypeInfo(20001, "public", "mood"),
                                          TypeInfo(20002, "pg_catalog", "_text"), TypeInfo(23, "", "int4")])
    assert set(cat.types) == {20000, 20002}
    assert decode_value("b", i4(5), col(20000), cat) == 5
    assert arrow_type_for(col(20002), cat) == pa.list_(pa.string())


def test_catalog_rows_build_user_types():
    rows = [
        (16400, "public", "mood", "e", 0, -1, 0, False, True, ["sad", "ok"], [], [], [], None, None),
        (16401, "public", "price", "d", 1700, 655366, 0, False, True, [], [], [], [], None, None),
        (16402, "public", "addr", "c", 0, -1, 0, False, True, [], ["a", "b"], [25, 23], [-1, -1], None, None),
        (16403, "public", "fr", "r", 0, -1, 0, False, True, [], [], [], [], 701, None),
        (16404, "public", "frm", "m", 0, -1, 0, False, True, [], [], [], [], None, 16403),
        (16405, "public", "_mood", "b", 0, -1, 16400, True, True, [], [], [], [], None, None),
        (16406, "public", "noflags", "b", 0, -1, 0, False, False, [], [], [], [], None, None),
    ]
    cat = TypeCatalog.from_rows(rows)
    kinds = {oid: t.kind for oid, t in cat.types.items()}
    assert kinds == {16400: "enum", 16401: "domain", 16402: "composite", 16403: "range", 16404: "multirange",
                     16405: "array", 16406: "text"}
    assert arrow_type_for(col(16401), cat) == pa.decimal128(10, 2)
    assert arrow_type_for(col(16404), cat).value_type.field("lower").type == pa.float64()
    with pytest.raises(DecodeError):
        decode_value("b", b"x", col(16406), cat)
    assert decode_value("t", b"x", col(16406), cat) == "x"
