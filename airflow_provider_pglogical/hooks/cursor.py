"""The single row of a query that always returns exactly one (an aggregate, ``SHOW``, ``SELECT f(...)``), typed."""

from __future__ import annotations

from typing import Any, Protocol

from airflow_provider_pglogical.exceptions import PgLogicalError


class RowCursor(Protocol):
    """What ``one_row`` needs of a DB-API cursor (psycopg2's, or any other)."""

    def fetchone(self) -> tuple[Any, ...] | None: ...


def one_row(cur: RowCursor) -> tuple[Any, ...]:
    """The row of the statement ``cur`` just ran; a typed error instead of a ``None`` that a caller would index."""
    row = cur.fetchone()
    if row is None:
        raise PgLogicalError("a query that always returns one row returned none")
    return row
