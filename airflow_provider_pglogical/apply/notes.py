"""Exactness notes (docs/types.md) carried through the apply pipeline next to the values they complete.

Staged images keep a numeric NaN of a ``numeric(p,s)`` column as a null decimal plus the note
``col → "NaN"``, and an array that is multi-dimensional or does not start at 1 as its flat elements
plus ``col → "[0:1][-2:0]"``; a NaN element of a numeric array is a null element plus
``col[i] → "NaN"``. The notes live in per-image maps beside ``old``/``new``, but compaction picks
each column's value from a different change, so a note must travel *inside* its value:

1. ``inherit_toast_notes`` (before ``resolve_toast_from_old``): an unchanged-TOAST column that
   gets its value from the old image gets that image's notes too.
2. ``fold_notes`` (after the row filter, which must see the typed values): every decimal or array
   column of both images becomes ``struct<value, note[, element_notes]>``. The later steps move
   columns around without looking inside, and ``copytext`` writes the note instead of the value.

Notes at deeper paths (composite fields, range bounds, arrays of composites) are not folded, so
copytext writes those values without them (a NULL field, an unbounded side, a flat array; docs/apply.md).
"""

from __future__ import annotations

from typing import TypeGuard

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, DecimalType, StructType

from airflow_provider_pglogical.apply.batches import image_type
from airflow_provider_pglogical.apply.meta import META

VALUE, NOTE, ELEMENT_NOTES = "_pgl_value", "_pgl_note", "_pgl_element_notes"
NOTES_TYPE = "map<string,string>"


def _notes(image: str) -> Column:
    return F.coalesce(F.col(f"{META}{image}_value_notes"), F.create_map().cast(NOTES_TYPE))


def can_have_notes(dtype: DataType) -> bool:
    return isinstance(dtype, (DecimalType, ArrayType))


def is_folded(dtype: DataType) -> TypeGuard[StructType]:
    """A value folded with its exactness notes: ``struct<_pgl_value, _pgl_note[, _pgl_element_notes]>``."""
    names = [f.name for f in dtype.fields] if isinstance(dtype, StructType) else []
    return names in ([VALUE, NOTE], [VALUE, NOTE, ELEMENT_NOTES])


def inherit_toast_notes(df: DataFrame) -> DataFrame:
    """Step: new-image notes of 'u' columns from the old image (where the old image has the column).

    pgoutput never sends notes for a 'u' column, so no key can collide. Where the old image lacks
    the column (key-only image, non-key column) it has no notes for it either, matching what
    ``resolve_toast_from_old`` fills.
    """
    toast = F.coalesce(F.col(META + "new_unchanged_toast"), F.array().cast("array<string>"))

    def of_toast_column(path: Column) -> Column:
        return F.exists(toast, lambda c: (path == c) | path.startswith(F.concat(c, F.lit("[")))
                        | path.startswith(F.concat(c, F.lit("."))))

    inherited = F.map_filter(_notes("old"), lambda k, _v: of_toast_column(k))
    return df.withColumn(META + "new_value_notes",
                         F.when(F.size(toast) > 0, F.map_concat(_notes("new"), inherited)).otherwise(_notes("new")))


def _fold(value: Column, name: str, dtype: DataType, notes: Column) -> Column:
    whole = F.try_element_at(notes, F.lit(name)).alias(NOTE)
    if not isinstance(dtype, ArrayType):
        return F.struct(value.alias(VALUE), whole)
    prefix = F.lit(name + "[")
    has_element_notes = F.exists(F.map_keys(notes), lambda k: k.startswith(prefix))
    per_element = F.transform(value, lambda _x, i: F.try_element_at(
        notes, F.concat(prefix, i.cast("string"), F.lit("]"))))
    return F.struct(value.alias(VALUE), whole,
                    F.when(has_element_notes, per_element).alias(ELEMENT_NOTES))


def fold_notes(df: DataFrame) -> DataFrame:
    """Step: decimal and array columns of ``old``/``new`` become ``struct<value, note[, element_notes]>``.

    ``note`` is the whole-column note (``NaN``, or the array's dimension decoration);
    ``element_notes`` is aligned with the flat elements (null when the value has none).
    """
    for image in ("old", "new"):
        img = F.col(META + image)
        fields = image_type(df, image).fields
        if not any(can_have_notes(f.dataType) for f in fields):
            continue
        notes = _notes(image)
        folded = F.struct(*[
            (_fold(img.getField(f.name), f.name, f.dataType, notes) if can_have_notes(f.dataType)
             else img.getField(f.name)).alias(f.name) for f in fields])
        df = df.withColumn(META + image, F.when(img.isNull(), F.lit(None)).otherwise(folded))
    return df
