"""TypeCatalog: what the decoder knows about user-defined types (OID ≥ 10000). Pure data, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_pglogical.decoding.model import TypeInfo
from airflow_provider_pglogical.decoding.values import oids

ENUM, DOMAIN, COMPOSITE, RANGE, MULTIRANGE, ARRAY, TEXT_ONLY, OPAQUE = (
    "enum", "domain", "composite", "range", "multirange", "array", "text", "opaque")


@dataclass(frozen=True, slots=True)
class UserType:
    """One user type. ``kind`` picks which of the other fields matter:

    enum: ``labels``; domain: ``base_oid``/``base_typmod``; composite: ``field_*``; range:
    ``subtype_oid``; multirange: ``range_oid``; array: ``element_oid``; text: a base type without a
    send function (always sent as text); opaque: a base type with an unknown send format.
    """

    oid: int
    kind: str
    name: str = ""  # qualified, e.g. "public.mood"
    base_oid: int = 0
    base_typmod: int = -1
    field_names: tuple[str, ...] = ()
    field_oids: tuple[int, ...] = ()
    field_typmods: tuple[int, ...] = ()
    subtype_oid: int = 0
    range_oid: int = 0
    element_oid: int = 0
    labels: tuple[str, ...] = ()


# Built-in type names as Type ('Y') messages spell the base type of a domain (pg_catalog only).
BUILTIN_BY_NAME = {
    "bool": oids.BOOL, "bytea": oids.BYTEA, "char": oids.CHAR, "name": oids.NAME, "int8": oids.INT8,
    "int2": oids.INT2, "int4": oids.INT4, "text": oids.TEXT, "oid": oids.OID, "json": oids.JSON,
    "xml": oids.XML, "float4": oids.FLOAT4, "float8": oids.FLOAT8, "macaddr8": oids.MACADDR8,
    "money": oids.MONEY, "macaddr": oids.MACADDR, "cidr": oids.CIDR, "inet": oids.INET,
    "bpchar": oids.BPCHAR, "varchar": oids.VARCHAR, "date": oids.DATE, "time": oids.TIME,
    "timestamp": oids.TIMESTAMP, "timestamptz": oids.TIMESTAMPTZ, "interval": oids.INTERVAL,
    "timetz": oids.TIMETZ, "bit": oids.BIT, "varbit": oids.VARBIT, "numeric": oids.NUMERIC,
    "uuid": oids.UUID, "pg_lsn": oids.PG_LSN, "jsonb": oids.JSONB, "int4range": oids.INT4RANGE,
    "numrange": oids.NUMRANGE, "tsrange": oids.TSRANGE, "tstzrange": oids.TSTZRANGE,
    "daterange": oids.DATERANGE, "int8range": oids.INT8RANGE,
}

_COLUMNS = ("oid", "nspname", "typname", "typtype", "typbasetype", "typtypmod", "typelem", "is_array",
            "has_send", "labels", "field_names", "field_oids", "field_typmods", "range_subtype",
            "multirange_range")


class TypeCatalog:
    """User types by OID, plus a per-catalog cache of the codecs built from them."""

    # One round trip: the requested OIDs and, recursively, every user type they are built from
    # (domain bases, array elements, composite fields, range subtypes, multirange ranges).
    CATALOG_QUERY = """
WITH RECURSIVE closure(oid) AS (
    SELECT unnest(%(oids)s::oid[])
  UNION
    SELECT d.dep
    FROM closure c
    JOIN pg_catalog.pg_type t ON t.oid = c.oid
    CROSS JOIN LATERAL (
        SELECT t.typbasetype
        UNION ALL SELECT t.typelem
        UNION ALL SELECT a.atttypid FROM pg_catalog.pg_attribute a
                  WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
        UNION ALL SELECT r.rngsubtype FROM pg_catalog.pg_range r WHERE r.rngtypid = t.oid
        UNION ALL SELECT r.rngtypid FROM pg_catalog.pg_range r WHERE r.rngmultitypid = t.oid
    ) AS d(dep)
    WHERE d.dep >= {first_user_oid}
)
SELECT t.oid::int8 AS oid, n.nspname::text, t.typname::text, t.typtype::text,
       t.typbasetype::int8, t.typtypmod, t.typelem::int8,
       (t.typlen = -1 AND t.typelem <> 0
        AND t.typsubscript = 'pg_catalog.array_subscript_handler'::regproc) AS is_array,
       t.typsend <> 0 AS has_send,
       ARRAY(SELECT e.enumlabel::text FROM pg_catalog.pg_enum e
             WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder) AS labels,
       ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a
             WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum) AS field_names,
       ARRAY(SELECT a.atttypid::int8 FROM pg_catalog.pg_attribute a
             WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum) AS field_oids,
       ARRAY(SELECT a.atttypmod FROM pg_catalog.pg_attribute a
             WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum) AS field_typmods,
       (SELECT r.rngsubtype::int8 FROM pg_catalog.pg_range r WHERE r.rngtypid = t.oid) AS range_subtype,
       (SELECT r.rngtypid::int8 FROM pg_catalog.pg_range r WHERE r.rngmultitypid = t.oid) AS multirange_range
FROM closure c
JOIN pg_catalog.pg_type t ON t.oid = c.oid
JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
ORDER BY t.oid
""".replace("{first_user_oid}", str(oids.FIRST_USER_OID))

    def __init__(self, types: Iterable[UserType] = ()) -> None:
        self.types: dict[int, UserType] = {t.oid: t for t in types}
        self.codec_cache: dict[tuple[int, int], Any] = {}

    def get(self, oid: int) -> UserType | None:
        return self.types.get(oid)

    def __contains__(self, oid: object) -> bool:
        return oid in self.types

    def __len__(self) -> int:
        return len(self.types)

    def merged(self, other: TypeCatalog) -> TypeCatalog:
        """A new catalog; ``other`` wins where both describe an OID."""
        return TypeCatalog([*self.types.values(), *other.types.values()])

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> TypeCatalog:
        """Build from the rows of ``CATALOG_QUERY`` (tuples in its column order, or mappings)."""
        types = []
        for row in rows:
            r = dict(row) if isinstance(row, Mapping) else dict(zip(_COLUMNS, row, strict=True))
            types.append(_from_row(r))
        return cls(types)

    @classmethod
    def from_type_messages(cls, type_infos: Iterable[TypeInfo]) -> TypeCatalog:
        """Fallback from Type ('Y') messages, which name only the *base* type: a domain over a
        built-in type decodes as that type (its typmod unknown, so numeric stays exact text)."""
        types = []
        for info in type_infos:
            if info.oid < oids.FIRST_USER_OID or info.namespace not in ("", "pg_catalog"):
                continue
            base = BUILTIN_BY_NAME.get(info.name)
            if base is None and info.name.startswith("_") and info.name[1:] in BUILTIN_BY_NAME:
                array_oid = next(a for a, e in oids.ARRAY_ELEMENT.items() if e == BUILTIN_BY_NAME[info.name[1:]])
                base = array_oid
            if base is not None:
                types.append(UserType(info.oid, DOMAIN, name=f"pg_catalog.{info.name}", base_oid=base))
        return cls(types)


def _from_row(r: dict[str, Any]) -> UserType:
    oid, typtype = int(r["oid"]), r["typtype"]
    name = f"{r['nspname']}.{r['typname']}"
    if typtype == "e":
        return UserType(oid, ENUM, name, labels=tuple(r["labels"] or ()))
    if typtype == "d":
        return UserType(oid, DOMAIN, name, base_oid=int(r["typbasetype"]), base_typmod=int(r["typtypmod"]))
    if typtype == "c":
        return UserType(oid, COMPOSITE, name, field_names=tuple(r["field_names"] or ()),
                        field_oids=tuple(int(x) for x in r["field_oids"] or ()),
                        field_typmods=tuple(int(x) for x in r["field_typmods"] or ()))
    if typtype == "r":
        return UserType(oid, RANGE, name, subtype_oid=int(r["range_subtype"]))
    if typtype == "m":
        return UserType(oid, MULTIRANGE, name, range_oid=int(r["multirange_range"]))
    if r["is_array"]:
        return UserType(oid, ARRAY, name, element_oid=int(r["typelem"]))
    return UserType(oid, TEXT_ONLY if not r["has_send"] else OPAQUE, name)


__all__ = ["TypeCatalog", "UserType"]
