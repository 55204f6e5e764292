"""PostgreSQL execution of schema-change plans (``apply/schema_changes.py``): ALTER TABLE statements.

The catalog facts planning needs (column types, the columns every INSERT must set) come from
``catalog.describe``; the statements run in the batch transaction (``frame.begin_batch``).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg2 import sql

from airflow_provider_pglogical.apply.schema_changes import ADD, RELAX, WIDEN, ColumnChange
from airflow_provider_pglogical.apply.targets.postgres.catalog import ident


def alter_statements(qualified: str, changes: Sequence[ColumnChange]) -> list[sql.Composable]:
    """ALTER TABLE statements for the changes, in plan order; types are the source's ``format_type`` text (exact)."""
    out: list[sql.Composable] = []
    for ch in changes:
        col = sql.Identifier(ch.column)
        if ch.kind == ADD and ch.default is not None:
            # Rows already in the target read the source's default (a fast default, no rewrite);
            # the target keeps no default of its own, as for a column added without one.
            out.append(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {} DEFAULT {}::{}").format(
                ident(qualified), col, sql.SQL(str(ch.new_type)), sql.Literal(ch.default), sql.SQL(str(ch.new_type))))
            stmt = sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(ident(qualified), col)
        elif ch.kind == ADD:
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
