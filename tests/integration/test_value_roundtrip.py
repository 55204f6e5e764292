"""Typed values against a live server: binary and text pgoutput forms decode to the same exact values."""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding.model import ColumnDef, RelationSchema, TupleData
from airflow_provider_pglogical.decoding.values import (
    INFINITY,
    NEG_INFINITY,
    Interval,
    PgArray,
    Range,
    RowImageConverter,
    TypeCatalog,
)

# --- a tiny pgoutput reader, enough for Relation and Insert (keeps this test independent of the parser) ---


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(b"\0", pos)
    return buf[pos:end].decode(), end + 1


def parse_relation(buf: bytes) -> RelationSchema:
    (relid,) = struct.unpack_from("!I", buf, 1)
    nsp, pos = _cstring(buf, 5)
    name, pos = _cstring(buf, pos)
    ident, (natts,) = chr(buf[pos]), struct.unpack_from("!h", buf, pos + 1)
    pos += 3
    cols = []
    for _ in range(natts):
        flags = buf[pos]
        col, pos = _cstring(buf, pos + 1)
        oid, typmod = struct.unpack_from("!Ii", buf, pos)
        pos += 8
        cols.append(ColumnDef(col, oid, typmod, bool(flags & 1)))
    return RelationSchema(relid, nsp or "pg_catalog", name, ident, tuple(cols))


def parse_insert(buf: bytes) -> TupleData:
    assert buf[:1] == b"I" and buf[5:6] == b"N"
    (ncols,) = struct.unpack_from("!h", buf, 6)
    pos, kinds, values = 8, [], []
    for _ in range(ncols):
        kind = chr(buf[pos])
        pos += 1
        kinds.append(kind)
        if kind in "tb":
            (n,) = struct.unpack_from("!i", buf, pos)
            values.append(bytes(buf[pos + 4:pos + 4 + n]))
            pos += 4 + n
        else:
            values.append(None)
    assert pos == len(buf)
    return TupleData("".join(kinds), tuple(values))


def read_inserts(cur, binary: bool, consume: bool = False) -> tuple[RelationSchema, list[TupleData]]:
    fn = "pg_logical_slot_get_binary_changes" if consume else "pg_logical_slot_peek_binary_changes"
    cur.execute(f"SELECT data FROM {fn}('s', NULL, NULL, 'proto_version', '1', 'publication_names', 'p', "
                "'binary', %s)", ("true" if binary else "false",))
    relation, images = None, []
    for (data,) in cur.fetchall():
        data = bytes(data)
        if data[:1] == b"R":
            relation = parse_relation(data)
        elif data[:1] == b"I":
            images.append(parse_insert(data))
    return relation, images


def load_catalog(cur, relation: RelationSchema) -> TypeCatalog:
    cur.execute(TypeCatalog.CATALOG_QUERY, {"oids": [c.type_oid for c in relation.columns if c.type_oid >= 10000]})
    return TypeCatalog.from_rows(cur.fetchall())


def same(a, b) -> bool:
    """Equality where NaN equals NaN (floats and Decimals), recursively."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, Decimal) and isinstance(b, Decimal) and a.is_nan() and b.is_nan():
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


def arrays_same(a: pa.Array, b: pa.Array) -> bool:
    """Array equality where NaN equals NaN (Arrow's equals says NaN != NaN)."""
    if a.equals(b):
        return True
    if pa.types.is_floating(a.type):
        import pyarrow.compute as pc

        nan_a, nan_b = pc.is_nan(a), pc.is_nan(b)
        keep = pc.invert(pc.fill_null(nan_a, False))
        return nan_a.equals(nan_b) and a.filter(keep).equals(b.filter(keep))
    return False


SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy 😀');
CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
CREATE DOMAIN price AS numeric(10,2);
CREATE TYPE addr AS (street text, zip int4, tags text[], amount numeric(8,2), seen timestamptz);
CREATE TYPE floatrange AS RANGE (subtype = float8);
CREATE TABLE t (
  id int PRIMARY KEY, b bool, i2 int2, i4 int4, i8 int8, o oid, f4 float4, f8 float8,
  n numeric, n12 numeric(12,2), n40 numeric(40,10), tx text, vc varchar(10), bp char(6), nm name, ch "char",
  by bytea, d date, tm time, ttz timetz, ts timestamp, tstz timestamptz, iv interval, u uuid,
  js json, jb jsonb, ip inet, cn cidr, mac macaddr, mac8 macaddr8, m money, lsn pg_lsn, bt bit(5), vb varbit,
  ai int4[], at text[], an numeric(6,2)[], ats timestamptz[], md mood, dm posint, dp price, cp addr,
  ir int4range, nr numrange, tr tstzrange, fr floatrange, dmr datemultirange, amd mood[], acp addr[]
);
ALTER TABLE t REPLICA IDENTITY FULL;
"""

ROWS = [
    # every column NULL
    "INSERT INTO t (id) VALUES (1)",
    # ordinary values
    """INSERT INTO t VALUES (2, true, 12, -34, 9007199254740993, 4294967295, 1.5, 0.1,
      '123.4500', 12.34, 1.0000000001, 'héllo ✓', 'abc', 'ab', 'nm', 'x',
      '\\x00ff10', '2024-02-29', '13:14:15.123456', '01:02:03+05:30', '2024-01-02 03:04:05.678901',
      '2024-01-02 03:04:05.678901+02', '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
      '{"b": [1, 2], "a": "x"}', '{"b": [1, 2], "a": "x"}', '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03',
      '08:00:2b:01:02:03:04:05', 1234.56, '16/B374D848', B'10101', B'1101001',
      '{1,NULL,3}', '{"a b","with \\"quote\\"","NULL",NULL,"","back\\\\slash"}', '{1.10,NaN}',
      '{2024-01-01 00:00:00+00,infinity}', 'happy 😀', 7, 99.95,
      ROW('Main St, "1"', 12345, ARRAY['x','y'], 1.5, '2020-01-01 00:00:00+00'),
      '[1,10)', '(1.5,2.25]', '[2024-01-01 00:00:00+00,)', '[-Infinity,0.5)', '{[2024-01-01,2024-02-01),[2024-03-01,)}',
      '{sad,ok}', ARRAY[ROW('a', 1, '{}', NULL, NULL)::addr, NULL])""",
    # edge values
    """INSERT INTO t VALUES (3, false, -32768, -2147483648, -9223372036854775808, 0, 'NaN', '-Infinity',
      'NaN', 'NaN', '-999999999999999999999999999999.9999999999', '', '', '', '', '',
      '', 'infinity', '24:00:00', '00:00:00-15:59', 'infinity', '-infinity', '-1 days +02:03:00', '00000000-0000-0000-0000-000000000000',
      '[]', '{}', '::ffff:1.2.3.4', '2001:db8::/32', '00:00:00:00:00:00', 'ff:ff:ff:ff:ff:ff:ff:ff', -92233720368547758.08,
      '0/0', B'00000', B'', '{}', '{}', '{}', '{}', 'sad', 1, -0.01,
      ROW('', NULL, '{}', NULL, 'infinity'), 'empty', '(,)', 'empty', '(,)', '{}', '{}', '{}')""",
    # more edges: multi-dim arrays with NULLs and lower bounds, extreme numerics, BC dates
    """INSERT INTO t (id, f4, f8, n, d, ts, tstz, ai, at, an, iv, ip, ch, bp, tx)
      VALUES (4, 'Infinity', 'NaN', '-Infinity', '-infinity', '4713-01-01 00:00:00 BC', '0044-03-15 12:00:00+00 BC',
      '[0:1][-2:0]={{1,NULL,3},{4,5,NULL}}', '{{"{}","a,b"},{NULL,"NULL"}}', '[2:3]={NaN,-1.50}',
      '-178000000 years', '2001:db8:0:0:1:0:0:1', '\\311', 'ab    ', repeat('long ', 3000))""",
    """INSERT INTO t (id, n, n40, f8, iv, d, ts, tstz, ttz) VALUES (5, '1e-1000',
      '123456789012345678901234567890.0123456789', '1e300', '-00:00:00.000001', '5874897-12-31',
      '294246-12-31 23:59:59.999999', '1900-01-01 00:00:00+00', '23:59:59.999999-15:59:59')""",
    f"INSERT INTO t (id, n) VALUES (6, '{'9' * 1000}.{'1' * 1000}')",
    "INSERT INTO t (id, n) VALUES (7, 1e131071)",
]


@pytest.fixture
def loaded(pg_conn):
    cur = pg_conn.cursor()
    cur.execute("SET client_encoding = 'UTF8'")
    cur.execute(SCHEMA)
    cur.execute("CREATE PUBLICATION p FOR TABLE t")
    cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    for sql in ROWS:
        cur.execute(sql)
    return cur


def test_binary_and_text_forms_decode_to_identical_python_and_arrow_values(loaded):
    cur = loaded
    rel_b, images_b = read_inserts(cur, binary=True)
    # text output of timestamptz follows the session TimeZone: Amsterdam's 1900 LMT offset is +00:19:32
    cur.execute("SET TimeZone = 'Europe/Amsterdam'")
    rel_t, images_t = read_inserts(cur, binary=False)
    assert any(b"+00:19:32" in (v or b"") for img in images_t for v in img.values)
    assert set("".join(i.kinds for i in images_b)) <= {"b", "n"}
    assert set("".join(i.kinds for i in images_t)) <= {"t", "n"}
    catalog = load_catalog(cur, rel_b)
    conv = RowImageConverter(rel_b, catalog)
    for img_b, img_t in zip(images_b, images_t, strict=True):
        pb, pt = conv.to_python(img_b), conv.to_python(img_t)
        for col, vb, vt in zip(rel_b.column_names, pb, pt, strict=True):
            assert same(vb, vt), col
    arr_b, notes_b = conv.to_arrow_with_notes(images_b)
    arr_t, notes_t = conv.to_arrow_with_notes(images_t)
    assert arr_b.type == conv.arrow_type
    for i in range(arr_b.type.num_fields):
        assert arrays_same(arr_b.field(i), arr_t.field(i)), rel_b.columns[i].name
    assert notes_b == notes_t


def _by_id(conv: RowImageConverter, images: list[TupleData]) -> dict[int, dict]:
    rows = [dict(zip(conv.names, conv.to_python(img), strict=True)) for img in images]
    return {r["id"]: r for r in rows}


def test_decoded_values_equal_what_select_returns(loaded):
    cur = loaded
    rel, images = read_inserts(cur, binary=True)
    conv = RowImageConverter(rel, load_catalog(cur, rel))
    rows = _by_id(conv, images)
    simple = ["b", "i2", "i4", "i8", "o", "f8", "n", "n12", "n40", "tx", "vc", "bp", "nm", "by", "dm", "dp", "md"]
    cur.execute(f"SELECT id, {', '.join(simple)}, u, js::text, jb::text, ip, cn, mac, "
                "mac8, bt, vb, ch, lsn FROM t ORDER BY id")
    for rec in cur.fetchall():
        got = rows[rec[0]]
        for col, want in zip(simple, rec[1:], strict=False):
            want = bytes(want) if isinstance(want, memoryview) else want
            assert same(got[col], want), (rec[0], col)
        u, js, jb, ip, cn, mac, mac8, bt, vb, ch, lsn = rec[1 + len(simple):]
        assert (str(got["u"]) if got["u"] else None) == u
        assert got["js"] == js and got["jb"] == jb
        assert (got["ip"], got["cn"], got["mac"], got["mac8"], got["bt"], got["vb"], got["ch"]) == (
            ip, cn, mac, mac8, bt, vb, ch)
        assert (None if got["lsn"] is None else f"{got['lsn'] >> 32:X}/{got['lsn'] & 0xFFFFFFFF:X}") == lsn


def test_special_values_have_their_documented_representation(loaded):
    cur = loaded
    rel, images = read_inserts(cur, binary=True)
    conv = RowImageConverter(rel, load_catalog(cur, rel))
    rows = _by_id(conv, images)
    r2, r3, r4, r5 = rows[2], rows[3], rows[4], rows[5]
    assert r2["f4"] == 1.5 and r2["n"] == Decimal("123.4500") and str(r2["n"]) == "123.4500"
    assert r2["ttz"] == dt.time(1, 2, 3, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))
    assert r2["tstz"] == dt.datetime(2024, 1, 2, 1, 4, 5, 678901, tzinfo=dt.UTC)
    assert r2["iv"] == Interval(14, 3, 4 * 3600_000_000 + 5 * 60_000_000 + 6_789_000)
    assert r2["u"] == uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert json.loads(r2["jb"]) == {"a": "x", "b": [1, 2]}
    assert r2["m"] == 123456 and r3["m"] == -9223372036854775808
    assert r2["at"] == ["a b", 'with "quote"', "NULL", None, "", "back\\slash"]
    assert same(r2["an"], [Decimal("1.10"), Decimal("NaN")])
    assert r2["ats"] == [dt.datetime(2024, 1, 1, tzinfo=dt.UTC), INFINITY]
    assert r2["cp"] == {"street": 'Main St, "1"', "zip": 12345, "tags": ["x", "y"], "amount": Decimal("1.50"),
                        "seen": dt.datetime(2020, 1, 1, tzinfo=dt.UTC)}
    assert r2["ir"] == Range(1, 10, True, False) and r2["nr"] == Range(Decimal("1.5"), Decimal("2.25"), False, True)
    assert r2["fr"] == Range(-math.inf, 0.5, True, False)
    assert r2["dmr"] == [Range(dt.date(2024, 1, 1), dt.date(2024, 2, 1), True, False),
                         Range(dt.date(2024, 3, 1), None, True, False)]
    assert r2["acp"] == [{"street": "a", "zip": 1, "tags": [], "amount": None, "seen": None}, None]
    assert math.isnan(r3["f4"]) and r3["f8"] == -math.inf and r3["n"].is_nan() and r3["n12"].is_nan()
    assert (r3["d"], r3["ts"], r3["tstz"]) == (INFINITY, INFINITY, NEG_INFINITY)
    assert r3["tm"] == dt.timedelta(days=1) and r3["iv"] == Interval(0, -1, 7380_000_000)
    assert r3["ip"] == "::ffff:1.2.3.4" and r3["bp"] == "      " and r3["ch"] == ""
    assert r3["ir"] == Range(None, None, False, False, True) and r3["nr"] == Range(None, None, False, False)
    assert r4["ai"] == PgArray((0, -2), [[1, None, 3], [4, 5, None]]) and r4["at"] == [["{}", "a,b"], [None, "NULL"]]
    assert r4["d"] == NEG_INFINITY and r4["bp"] == "ab    " and r4["ch"] == "\\311" and len(r4["tx"]) == 15000
    assert r4["iv"] == Interval(-178000000 * 12, 0, 0)
    assert r5["n"] == Decimal("1e-1000") and r5["iv"] == Interval(0, 0, -1)
    assert rows[6]["n"] == Decimal("9" * 1000 + "." + "1" * 1000)
    assert rows[7]["n"] == Decimal("1e131071")

    arr, notes = conv.to_arrow_with_notes(images)
    by_id = {row: i for i, row in enumerate(arr.field("id").to_pylist())}
    col = {name: arr.field(name) for name in conv.names}
    i3, i4, i5 = by_id[3], by_id[4], by_id[5]
    assert col["n12"].type == pa.decimal128(12, 2) and col["n40"].type == pa.decimal256(40, 10)
    assert col["n12"][i3].as_py() is None and notes[i3]["n12"] == "NaN"
    assert col["n"].type == pa.string() and col["n"][i3].as_py() == "NaN" and col["n"][i4].as_py() == "-Infinity"
    assert col["n"][i5].as_py() == "0." + "0" * 999 + "1"
    assert col["d"].cast(pa.int32())[i3].as_py() == 2**31 - 1 and col["d"].cast(pa.int32())[i4].as_py() == -(2**31)
    assert col["ts"].cast(pa.int64())[i3].as_py() == 2**63 - 1 and col["tstz"].cast(pa.int64())[i3].as_py() == -(2**63)
    assert col["ts"].cast(pa.int64())[i4].as_py() == -210863520000000000  # 4713-01-01 BC: extract(epoch) * 1e6
    assert notes[i4]["ai"] == "[0:1][-2:0]" and notes[i4]["at"] == "[1:2][1:2]" and notes[i4]["an"] == "[2:3]"
    assert notes[i4]["an[0]"] == "NaN"
    assert col["ai"][i4].as_py() == [1, None, 3, 4, 5, None]
    assert col["u"].type == pa.string() and col["ttz"][by_id[2]].as_py()["utc_offset"] == 19800
    assert col["iv"][by_id[2]].as_py() == {"months": 14, "days": 3, "microseconds": 14706789000}


def test_user_types_resolve_through_the_catalog_query(loaded):
    cur = loaded
    rel, _ = read_inserts(cur, binary=True)
    catalog = load_catalog(cur, rel)
    kinds = {ut.name: ut.kind for ut in catalog.types.values()}
    assert {"public.mood": "enum", "public.posint": "domain", "public.addr": "composite",
            "public.floatrange": "range", "public._mood": "array", "public._addr": "array"}.items() <= kinds.items()
    conv = RowImageConverter(rel, catalog)
    assert conv.arrow_type.field("dp").type == pa.decimal128(10, 2)
    assert conv.arrow_type.field("md").type == pa.string()
    unknown = RowImageConverter(rel, TypeCatalog())
    assert unknown.arrow_type.field("md").type == pa.binary()


# --- hypothesis: generated values through the server ---

HYPO_TABLE = "CREATE TABLE h (id serial PRIMARY KEY, i8 int8, f8 float8, n numeric, tx text, ts timestamptz, a int4[])"

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
numerics = st.decimals(allow_nan=True, allow_infinity=True, places=None).filter(
    lambda d: not d.is_finite() or -1000 < d.adjusted() < 1000)
timestamps = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31),
                          timezones=st.just(dt.UTC))
int_arrays = st.lists(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)), max_size=6)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(i8=st.integers(-(2**63), 2**63 - 1), f8=st.floats(), n=numerics, tx=texts, ts=timestamps, a=int_arrays)
def test_generated_values_round_trip_through_the_server(pg_conn, i8, f8, n, tx, ts, a):
    cur = pg_conn.cursor()
    cur.execute("SELECT to_regclass('h') IS NOT NULL")
    if not cur.fetchone()[0]:
        cur.execute("SET client_encoding = 'UTF8'")
        cur.execute(HYPO_TABLE)
        cur.execute("CREATE PUBLICATION p FOR TABLE h")
        cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    n_text = "NaN" if n.is_nan() else ("Infinity" if n > 0 else "-Infinity") if n.is_infinite() else str(n)
    cur.execute("INSERT INTO h (i8, f8, n, tx, ts, a) VALUES (%s, %s::float8, %s::numeric, %s, %s, %s::int4[])",
                (i8, repr(f8), n_text, tx, ts, a))
    _, text_images = read_inserts(cur, binary=False)
    rel, images = read_inserts(cur, binary=True, consume=True)
    conv = RowImageConverter(rel)
    (got,) = [conv.to_python(img) for img in images]
    (got_t,) = [conv.to_python(img) for img in text_images]
    assert same(got, got_t)
    _, gi8, gf8, gn, gtx, gts, ga = got
    assert gi8 == i8 and same(gf8, f8) and gtx == tx and gts == ts and ga == a
    assert same(gn, Decimal(n_text)) and (gn.is_nan() or gn == n)
    arr_b, arr_t = conv.to_arrow(images), conv.to_arrow(text_images)
    assert all(arrays_same(arr_b.field(i), arr_t.field(i)) for i in range(arr_b.type.num_fields))
