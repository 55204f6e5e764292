"""Slot rows through ``COPY (SELECT ...) TO STDOUT (FORMAT binary)``, read by the compiled helpers.

The named cursor (``PgLogicalClient._stream_cursor``) is the reference path: psycopg2 fetches text,
so every bytea arrives hex-encoded and is decoded, and each row costs ~2 µs of Python objects.
Binary COPY sends the pgoutput bytes as they are; ``decoding._speedups`` reads a chunk of rows
without the GIL and splits them into the same ``(lsn, xid, data)`` rows (``data`` as ``bytes``).

The compiled module links libpq and reads only connections it opened itself
(``LibpqConnection``): a PGconn may only be handled by the libpq that made it, and psycopg2's may be
another build (psycopg2-binary bundles its own, a source build uses the system's). A
``LibpqConnection`` is opened with the parameters of a psycopg2 connection that is already
connected (``LibpqConnection.like``), so DSNs, Airflow connections, passfiles and TLS settings all
work unchanged. Only when the module is built with libpq; otherwise, and for ``get`` (whose
consumption must stay tied to a transaction the client commits), the cursor path runs.

The COPY runs on a connection of its own: the drain keeps using the hook's session while rows
stream (type catalog lookups when a relation first appears), which a connection in COPY state
cannot serve.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from itertools import chain
from types import TracebackType
from typing import Any, Generic, TypeVar

import psycopg2

from airflow_provider_pglogical.decoding import speedups

log = logging.getLogger(__name__)

SlotRow = tuple[int, int, bytes]

# Keywords psycopg2's libpq reports for every connection (PQconninfo) with these values when nobody set
# them. When the compiled module's libpq is older and lacks one, a default value is left out; any other
# value is a setting that libpq cannot honour, and the connection is not opened (the cursor path runs).
_NEWER_KEYWORD_DEFAULTS = {
    "channel_binding": "prefer", "gssdelegation": "0", "gssencmode": "prefer", "load_balance_hosts": "disable",
    "require_auth": "", "scram_channel_binding": "", "sslcertmode": "allow", "sslnegotiation": "postgres",
    "sslsni": "1", "ssl_min_protocol_version": "TLSv1.2", "ssl_max_protocol_version": "", "sslcompression": "0",
    "target_session_attrs": "any", "min_protocol_version": "", "max_protocol_version": "", "oauth_issuer": "",
    "oauth_client_id": "", "oauth_client_secret": "", "oauth_scope": "",
}


class CopyRefused(Exception):
    """The server answered the COPY with an error before any row (``sqlstate``, ``message``)."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"{sqlstate}: {message.strip()}")
        self.sqlstate, self.message = sqlstate, message


class UnsupportedConnection(Exception):
    """A connection setting the compiled module's libpq does not know (named, without its value)."""


def _compiled() -> Any:
    compiled = speedups.compiled
    return compiled if compiled is not None and hasattr(compiled, "pq_connect") else None


def available() -> bool:
    """Whether slot rows can stream through binary COPY here (compiled module built with libpq)."""
    return _compiled() is not None


def libpq_version() -> int | None:
    """``PQlibVersion()`` of the libpq the compiled module links (e.g. 150018), or None without one."""
    compiled = _compiled()
    return None if compiled is None else int(compiled.pq_lib_version())


def connection_keywords(conn: psycopg2.extensions.connection, known: dict[str, str],
                        **overrides: str) -> dict[str, str]:
    """The libpq keywords of ``conn`` (an open psycopg2 connection) that a libpq knowing ``known`` can take.

    Raises ``UnsupportedConnection`` for a keyword ``known`` lacks whose value is not its default.
    """
    params: dict[str, str] = dict(conn.get_dsn_parameters())
    password = conn.info.password
    if password:
        params["password"] = password
    params.update(overrides)
    unknown = sorted(k for k in params if k not in known)
    refused = [k for k in unknown if _NEWER_KEYWORD_DEFAULTS.get(k) != params[k]]
    if refused:
        raise UnsupportedConnection(f"libpq {libpq_version()} does not know the connection setting(s) "
                                    f"{', '.join(refused)}")
    return {k: v for k, v in params.items() if k in known}


class LibpqConnection:
    """A connection opened by the compiled module's own libpq, in autocommit (each statement its own
    transaction unless a ``BEGIN`` says otherwise). Close it, or use it as a context manager."""

    def __init__(self, keywords: dict[str, str]) -> None:
        compiled = _compiled()
        if compiled is None:
            raise RuntimeError("the compiled COPY reader is not available")
        self._compiled = compiled
        try:
            self.handle: Any = compiled.pq_connect(tuple(keywords), tuple(keywords.values()))
        except OSError as exc:  # as psycopg2.connect fails, so callers handle one error type
            raise psycopg2.OperationalError(str(exc).strip()) from None

    @classmethod
    def like(cls, conn: psycopg2.extensions.connection, **overrides: str) -> LibpqConnection:
        """A new connection with ``conn``'s parameters (host, port, user, password, TLS, ...) and ``overrides``
        (e.g. ``client_encoding``). ``UnsupportedConnection`` when the linked libpq cannot honour them."""
        compiled = _compiled()
        if compiled is None:
            raise RuntimeError("the compiled COPY reader is not available")
        return cls(connection_keywords(conn, compiled.pq_options(), **overrides))

    def execute(self, statements: bytes) -> tuple[str, str] | None:
        """Run ``statements`` (results discarded); None, or ``(sqlstate, message)`` of the first failure."""
        result: tuple[str, str] | None = self._compiled.pq_exec(self.handle, statements)
        return result

    def backend_pid(self) -> int:
        """The server process serving this connection (``PQbackendPID``)."""
        return int(self._compiled.pq_backend_pid(self.handle))

    def close(self) -> None:
        self._compiled.pq_finish(self.handle)

    def __enter__(self) -> LibpqConnection:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def copy_statement(select: bytes) -> bytes:
    return b"COPY (" + select + b") TO STDOUT (FORMAT binary)"


Row = TypeVar("Row")


class RowBlocks(Generic[Row]):
    """Slot rows that also come a list at a time: iterating gives the ``(lsn, xid, data)`` rows,
    ``blocks()`` the lists they were read in (the drain's decoder takes lists, so the rows need not
    pass one by one through a generator per layer). Use one of the two, once; ``close()`` ends the
    read (``blocks``' ``close``: a COPY is cancelled, a connection released)."""

    def __init__(self, blocks: Generator[list[Row], None, None]) -> None:
        self._blocks = blocks
        self._rows = chain.from_iterable(blocks)

    def blocks(self) -> Generator[list[Row], None, None]:
        return self._blocks

    def __iter__(self) -> Iterator[Row]:
        return self._rows

    def __next__(self) -> Row:
        return next(self._rows)

    def close(self) -> None:
        self._blocks.close()


def stream_blocks(conn: LibpqConnection, select: bytes, itersize: int) -> Generator[list[SlotRow], None, None]:
    """Yield the ``(lsn, xid, data)`` rows of ``select`` (three non-null columns: bigint, bigint, bytea) in
    lists of up to ``itersize`` (as the compiled reader returns them).

    ``conn`` must be idle (the COPY is its own transaction). Raises ``CopyRefused`` instead of a
    first list if the server fails the statement, and ``psycopg2.OperationalError`` if the stream
    fails later. Closing the generator early cancels the COPY and leaves ``conn`` idle.
    """
    compiled, handle = conn._compiled, conn.handle
    refused = compiled.copy_start(handle, copy_statement(select))
    if refused is not None:
        raise CopyRefused(*refused)
    done, first, started = False, True, False
    try:
        while not done:
            rows, done, error = compiled.copy_rows(handle, max(int(itersize), 1), first)
            first = False
            if error is not None and not rows and not started:
                # The server starts the COPY before running the query: a failing function (no such
                # slot, publication, ...) answers the first read, before any row.
                raise CopyRefused(*error)
            started = True
            if rows:
                yield rows
            if error is not None:
                sqlstate, message = error
                raise psycopg2.OperationalError(f"COPY of slot rows failed ({sqlstate or 'connection'}): "
                                                f"{message.strip()}")
    finally:
        if not done:
            compiled.copy_cancel(handle)
