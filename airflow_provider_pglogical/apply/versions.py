"""A table-batch staged under several schema versions of one table, in this process: the versions' files unioned
by column name exactly as ``batches.read_changes`` unions them for Spark, so the Arrow kernels net them
(``kernels.compact_changes``) as Spark's transforms net the union.

Per staged file (one schema version), as Spark's reader does it (``batches._with_source_defaults``,
``_as_text_where_types_conflict``, ``_with_absent`` and ``unionByName``):

* a column the file's new image lacks but the last version holding it has a fast default for (``missing``,
  ``schema_changes.missing_value``) gets that default in every non-null new image, typed as the first file holding
  the column types it, and in every full old image (not a key-only one), for the types Spark casts exactly from
  PostgreSQL's text (``from_text``); the others stay null. A column every file holds keeps its values: its default is never read (Spark reads it only where lacking);
* every image is cast to the union's struct: missing fields null, each field of the widest type any version gives
  it (``widest``: integers, floats, decimals of at most 38 digits, as Spark's union widens them);
* ``ABSENT`` lists the columns of the union the file's new image lacks after the defaults: an UPDATE leaves them
  alone (the kernels add them to its keep list, as ``transforms._kept`` does), an INSERT writes their null.

A type change Spark turns into text (``integer`` → ``text``), an image that is not a struct, or a default some file
lacks whose text Arrow does not cast as Spark does leaves the table-batch to Spark (``union_of`` gives None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.apply.kernels import field_types
from airflow_provider_pglogical.apply.schema_changes import missing_value
from airflow_provider_pglogical.apply.staged_arrow import castable_from_text, spark_type
from airflow_provider_pglogical.staging.reader import RelationInfo

# The conformed staged table's column of the columns each change's schema version lacks (list<string>).
ABSENT = "absent"
# Spark's widest decimal; a wider union would round (``DecimalType.bounded``).
MAX_DECIMAL_DIGITS = 38
_TRUE, _FALSE = ("t", "true", "y", "yes", "1"), ("f", "false", "n", "no", "0")


@dataclass(frozen=True)
class SchemaUnion:
    """The union of a table-batch's staged schema versions: the images' struct types, the fast defaults rows of a
    version lacking the column get (name, value of the union's type), and every new-image column of any version."""

    old: pa.StructType
    new: pa.StructType
    defaults: tuple[tuple[str, pa.Scalar], ...]
    columns: tuple[str, ...]

    def staged_schema(self, schema: pa.Schema) -> pa.Schema:
        """A staged file's schema once conformed (``conform``)."""
        out = schema.set(schema.get_field_index("old"), pa.field("old", self.old))
        out = out.set(out.get_field_index("new"), pa.field("new", self.new))
        return out.append(pa.field(ABSENT, pa.list_(pa.string())))


def _struct(schema: pa.Schema, image: str) -> pa.StructType | None:
    dtype = schema.field(image).type if image in schema.names else None
    return dtype if isinstance(dtype, pa.StructType) else None


def widest(types: Sequence[pa.DataType]) -> pa.DataType | None:
    """The type Spark's union gives a column staged as ``types`` by several versions, when the cast to it is exact
    and Arrow's: signed integers to the widest, floats to double if any is, decimals to the scale and integer digits
    of the widest (at most ``MAX_DECIMAL_DIGITS``). None for any other mix (Spark unions it as text, or rounds)."""
    first = types[0]
    if all(t == first for t in types):
        return first
    if all(pa.types.is_signed_integer(t) for t in types):
        return max(types, key=lambda t: t.bit_width)
    if all(pa.types.is_float32(t) or pa.types.is_float64(t) for t in types):
        return pa.float64()
    if all(isinstance(t, pa.Decimal128Type) for t in types):
        scale = max(t.scale for t in types)
        digits = max(t.precision - t.scale for t in types) + scale
        return pa.decimal128(digits, scale) if digits <= MAX_DECIMAL_DIGITS else None
    return None


def from_text(dtype: pa.DataType, text: str) -> pa.Scalar | None:
    """PostgreSQL's text output ``text`` of a fast default as a value of the staged type ``dtype``, where Spark's
    cast of it is exact (``staged_arrow.castable_from_text``, the list Spark's reader follows); None where Spark
    leaves the column null. ValueError where Arrow's value would differ from Spark's: a type Spark reads as another
    (unsigned integers widened, decimals of more than 38 digits as text), a boolean word Spark does not take, a
    number Arrow does not cast."""
    if not castable_from_text(spark_type(dtype), text):
        return None
    if spark_type(dtype) != dtype:
        raise ValueError(text)
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return pa.scalar(text, dtype)
    if pa.types.is_boolean(dtype):
        word = text.strip().lower()
        if word not in _TRUE + _FALSE:
            raise ValueError(text)
        return pa.scalar(word in _TRUE, dtype)
    try:
        return pc.cast(pa.scalar(text), dtype)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ValueError(text) from None


def union_of(schemas: Sequence[pa.Schema], versions: Sequence[tuple[int, RelationInfo]]) -> SchemaUnion | None:
    """The union of the staged files' ``schemas`` (file order) given the batch's schema versions of the table
    (``batches.read_relation_versions``: their fast defaults), or None when Spark's union is not reproduced here."""
    olds = [_struct(s, "old") for s in schemas]
    news = [_struct(s, "new") for s in schemas]
    if not all(isinstance(t, pa.StructType) for t in [*olds, *news]):
        return None
    new_fields = [field_types(t) for t in news if t is not None]
    old_fields = [field_types(t) for t in olds if t is not None]
    first_type: dict[str, pa.DataType] = {}
    for fields in new_fields:
        for name, dtype in fields.items():
            first_type.setdefault(name, dtype)
    last = {c.name: c for _, rel in versions for c in rel.columns}  # a dropped column has its last version's
    lacking = {name for fields in new_fields for name in first_type if name not in fields}
    defaults: dict[str, pa.Scalar] = {}
    for name, column in last.items():
        text = missing_value(column.missing)
        if text is None or name not in lacking:  # a column every file holds never reads its default
            continue
        try:
            value = from_text(first_type[name], text)
        except ValueError:
            return None
        if value is not None:
            defaults[name] = value
    filled = [{**fields, **{c: first_type[c] for c in defaults if c not in fields}} for fields in new_fields]
    old, new = _widened(old_fields), _widened(filled)
    if old is None or new is None:
        return None
    new_types = field_types(new)
    return SchemaUnion(old, new, tuple((c, v.cast(new_types[c])) for c, v in defaults.items()),
                       tuple(new_types))


def _widened(per_file: Sequence[dict[str, pa.DataType]]) -> pa.StructType | None:
    """One struct of every field of ``per_file`` (first-seen order), each of its ``widest`` type."""
    seen: dict[str, list[pa.DataType]] = {}
    for fields in per_file:
        for name, dtype in fields.items():
            seen.setdefault(name, []).append(dtype)
    out = []
    for name, types in seen.items():
        dtype = widest(types)
        if dtype is None:
            return None
        out.append(pa.field(name, dtype))
    return pa.struct(out)


def conform(chunk: pa.Table, union: SchemaUnion) -> pa.Table:
    """Staged changes of one file (one schema version) in the union's layout: images cast to its structs, and
    ``ABSENT``. A column the version lacks reads the source's fast default in the non-null new images and in the
    full old images (not a key-only one: only its key is meaningful), as the rows do on the source after the
    ``ADD COLUMN … DEFAULT``: a row filter over it judges both images alike (``batches._with_source_defaults``)."""
    chunk = chunk.combine_chunks()
    n = chunk.num_rows
    have = field_types(chunk.schema.field("new").type)
    defaults = {c: v for c, v in union.defaults if c not in have}
    absent = [c for c in union.columns if c not in have and c not in defaults]
    key_only = chunk.column("old_key_only")
    full_old = pc.invert(key_only.chunk(0) if key_only.num_chunks else pa.array([], pa.bool_()))
    old = _image(chunk, "old", union.old, defaults, full_old)
    new = _image(chunk, "new", union.new, defaults)
    out = chunk.set_column(chunk.schema.get_field_index("old"), "old", old)
    out = out.set_column(out.schema.get_field_index("new"), "new", new)
    return out.append_column(ABSENT, absent_column(absent, n))


def absent_column(absent: Sequence[str], n: int) -> pa.ListArray:
    """``absent`` as the list of each of ``n`` rows, built from offsets over the names repeated (no Python list per
    row: ``absent_column_reference``)."""
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * len(absent))
    names = pa.array(absent, pa.string()).take(pa.array(np.tile(np.arange(len(absent)), n)))
    return pa.ListArray.from_arrays(offsets, names, type=pa.list_(pa.string()))


def absent_column_reference(absent: Sequence[str], n: int) -> pa.ListArray:
    """``absent_column`` one Python list per row: the reference it is compared with."""
    return pa.array([list(absent)] * n, pa.list_(pa.string()))


def _image(chunk: pa.Table, image: str, struct: pa.StructType, defaults: dict[str, pa.Scalar],
           filled: pa.BooleanArray | None = None) -> pa.Array:
    """The chunk's ``image`` column as ``struct``: its fields cast, the others ``defaults`` (in the rows ``filled``
    holds; None: all) or null."""
    column = chunk.column(image)
    array = column.chunk(0) if column.num_chunks else pa.array([], column.type)
    n = len(array)
    have = {array.type.field(i).name: array.field(i) for i in range(array.type.num_fields)}
    fields = []
    for i in range(struct.num_fields):
        f = struct.field(i)
        if f.name in have:
            fields.append(have[f.name].cast(f.type))
        elif f.name in defaults:
            value = pa.repeat(defaults[f.name].cast(f.type), n)
            fields.append(value if filled is None else pc.if_else(filled, value, pa.nulls(n, f.type)))
        else:
            fields.append(pa.nulls(n, f.type))
    return pa.StructArray.from_arrays(fields, fields=list(struct), mask=array.is_null())
