"""RowImageConverter: a batch of row images of one relation into one Arrow StructArray, column at a time."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, is_, itemgetter
from typing import Any

import pyarrow as pa

from airflow_provider_pglogical.decoding.model import RelationSchema, TupleData
from airflow_provider_pglogical.decoding.values.catalog import TypeCatalog
from airflow_provider_pglogical.decoding.values.codec import Codec, Notes
from airflow_provider_pglogical.decoding.values.numeric import DecimalCodec
from airflow_provider_pglogical.decoding.values.registry import codec_for
from airflow_provider_pglogical.decoding.values.sentinels import UNCHANGED_TOAST
from airflow_provider_pglogical.exceptions import DecodeError

_KINDS = frozenset("nutb")
_KINDS_OF, _VALUES_OF = attrgetter("kinds"), attrgetter("values")


class RowImageConverter:
    """Converts row images (TupleData) of one relation schema version.

    In the struct, a None image is a null struct; 'n' and 'u' are null fields (``unchanged_toast``
    tells them apart). Values an Arrow field cannot hold alone (numeric NaN in a decimal column, the
    shape of a multi-dimensional array) get an exactness note: ``to_arrow_with_notes``.
    """

    def __init__(self, relation: RelationSchema, catalog: TypeCatalog | None = None) -> None:
        self.relation = relation
        self.catalog = catalog if catalog is not None else TypeCatalog()
        self.codecs: tuple[Codec, ...] = tuple(
            codec_for(c.type_oid, c.type_modifier, self.catalog) for c in relation.columns)
        self.names = relation.column_names
        self.arrow_type = pa.struct([pa.field(n, c.arrow_type) for n, c in zip(self.names, self.codecs, strict=True)])
        self._null_image = TupleData("n" * len(self.names), (None,) * len(self.names))

    def _check(self, images: Sequence[TupleData | None]) -> list[TupleData]:
        """Images with None replaced by an all-'n' image; every image must have the relation's width."""
        ncols = len(self.names)
        imgs = [self._null_image if img is None else img for img in images]
        if imgs and (set(map(len, map(_KINDS_OF, imgs))) != {ncols} or set(map(len, map(_VALUES_OF, imgs))) != {ncols}):
            bad = next(img for img in imgs if len(img.kinds) != ncols or len(img.values) != ncols)
            raise DecodeError(f"row image has {len(bad.kinds)} columns, relation "
                              f"{self.relation.qualified_name} has {ncols}")
        return imgs

    def to_arrow(self, images: Sequence[TupleData | None]) -> pa.StructArray:
        return self._convert(images)[0]

    def to_arrow_with_notes(self, images: Sequence[TupleData | None]) -> tuple[pa.StructArray, list[Notes]]:
        """The StructArray and, per image, its exactness notes (value path → text; usually empty)."""
        arr, notes = self._convert(images)
        return arr, [notes.get(i, {}) for i in range(len(images))]

    def _convert(self, images: Sequence[TupleData | None]) -> tuple[pa.StructArray, dict[int, Notes]]:
        imgs = self._check(images)
        n, ncols = len(imgs), len(self.names)
        notes: dict[int, Notes] = {}
        if n == 0:
            return pa.array([], type=self.arrow_type), notes
        # one string of all kinds, sliced per column in C: far cheaper than transposing per row
        all_kinds = "".join(map(_KINDS_OF, imgs))
        all_values = list(map(_VALUES_OF, imgs))
        arrays = []
        for j, (name, codec) in enumerate(zip(self.names, self.codecs, strict=True)):
            kinds = all_kinds[j::ncols]
            # itemgetter in C; zip(*rows) would build a million iterators for a million rows
            raws = list(map(itemgetter(j), all_values))
            if not _KINDS.issuperset(kinds):
                raise DecodeError(f"unknown column kind in column {name}")
            arrays.append(self._column(name, codec, kinds, raws, notes))
        mask = None
        if any(map(is_, images, repeat(None))):  # identity test in C; `None in` would call __eq__
            mask = pa.array([img is None for img in images], type=pa.bool_())
        return pa.StructArray.from_arrays(arrays, fields=list(self.arrow_type), mask=mask), notes

    @staticmethod
    def _column(name: str, codec: Codec, kinds: str, raws: Sequence[bytes | None],
                notes: dict[int, Notes]) -> pa.Array:
        if isinstance(codec, DecimalCodec):
            arr, specials = codec.column_with_notes(kinds, raws)
            for i, text in specials.items():
                notes.setdefault(i, {})[name] = text
            return arr
        arr = codec.arrow_column(kinds, raws)
        if arr is not None:
            return arr
        values: list[Any] = [None] * len(raws)
        for i, (k, raw) in enumerate(zip(kinds, raws, strict=True)):
            if k == "b" or k == "t":
                row_notes: Notes = {}
                values[i] = codec.arrow(k, raw, row_notes, name)
                if row_notes:
                    notes.setdefault(i, {}).update(row_notes)
        try:
            return pa.array(values, type=codec.arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            raise DecodeError(f"value of column {name} does not fit {codec.arrow_type}") from None

    def notes(self, images: Sequence[TupleData | None]) -> list[Notes]:
        return self.to_arrow_with_notes(images)[1]

    def unchanged_toast(self, images: Sequence[TupleData | None]) -> list[list[str]]:
        """Per image, the names of columns sent as 'u' (empty for a None image)."""
        names = self.names
        return [[] if img is None or "u" not in img.kinds else [names[i] for i, k in enumerate(img.kinds) if k == "u"]
                for img in images]

    def to_python(self, image: TupleData) -> tuple[Any, ...]:
        (img,) = self._check([image])
        return tuple(
            UNCHANGED_TOAST if k == "u" else None if k == "n" else codec.python(k, raw)
            for codec, k, raw in zip(self.codecs, img.kinds, img.values, strict=True))
