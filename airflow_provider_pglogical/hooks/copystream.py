"""Slot rows through ``COPY (SELECT ...) TO STDOUT (FORMAT binary)``, read by the compiled helpers.

The named cursor (``PgLogicalClient._stream_cursor``) is the reference path: psycopg2 fetches text,
so every bytea arrives hex-encoded and is decoded, and each row costs ~2 µs of Python objects.
Binary COPY sends the pgoutput bytes as they are; ``decoding._speedups`` reads a chunk of rows from
psycopg2's own libpq connection without the GIL and splits them into the same ``(lsn, xid, data)``
rows (``data`` as ``bytes``). Only when the compiled module is built and binds to psycopg2's libpq;
otherwise, and for ``get`` (whose consumption must stay tied to a transaction the client commits),
the cursor path runs.

The COPY runs on a connection of its own: the drain keeps using the hook's session while rows
stream (type catalog lookups when a relation first appears), which a connection in COPY state
cannot serve.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

import psycopg2

from airflow_provider_pglogical.decoding import speedups

log = logging.getLogger(__name__)

SlotRow = tuple[int, int, bytes]
_bound: bool | None = None


class CopyRefused(Exception):
    """The server answered the COPY with an error before any row (``sqlstate``, ``message``)."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"{sqlstate}: {message.strip()}")
        self.sqlstate, self.message = sqlstate, message


def available() -> bool:
    """Whether slot rows can stream through binary COPY here (compiled module built and bound)."""
    global _bound
    compiled = speedups.compiled
    if compiled is None:
        return False
    if _bound is None:
        try:
            from psycopg2 import _psycopg

            # dlsym through psycopg2's extension finds the libpq it was linked with (wheel or system).
            compiled.bind_libpq(_psycopg.__file__)
            _bound = True
        except (OSError, AttributeError, ImportError) as exc:
            log.warning("compiled COPY reader unavailable (%s); slot rows go through the named cursor", exc)
            _bound = False
    return _bound


def copy_statement(select: bytes) -> bytes:
    return b"COPY (" + select + b") TO STDOUT (FORMAT binary)"


def stream_rows(conn: psycopg2.extensions.connection, select: bytes, itersize: int) -> Generator[SlotRow, None, None]:
    """Yield the ``(lsn, xid, data)`` rows of ``select`` (three non-null columns: bigint, bigint, bytea).

    ``conn`` must be idle and in autocommit (the COPY is its own transaction). Raises
    ``CopyRefused`` instead of a first row if the server fails the statement, and
    ``psycopg2.OperationalError`` if the stream fails later. Closing the generator early cancels
    the COPY and leaves ``conn`` idle.
    """
    compiled = speedups.compiled
    if compiled is None or not available():
        raise RuntimeError("the compiled COPY reader is not available")
    ptr: Any = conn.pgconn_ptr
    refused = compiled.copy_start(ptr, copy_statement(select))
    if refused is not None:
        raise CopyRefused(*refused)
    done, first, started = False, True, False
    try:
        while not done:
            rows, done, error = compiled.copy_rows(ptr, max(int(itersize), 1), first)
            first = False
            if error is not None and not rows and not started:
                # The server starts the COPY before running the query: a failing function (no such
                # slot, publication, ...) answers the first read, before any row.
                raise CopyRefused(*error)
            started = True
            yield from rows
            if error is not None:
                sqlstate, message = error
                raise psycopg2.OperationalError(f"COPY of slot rows failed ({sqlstate or 'connection'}): "
                                                f"{message.strip()}")
    finally:
        if not done and not conn.closed:
            compiled.copy_cancel(ptr)
