"""Small cursor and session helpers shared by the hook and the snapshot readers.

``one_row``: the single row of a query that always returns exactly one (an aggregate, ``SHOW``,
``SELECT f(...)``), typed. ``use_server_encoding``: a session whose client encoding is the server's.
"""

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


class EncodedSession(Protocol):
    """What ``use_server_encoding`` needs of a DB-API connection (psycopg2's)."""

    def cursor(self) -> Any: ...

    def set_client_encoding(self, encoding: str) -> None: ...


def use_server_encoding(conn: EncodedSession) -> None:
    """Set the session's ``client_encoding`` to the server encoding.

    pgoutput sends names and text values, and text COPY sends text, in the client encoding; matching
    the server's makes that conversion a no-op, so the decoder sees the bytes as stored.
    """
    with conn.cursor() as cur:
        cur.execute("SHOW server_encoding")
        conn.set_client_encoding(one_row(cur)[0])
