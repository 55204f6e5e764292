"""RowImageConverter: a batch of row images of one relation into one Arrow StructArray, column at a time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, is_
from typing import Any, cast

import numpy as np
import pyarrow as pa

from airflow_provider_pglogical.decoding.model import RelationSchema, RowImage
from airflow_provider_pglogical.decoding.values.catalog import TypeCatalog
from airflow_provider_pglogical.decoding.values.codec import Codec, Notes
from airflow_provider_pglogical.decoding.values.framing import FramedImages, frame_images, frame_joined
from airflow_provider_pglogical.decoding.values.numeric import DecimalCodec
from airflow_provider_pglogical.decoding.values.registry import codec_for
from airflow_provider_pglogical.decoding.values.sentinels import UNCHANGED_TOAST
from airflow_provider_pglogical.decoding.values.vector import KIND_UNCHANGED, Column, string_array, with_mask
from airflow_provider_pglogical.decoding.wiretuple import WireTuple, encode_tuple
from airflow_provider_pglogical.exceptions import DecodeError

_MESSAGE, _OFFSET, _LSN, _END = attrgetter("message"), attrgetter("offset"), attrgetter("lsn"), attrgetter("end")
NOTES_TYPE = pa.map_(pa.string(), pa.string())


@dataclass(frozen=True)
class ConvertedImages:
    """Row images as Arrow: the struct, per-row exactness notes and unchanged-TOAST column names."""

    array: pa.StructArray
    notes: pa.MapArray  # map<string,string>, one entry per row (empty when exact)
    unchanged: pa.ListArray  # list<string> of columns sent as 'u'
    sparse_notes: dict[int, Notes]  # the same notes, row index → {path: text}, rows with notes only


class RowImageConverter:
    """Converts row images (TupleData or WireTuple) of one relation schema version.

    In the struct, a None image is a null struct; 'n' and 'u' are null fields (``unchanged``
    tells them apart). Values an Arrow field cannot hold alone (numeric NaN in a decimal column, the
    shape of a multi-dimensional array) get an exactness note.
    """

    def __init__(self, relation: RelationSchema, catalog: TypeCatalog | None = None) -> None:
        self.relation = relation
        self.catalog = catalog if catalog is not None else TypeCatalog()
        self.codecs: tuple[Codec, ...] = tuple(
            codec_for(c.type_oid, c.type_modifier, self.catalog) for c in relation.columns)
        self.names = relation.column_names
        self.arrow_type = pa.struct([pa.field(n, c.arrow_type) for n, c in zip(self.names, self.codecs, strict=True)])

    # -- framing --------------------------------------------------------------------------

    def frame(self, images: Sequence[RowImage | None]) -> tuple[FramedImages, np.ndarray]:
        """All images split into columns in one numpy pass, and the mask of None images.

        None images are not framed: they become all-'n' rows afterwards. Decoded TupleData
        images (old images of key changes, tests) are re-encoded to their wire form first.
        """
        n = len(images)
        absent = np.fromiter(map(is_, images, repeat(None)), dtype=bool, count=n)
        # The None images are masked out: ``present`` holds images only.
        present = cast("list[RowImage]", list(compress(images, ~absent)) if absent.any() else list(images))
        if set(map(type, present)) <= {WireTuple}:
            messages = list(map(_MESSAGE, present))
            offsets = list(map(_OFFSET, present))
            lsns = list(map(_LSN, present))
            ends: list[int | None] = list(map(_END, present))
        else:
            messages = [img.message if isinstance(img, WireTuple) else self._encode(img) for img in present]
            offsets = [img.offset if isinstance(img, WireTuple) else 0 for img in present]
            lsns = [img.lsn if isinstance(img, WireTuple) else None for img in present]
            ends = [img.end if isinstance(img, WireTuple) else None for img in present]
        framed = frame_images(messages, offsets, len(self.names), lsns, ends)
        return (framed if len(present) == n else framed.expand(~absent)), absent

    def _check_width(self, image: RowImage) -> None:
        if len(image.kinds) != len(self.names) or len(image.values) != len(self.names):
            raise DecodeError(f"row image has {len(image.kinds)} columns, relation "
                              f"{self.relation.qualified_name} has {len(self.names)}")

    def _encode(self, image: RowImage) -> bytes:
        self._check_width(image)
        if not set(image.kinds) <= set("nutb"):
            raise DecodeError("unknown column kind in row image")
        return encode_tuple(image)

    # -- conversion -----------------------------------------------------------------------

    def convert(self, images: Sequence[RowImage | None]) -> ConvertedImages:
        n = len(images)
        notes: dict[int, Notes] = {}
        if n == 0:
            empty = pa.array([], type=pa.list_(pa.string()))
            return ConvertedImages(pa.array([], type=self.arrow_type), pa.array([], type=NOTES_TYPE), empty, notes)
        framed, absent = self.frame(images)
        return self._convert(framed, absent, n)

    def convert_joined(self, side: tuple[bytes, bytes, bytes, bytes],
                       images: Callable[[], Sequence[RowImage | None]]) -> ConvertedImages:
        """``convert`` of wire images handed over already joined (``_speedups.rowchange_columns``):
        ``side`` = (absent mask bytes, the present images' messages joined + ``PAD`` zero bytes,
        native int64 tuple starts, tuple ends). ``images()`` gives the images themselves, only
        needed when a row does not frame: ``convert`` then raises the precise error."""
        absent_bytes, data, starts, ends = side
        absent = np.frombuffer(absent_bytes, dtype=bool)
        n = len(absent)
        framed = frame_joined(data, np.frombuffer(starts, dtype=np.int64), np.frombuffer(ends, dtype=np.int64),
                              len(self.names))
        if framed is None or n == 0:
            return self.convert(images())
        return self._convert(framed if framed.kinds.shape[1] == n else framed.expand(~absent), absent, n)

    def _convert(self, framed: FramedImages, absent: np.ndarray, n: int) -> ConvertedImages:
        notes: dict[int, Notes] = {}
        arrays = [self._column(name, codec, framed.column(j), notes)
                  for j, (name, codec) in enumerate(zip(self.names, self.codecs, strict=True))]
        mask = with_mask(absent, None, pa.bool_()) if absent.any() else None
        array = pa.StructArray.from_arrays(arrays, fields=list(self.arrow_type), mask=mask)
        return ConvertedImages(array, _notes_array(notes, n, self.relation.qualified_name), self._unchanged(framed, n), notes)

    def convert_framed(self, framed: FramedImages, n: int) -> ConvertedImages:
        """Convert n row images that are already framed (e.g. binary COPY rows, whose per-field
        format is the pgoutput binary value format): the same column codecs as ``convert``."""
        notes: dict[int, Notes] = {}
        arrays = [self._column(name, codec, framed.column(j), notes)
                  for j, (name, codec) in enumerate(zip(self.names, self.codecs, strict=True))]
        array = pa.StructArray.from_arrays(arrays, fields=list(self.arrow_type))
        return ConvertedImages(array, _notes_array(notes, n, self.relation.qualified_name), self._unchanged(framed, n), notes)

    def to_arrow(self, images: Sequence[RowImage | None]) -> pa.StructArray:
        return self.convert(images).array

    def to_arrow_with_notes(self, images: Sequence[RowImage | None]) -> tuple[pa.StructArray, list[Notes]]:
        """The StructArray and, per image, its exactness notes (value path → text; usually empty)."""
        got = self.convert(images)
        return got.array, [got.sparse_notes.get(i, {}) for i in range(len(images))]

    def notes(self, images: Sequence[RowImage | None]) -> list[Notes]:
        return self.to_arrow_with_notes(images)[1]

    def unchanged_toast(self, images: Sequence[RowImage | None]) -> list[list[str]]:
        """Per image, the names of columns sent as 'u' (empty for a None image)."""
        return self._unchanged(self.frame(images)[0], len(images)).to_pylist() if images else []

    def _unchanged(self, framed: FramedImages, n: int) -> pa.ListArray:
        hit = framed.columns_with(KIND_UNCHANGED).T  # (n, ncols)
        counts = hit.sum(axis=1)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        names = np.array(self.names, dtype=object)[np.nonzero(hit)[1]]
        return pa.ListArray.from_arrays(with_mask(offsets, None, pa.int32()), string_array(
            names.tolist(), f"the unchanged-TOAST column names of {self.relation.qualified_name}"))

    @staticmethod
    def _column(name: str, codec: Codec, col: Column, notes: dict[int, Notes]) -> pa.Array:
        if isinstance(codec, DecimalCodec):
            arr, specials = codec.column_with_notes(col)
            for i, text in specials.items():
                notes.setdefault(i, {})[name] = text
            return arr
        try:
            arr = codec.arrow_column(col)
        except DecodeError as e:  # a column of many rows: its name is what locates the fault
            raise DecodeError(f"column {name}: {e.reason}", lsn=e.lsn, offset=e.offset,
                              message_type=e.message_type) from None
        if arr is not None:
            return arr
        values: list[Any] = [None] * len(col)
        for i, (k, raw) in enumerate(zip(col.kinds_str(), col.raws(), strict=True)):
            if (k == "b" or k == "t") and raw is not None:  # a 'b'/'t' value always has its bytes
                row_notes: Notes = {}
                values[i] = codec.arrow(k, raw, row_notes, name)
                if row_notes:
                    notes.setdefault(i, {}).update(row_notes)
        try:
            return pa.array(values, type=codec.arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            raise DecodeError(f"value of column {name} does not fit {codec.arrow_type}") from None

    def to_python(self, image: RowImage) -> tuple[Any, ...]:
        self._check_width(image)
        return tuple(
            UNCHANGED_TOAST if k == "u" else None if k == "n" or raw is None else codec.python(k, raw)
            for codec, k, raw in zip(self.codecs, image.kinds, image.values, strict=True))


def _notes_array(notes: dict[int, Notes], n: int, what: str) -> pa.MapArray:
    """map<string,string> per row from the sparse notes, without a Python object per empty row."""
    counts = np.zeros(n, dtype=np.int32)
    keys: list[str] = []
    items: list[str] = []
    for i in sorted(notes):
        counts[i] = len(notes[i])
        keys.extend(notes[i])
        items.extend(notes[i].values())
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(with_mask(offsets, None, pa.int32()), string_array(keys, f"{what}: value-note paths"),
                                   string_array(items, f"{what}: value-note texts"))
