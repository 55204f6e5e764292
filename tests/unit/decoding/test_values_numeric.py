"""numeric: exact Decimal, exact text for unconstrained columns, decimal128/256 with NaN notes."""

from __future__ import annotations

import struct
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_provider_pglogical.decoding.model import ColumnDef, RelationSchema, TupleData
from airflow_provider_pglogical.decoding.values import RowImageConverter, arrow_type_for, decode_value
from airflow_provider_pglogical.decoding.values import oids as O
from airflow_provider_pglogical.decoding.values.numeric import numeric_typmod
from airflow_provider_pglogical.exceptions import DecodeError


def typmod(p: int, s: int) -> int:
    return ((p << 16) | (s & 0x7FF)) + 4


def num(digits: list[int], weight: int, sign: int = 0, dscale: int = 0) -> bytes:
    """numeric_send: ndigits, weight, sign, dscale, base-10000 digits."""
    return struct.pack(f"!hhHh{len(digits)}h", len(digits), weight, sign, dscale, *digits)


CASES = [
    (num([], 0), "0"), (num([], 0, dscale=2), "0.00"), (num([12, 3400], 0, dscale=2), "12.34"),
    (num([12, 3400], 0, sign=0x4000, dscale=4), "-12.3400"), (num([1], 2), "100000000"),
    (num([1], -1, dscale=4), "0.0001"), (num([1], -250, dscale=1000), "0." + "0" * 999 + "1"),
    (num([1], 32767 // 4), "1" + "0" * (4 * (32767 // 4))),
    (num([], 0, sign=0xC000), "NaN"), (num([], 0, sign=0xD000), "Infinity"), (num([], 0, sign=0xF000), "-Infinity"),
]


@pytest.mark.parametrize(("raw", "text"), CASES)
def test_binary_numeric_decodes_to_the_exact_decimal_and_text(raw, text):
    c = ColumnDef("n", O.NUMERIC, -1, False)
    got = decode_value("b", raw, c)
    assert str(got) == text or got.compare_total(Decimal(text)) == 0
    assert decode_value("t", text.encode(), c).compare_total(got) == 0
    conv = RowImageConverter(RelationSchema(1, "s", "t", "d", (c,)))
    assert conv.to_arrow([TupleData("b", (raw,))]).field(0).to_pylist() == [text]


def test_typmod_decodes_precision_and_signed_scale():
    assert numeric_typmod(-1) is None
    assert numeric_typmod(typmod(12, 2)) == (12, 2)
    assert numeric_typmod(typmod(3, -2)) == (3, -2)


@pytest.mark.parametrize(("p", "s", "want"), [
    (12, 2, pa.decimal128(12, 2)), (38, 0, pa.decimal128(38, 0)), (39, 5, pa.decimal256(39, 5)),
    (76, 76, pa.decimal256(76, 76)), (77, 2, pa.string()), (3, -2, pa.string()), (2, 5, pa.string()),
])
def test_constrained_numeric_arrow_types(p, s, want):
    assert arrow_type_for(ColumnDef("n", O.NUMERIC, typmod(p, s), False)) == want


def _convert(p: int, s: int, images: list[TupleData | None]):
    rel = RelationSchema(1, "s", "t", "d", (ColumnDef("n", O.NUMERIC, typmod(p, s), False),))
    return RowImageConverter(rel).to_arrow_with_notes(images)


@pytest.mark.parametrize("p", [12, 30, 50])
def test_decimal_columns_hold_exact_values_and_note_nan(p):
    images = [TupleData("b", (num([12, 3400], 0, dscale=2),)), TupleData("b", (num([], 0, sign=0xC000),)),
              TupleData("n", (None,)), None, TupleData("t", (b"-0.01",)), TupleData("b", (num([5], 0, 0x4000),)),
              TupleData("b", (num([99, 9999, 9999], 2, dscale=0),))]
    arr, notes = _convert(p, 2, images)
    assert arr.field(0).to_pylist() == [Decimal("12.34"), None, None, None, Decimal("-0.01"), Decimal("-5.00"),
                                        Decimal("9999999999.00")]
    assert notes == [{}, {"n": "NaN"}, {}, {}, {}, {}, {}]


def test_decimal_fast_and_exact_paths_agree_on_many_values():
    values = [Decimal(i * 7919 % 10**10) / 100 * (-1 if i % 3 else 1) for i in range(2000)]

    def enc(d: Decimal) -> bytes:
        t = format(d, "f")
        return t.encode()

    rel = RelationSchema(1, "s", "t", "d", (ColumnDef("n", O.NUMERIC, typmod(12, 2), False),))
    conv = RowImageConverter(rel)
    text_images = [TupleData("t", (enc(d),)) for d in values]
    binary_images = []
    for d in values:
        sign, digits, exp = d.quantize(Decimal("0.01")).as_tuple()
        n = int("".join(map(str, digits)) or "0")
        cents = f"{n:d}".rjust(3, "0")
        whole, frac = cents[:-2], cents[-2:]
        groups = []
        w = whole.lstrip("0")
        while w:
            groups.insert(0, int(w[-4:]))
            w = w[:-4]
        raw = num(groups + [int(frac) * 100], len(groups) - 1, 0x4000 if sign else 0, 2)
        binary_images.append(TupleData("b", (raw,)))
    a = conv.to_arrow(binary_images)
    assert a.equals(conv.to_arrow(text_images))
    assert a.field(0).to_pylist() == [d.quantize(Decimal("0.01")) for d in values]


@pytest.mark.parametrize("raw", [
    num([12, 3456], 0, dscale=4),  # more fraction digits than the column's scale
    num([1], 3, dscale=0),  # 10^12 does not fit numeric(12,2)
])
def test_decimal_values_that_do_not_fit_the_typmod_raise(raw):
    with pytest.raises(DecodeError):
        _convert(12, 2, [TupleData("b", (raw,))])


@pytest.mark.parametrize("raw", [
    b"", b"\x00\x01", struct.pack("!hhHh", 1, 0, 0, 0), struct.pack("!hhHhh", 1, 0, 0x1234, 0, 1),
    struct.pack("!hhHhh", 1, 0, 0, 0, 10000), struct.pack("!hhHh", -1, 0, 0, 0),
    num([1234], -1, dscale=2),  # digits beyond the display scale
])
def test_malformed_numeric_binary_raises(raw):
    with pytest.raises(DecodeError):
        decode_value("b", raw, ColumnDef("n", O.NUMERIC, -1, False))


@pytest.mark.parametrize("text", ["", "1e5", "nan", "1.2.3", "--1", " 1"])
def test_malformed_numeric_text_raises(text):
    with pytest.raises(DecodeError):
        decode_value("t", text.encode(), ColumnDef("n", O.NUMERIC, -1, False))
