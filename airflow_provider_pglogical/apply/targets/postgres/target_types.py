"""Target column types as small trees, for what a staged Spark type cannot tell by itself.

A multirange and an array of ranges are both staged as ``list<range struct>``, and their input
functions share no syntax (``{[1,3),[5,7)}`` against ``{"[1,3)","[5,7)"}``); only the target
catalog knows which one a column, a composite field or an array element is. A composite whose
fields happen to look like a staged interval/timetz/range struct is told apart the same way.
Same for ``money``, staged as int64 minor units like a bigint, and ``pg_lsn``, staged as ``uint64`` (which
Spark reads as ``decimal(20,0)``) but read by its input function only as ``X/X`` hex. Domains are looked through; other
scalar types need no tree and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from psycopg2.extensions import connection

ARRAY, COMPOSITE, RANGE, MULTIRANGE, MONEY, SCALAR = "array", "composite", "range", "multirange", "money", "scalar"
PG_LSN = "pg_lsn"
_MONEY_OID = 790  # staged as int64 minor units, like a bigint: only the target type tells them apart
_PG_LSN_OID = 3220  # a decimal(20,0) in Spark, like numeric(20,0): only the target type tells them apart

# One level of the type graph per round trip: kind, domain base, array element, composite fields.
# ``typlen = -1`` keeps fixed-size types with a typelem (point, name) out of the arrays.
_LEVEL_QUERY = """
SELECT t.oid::int8, t.typtype::text, t.typbasetype::int8,
       CASE WHEN t.typelem <> 0 AND t.typlen = -1 THEN t.typelem::int8 END,
       ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a
             WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum),
       ARRAY(SELECT a.atttypid::int8 FROM pg_catalog.pg_attribute a
             WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum)
FROM pg_catalog.pg_type t WHERE t.oid = ANY(%s::oid[])
"""


# One ``_LEVEL_QUERY`` row after its oid: typtype, domain base, array element (or None), field names, field oids.
LevelRow = tuple[str, int, int | None, list[str], list[int]]


@dataclass(frozen=True)
class PgType:
    kind: str
    element: PgType | None = None  # ARRAY
    fields: tuple[tuple[str, PgType], ...] = ()  # COMPOSITE, attribute order

    def field(self, name: str) -> PgType | None:
        return next((t for n, t in self.fields if n == name), None)


def build_tree(oid: int, rows: dict[int, LevelRow], depth: int = 0) -> PgType:
    """The tree of ``oid`` from ``_LEVEL_QUERY`` rows (oid → (typtype, base, element, names, field oids))."""
    row = rows.get(oid)
    if row is None or depth > 32:  # PostgreSQL forbids a composite containing itself; this is only a guard
        return PgType(SCALAR)
    typtype, base, element, names, field_oids = row
    if typtype == "d":
        return build_tree(base, rows, depth + 1)
    if element is not None:
        return PgType(ARRAY, element=build_tree(element, rows, depth + 1))
    if typtype == "c":
        return PgType(COMPOSITE, fields=tuple((n, build_tree(f, rows, depth + 1))
                                              for n, f in zip(names, field_oids, strict=True)))
    if oid == _MONEY_OID:
        return PgType(MONEY)
    if oid == _PG_LSN_OID:
        return PgType(PG_LSN)
    return PgType({"r": RANGE, "m": MULTIRANGE}.get(typtype, SCALAR))


def describe_types(conn: connection, columns: Iterable[tuple[str, str]]) -> dict[str, PgType]:
    """``(column, format_type text)`` pairs → trees of the columns whose type is not a scalar.

    Runs a few catalog queries in the caller's transaction (names resolve by its search_path,
    as ``format_type`` printed them).
    """
    columns = list(columns)
    rows: dict[int, LevelRow] = {}
    with conn.cursor() as cur:
        cur.execute("SELECT n, n::regtype::oid::int8 FROM unnest(%s::text[]) AS n", (sorted({t for _, t in columns}),))
        oid_of = dict(cur.fetchall())
        todo = set(oid_of.values())
        while todo:
            cur.execute(_LEVEL_QUERY, (sorted(todo),))
            for oid, typtype, base, element, names, field_oids in cur.fetchall():
                rows[oid] = (typtype, base, element, names, field_oids)
            children = {o for oid in todo if oid in rows
                        for o in (rows[oid][1], rows[oid][2], *rows[oid][4]) if o}
            todo = children - rows.keys()
    trees = {name: build_tree(oid_of[t], rows) for name, t in columns}
    return {name: tree for name, tree in trees.items() if tree.kind != SCALAR}
