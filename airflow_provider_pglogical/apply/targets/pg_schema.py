"""PostgreSQL execution of schema-change plans (``apply/schema_changes.py``): catalog facts in, ALTER TABLE out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg2 import sql

from airflow_provider_pglogical.apply.schema_changes import ADD, RELAX, WIDEN, ColumnChange
from airflow_provider_pglogical.apply.targets.postgres import TargetTable, ident, split_name


def not_null_without_default(conn: Any, qualified: str) -> list[str]:
    """Columns of the target that every INSERT must set: NOT NULL, no default, not generated, not identity,
    not in the primary key (whose NOT NULL cannot be dropped)."""
    schema, name = split_name(qualified)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s "
            "AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull AND NOT a.atthasdef "
            "AND a.attidentity = '' AND a.attgenerated = '' AND NOT EXISTS (SELECT FROM pg_index i "
            "WHERE i.indrelid = c.oid AND i.indisprimary AND a.attnum = ANY(i.indkey)) ORDER BY a.attnum",
            (schema, name))
        return [r[0] for r in cur.fetchall()]


def planned_table(target: TargetTable, changes: Sequence[ColumnChange]) -> TargetTable:
    """The target table as it will be once ``changes`` ran (staging tables and COPY text use these types)."""
    columns = dict(target.columns)
    for ch in changes:
        if ch.kind in (ADD, WIDEN) and ch.new_type is not None:
            columns[ch.column] = ch.new_type
    return TargetTable(target.qualified, columns, target.primary_key)


def alter_statements(qualified: str, changes: Sequence[ColumnChange]) -> list[sql.Composable]:
    """One ALTER TABLE per change, in plan order; types are the source's ``format_type`` text (exact)."""
    out: list[sql.Composable] = []
    for ch in changes:
        col = sql.Identifier(ch.column)
        if ch.kind == ADD:
            stmt = sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                ident(qualified), col, sql.SQL(str(ch.new_type)))
        elif ch.kind == WIDEN:
            stmt = sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(ident(qualified), col,
                                                                           sql.SQL(str(ch.new_type)))
        elif ch.kind == RELAX:
            stmt = sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL").format(ident(qualified), col)
        else:
            raise ValueError(f"unknown column change {ch.kind!r}")
        out.append(stmt)
    return out
