"""Picks the codec for a (type OID, typmod): built-ins by OID, user types through the TypeCatalog."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from airflow_provider_pglogical.decoding.model import ColumnDef
from airflow_provider_pglogical.decoding.values import catalog as cat
from airflow_provider_pglogical.decoding.values import oids
from airflow_provider_pglogical.decoding.values.arrays import ArrayCodec
from airflow_provider_pglogical.decoding.values.catalog import TypeCatalog
from airflow_provider_pglogical.decoding.values.codec import Codec
from airflow_provider_pglogical.decoding.values.composite import CompositeCodec
from airflow_provider_pglogical.decoding.values.interval import IntervalCodec
from airflow_provider_pglogical.decoding.values.network import InetCodec
from airflow_provider_pglogical.decoding.values.numeric import numeric_codec
from airflow_provider_pglogical.decoding.values.ranges import MultirangeCodec, RangeCodec
from airflow_provider_pglogical.decoding.values.scalars import (
    BoolCodec,
    Float4Codec,
    Float8Codec,
    Int2Codec,
    Int4Codec,
    Int8Codec,
    MoneyCodec,
    OidCodec,
    PgLsnCodec,
)
from airflow_provider_pglogical.decoding.values.temporal import DateCodec, TimeCodec, TimestampCodec, TimetzCodec
from airflow_provider_pglogical.decoding.values.text import (
    BitCodec,
    ByteaCodec,
    CharCodec,
    JsonbCodec,
    MacaddrCodec,
    RawCodec,
    TextCodec,
    TextOnlyCodec,
    UuidCodec,
)
from airflow_provider_pglogical.exceptions import DecodeError

# Built-ins whose codec ignores the typmod (varchar(n), bit(n), timestamp(p) change nothing we decode)
_SIMPLE: dict[int, Codec] = {
    oids.BOOL: BoolCodec(), oids.INT2: Int2Codec(), oids.INT4: Int4Codec(), oids.INT8: Int8Codec(),
    oids.OID: OidCodec(), oids.FLOAT4: Float4Codec(), oids.FLOAT8: Float8Codec(), oids.MONEY: MoneyCodec(),
    oids.PG_LSN: PgLsnCodec(), oids.TEXT: TextCodec("text"), oids.VARCHAR: TextCodec("varchar"),
    oids.BPCHAR: TextCodec("bpchar"), oids.NAME: TextCodec("name"), oids.JSON: TextCodec("json"),
    oids.XML: TextCodec("xml"), oids.JSONB: JsonbCodec(), oids.CHAR: CharCodec(), oids.BYTEA: ByteaCodec(),
    oids.UUID: UuidCodec(), oids.BIT: BitCodec("bit"), oids.VARBIT: BitCodec("varbit"),
    oids.MACADDR: MacaddrCodec("macaddr", 6), oids.MACADDR8: MacaddrCodec("macaddr8", 8),
    oids.INET: InetCodec(False), oids.CIDR: InetCodec(True), oids.DATE: DateCodec(), oids.TIME: TimeCodec(),
    oids.TIMETZ: TimetzCodec(), oids.TIMESTAMP: TimestampCodec(False), oids.TIMESTAMPTZ: TimestampCodec(True),
    oids.INTERVAL: IntervalCodec(),
}
_RAW = RawCodec()
_MAX_DEPTH = 32  # guards against a malformed catalog that describes a cycle


def codec_for(type_oid: int, typmod: int, catalog: TypeCatalog | None, _depth: int = 0) -> Codec:
    """The codec of one column (or nested element); cached per catalog."""
    if catalog is None:
        catalog = _EMPTY
    key = (type_oid, typmod)
    codec = catalog.codec_cache.get(key)
    if codec is None:
        if _depth > _MAX_DEPTH:
            raise DecodeError("type catalog nests too deeply")
        codec = _build(type_oid, typmod, catalog, _depth + 1)
        catalog.codec_cache[key] = codec
    return codec


def _build(oid: int, typmod: int, catalog: TypeCatalog, depth: int) -> Codec:
    simple = _SIMPLE.get(oid)
    if simple is not None:
        return simple
    if oid == oids.NUMERIC:
        return numeric_codec(typmod)
    if oid in oids.ARRAY_ELEMENT:  # an array column's typmod is its element's
        return ArrayCodec(codec_for(oids.ARRAY_ELEMENT[oid], typmod, catalog, depth))
    if oid in oids.RANGE_SUBTYPE:
        return RangeCodec(_builtin_name(oid), codec_for(oids.RANGE_SUBTYPE[oid], -1, catalog, depth))
    if oid in oids.MULTIRANGE_RANGE:
        rng = codec_for(oids.MULTIRANGE_RANGE[oid], -1, catalog, depth)
        return MultirangeCodec(_builtin_name(oid), rng) if isinstance(rng, RangeCodec) else _RAW
    ut = catalog.get(oid)
    if ut is None:
        return _RAW
    if ut.kind == cat.ENUM:
        return TextCodec(ut.name or "enum")
    if ut.kind == cat.DOMAIN:
        return codec_for(ut.base_oid, typmod if typmod != -1 else ut.base_typmod, catalog, depth)
    if ut.kind == cat.ARRAY:
        return ArrayCodec(codec_for(ut.element_oid, typmod, catalog, depth))
    if ut.kind == cat.COMPOSITE:
        fields = [(n, codec_for(o, m, catalog, depth))
                  for n, o, m in zip(ut.field_names, ut.field_oids, ut.field_typmods, strict=True)]
        return CompositeCodec(ut.name, fields)
    if ut.kind == cat.RANGE:
        return RangeCodec(ut.name, codec_for(ut.subtype_oid, -1, catalog, depth))
    if ut.kind == cat.MULTIRANGE:
        rng = codec_for(ut.range_oid, -1, catalog, depth)
        return MultirangeCodec(ut.name, rng) if isinstance(rng, RangeCodec) else _RAW
    if ut.kind == cat.TEXT_ONLY:
        return TextOnlyCodec(ut.name)
    return _RAW


def _builtin_name(oid: int) -> str:
    return next((n for n, o in cat.BUILTIN_BY_NAME.items() if o == oid), "range")


_EMPTY = TypeCatalog()


def arrow_type_for(column: ColumnDef, catalog: TypeCatalog | None = None) -> pa.DataType:
    """The Arrow type of a column's values (see docs/types.md)."""
    return codec_for(column.type_oid, column.type_modifier, catalog).arrow_type


def decode_value(kind: str, raw: bytes, column: ColumnDef, catalog: TypeCatalog | None = None) -> Any:
    """One 't' or 'b' value as an exact Python value; raises DecodeError on malformed bytes."""
    return codec_for(column.type_oid, column.type_modifier, catalog).python(kind, raw)
