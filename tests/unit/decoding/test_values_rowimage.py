"""RowImageConverter: struct layout, null images vs null fields vs unchanged TOAST, fast paths vs per-value."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from airflow_provider_pglogical.decoding.model import ColumnDef, RelationSchema, TupleData
from airflow_provider_pglogical.decoding.values import UNCHANGED_TOAST, RowImageConverter
from airflow_provider_pglogical.decoding.values import oids as O
from airflow_provider_pglogical.exceptions import DecodeError

REL = RelationSchema(7, "public", "orders", "d", (
    ColumnDef("id", O.INT8, -1, True), ColumnDef("body", O.TEXT, -1, False), ColumnDef("ok", O.BOOL, -1, False),
    ColumnDef("at", O.TIMESTAMPTZ, -1, False), ColumnDef("doc", O.JSONB, -1, False), ColumnDef("d", O.DATE, -1, False),
))


def image(i: int, body: str | None = "x", kinds: str = "bbbbbb") -> TupleData:
    values = (struct.pack("!q", i), None if body is None else body.encode(), b"\x01",
              struct.pack("!q", i * 1_000_000), b'\x01{"i": %d}' % i, struct.pack("!i", i))
    return TupleData(kinds, tuple(v if k in "bt" else None for k, v in zip(kinds, values, strict=True)))


def test_struct_type_follows_relation_column_order():
    conv = RowImageConverter(REL)
    assert [f.name for f in conv.arrow_type] == list(REL.column_names)
    assert conv.arrow_type.field("at").type == pa.timestamp("us", tz="UTC")


def test_null_images_null_fields_and_unchanged_toast_stay_distinct():
    conv = RowImageConverter(REL)
    images = [image(1), None, image(2, None, "bunbbb"), image(3, None, "bnbbbb")]
    arr = conv.to_arrow(images)
    assert arr.is_null().to_pylist() == [False, True, False, False]
    assert arr.field("body").to_pylist() == ["x", None, None, None]
    assert arr.field("ok").to_pylist() == [True, None, None, True]
    assert conv.unchanged_toast(images) == [[], [], ["body"], []]
    assert conv.to_python(images[2])[1] is UNCHANGED_TOAST and conv.to_python(images[3])[1] is None


def test_vectorised_and_per_value_paths_agree():
    conv = RowImageConverter(REL)
    images = [image(i, f"row {i} ✓") for i in range(300)] + [None, image(5, None, "bnnnnn")]
    fast = conv.to_arrow(images)
    text = [None if img is None else TupleData(img.kinds.replace("b", "t"), tuple(
        None if v is None else t for v, t in zip(img.values, (
            str(i).encode(), f"row {i} ✓".encode(), b"t", None, b'{"i": %d}' % i, None), strict=True)))
        for i, img in enumerate(images)]
    slow = conv.to_arrow([None if t is None else TupleData(t.kinds[:3] + "n" + t.kinds[4] + "n",
                                                            t.values[:3] + (None,) + t.values[4:5] + (None,))
                          for t in text[:300]] + text[300:])
    for name in ("id", "body", "ok", "doc"):
        assert fast.field(name)[:300].equals(slow.field(name)[:300]), name
    assert fast.field("at").cast(pa.int64())[1].as_py() == 946_684_800_000_000 + 1_000_000


def test_empty_batches_produce_empty_struct_arrays():
    arr, notes = RowImageConverter(REL).to_arrow_with_notes([])
    assert len(arr) == 0 and arr.type == RowImageConverter(REL).arrow_type and notes == []


def test_images_of_the_wrong_width_are_rejected_without_values():
    with pytest.raises(DecodeError, match="6"):
        RowImageConverter(REL).to_arrow([TupleData("bb", (b"secret", b"x"))])


def test_unknown_kinds_are_rejected():
    with pytest.raises(DecodeError):
        RowImageConverter(REL).to_arrow([TupleData("bbbbbx", image(1).values)])


def test_wrong_size_fixed_width_values_fall_back_and_raise():
    bad = TupleData("bbbbbb", (b"\x00" * 7,) + image(1).values[1:])
    with pytest.raises(DecodeError):
        RowImageConverter(REL).to_arrow([image(1), bad])


def test_invalid_utf8_in_a_text_column_raises():
    bad = TupleData("bbbbbb", (image(1).values[0], b"\xff\xfe") + image(1).values[2:])
    with pytest.raises(DecodeError):
        RowImageConverter(REL).to_arrow([bad])
