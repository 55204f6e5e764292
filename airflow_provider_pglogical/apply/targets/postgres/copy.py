"""Per-batch unlogged staging tables in the PostgreSQL target, filled by the executors with COPY."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence

import psycopg2
import pyarrow as pa
from psycopg2 import sql
from psycopg2.extensions import connection

from airflow_provider_pglogical.apply.targets.base import TargetTable, from_column
from airflow_provider_pglogical.apply.targets.postgres import arrowtext
from airflow_provider_pglogical.apply.targets.postgres.catalog import ident
from airflow_provider_pglogical.apply.targets.postgres.plan import KEEP, LSN, OP, TOUCHED
from airflow_provider_pglogical.exceptions import ApplyError

COPY_CHUNK_ROWS = 20000


def staging_columns(target: TargetTable, key: Sequence[str], columns: Sequence[str]) -> list[tuple[str, str]]:
    """(name, type) after the three meta columns: the moved-from key, the touched flag, then the written columns."""
    return ([(from_column(i), target.columns[k]) for i, k in enumerate(key)] + [(TOUCHED, "boolean")]
            + [(c, target.columns[c]) for c in columns])


def create_staging(conn: connection, staging: str, columns: Sequence[tuple[str, str]]) -> None:
    """A fresh unlogged table: op, keep list, lsn, then ``columns`` (name, type) — target types, no constraints.

    ``columns`` is ``staging_columns`` (net changes) or ``ordered.ordered_columns`` (ordered replay).
    """
    defs = [sql.SQL("{} text, {} text[], {} bigint").format(*map(sql.Identifier, (OP, KEEP, LSN)))]
    defs += [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns]
    with conn.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident(staging)))
        cur.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(ident(staging), sql.SQL(", ").join(defs)))
    conn.commit()


def drop_staging(conn: connection, names: Iterable[str]) -> None:
    with conn.cursor() as cur:
        for name in names:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident(name)))
    conn.commit()


def drop_leftover_staging(conn: connection, schema: str, prefixes: Iterable[str]) -> list[str]:
    """Staging tables in ``schema`` whose names start with one of ``prefixes`` (``plan.staging_prefix``
    of this slot's target tables), dropped: a run that crashed after its COMMIT left them, and the
    rerun skips their batch or snapshot, so nothing else would. Call it holding the slot's lock."""
    dropped = leftover_staging(conn, schema, prefixes)
    with conn.cursor() as cur:
        for name in dropped:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}.{}").format(sql.Identifier(schema), sql.Identifier(name)))
    conn.commit()
    return dropped


def leftover_staging(conn: connection, schema: str, prefixes: Iterable[str]) -> list[str]:
    """Names of the tables in ``schema`` starting with one of ``prefixes`` (inside the caller's transaction)."""
    patterns = sorted({p.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "%" for p in prefixes})
    if not patterns:
        return []
    with conn.cursor() as cur:
        cur.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname LIKE ANY(%s) ORDER BY 1",
                    (schema, patterns))
        return [str(name) for (name,) in cur.fetchall()]


def copy_rows(dsn: str, staging: str, columns: Sequence[str], lines: Iterator[str]) -> int:
    """COPY ready text lines (``copytext.copy_lines``, no line break) into ``staging``; returns the row count.

    Columns are (kind, keep, lsn, *columns). The executors use ``copy_partitions``, which prints typed Arrow
    columns straight into the COPY buffer without making Python strings; this form is for lines built in Python.
    """
    def chunks() -> Iterator[tuple[bytes, int]]:
        while True:
            chunk = [line for _, line in zip(range(COPY_CHUNK_ROWS), lines, strict=False)]
            if not chunk:
                return
            yield ("\n".join(chunk) + "\n").encode(), len(chunk)

    return copy_chunks(dsn, staging, columns, chunks())


class _ChunkReader:
    """The file object ``copy_expert`` reads: each ``read`` returns the next whole chunk (psycopg2 sends what it
    gets, whatever the size asked), so a partition is one COPY statement fed straight from Arrow buffers."""

    def __init__(self, chunks: Iterator[tuple[bytes, int]]) -> None:
        self._chunks, self.rows = chunks, 0
        self.failure: Exception | None = None  # what producing the chunks raised (psycopg2 reports it as a COPY error)

    def read(self, _size: int = -1) -> bytes:
        try:
            for data, rows in self._chunks:
                if data:
                    self.rows += rows
                    return data
        except Exception as e:
            self.failure = e
            raise
        return b""

    def readline(self, _size: int = -1) -> bytes:
        # Never called (COPY FROM reads with ``read``); it makes this the file object psycopg2's API names.
        return self.read()


def copy_chunks(dsn: str, staging: str, columns: Sequence[str], chunks: Iterator[tuple[bytes, int]]) -> int:
    """One ``COPY … FROM STDIN`` of ``(bytes of whole newline-terminated lines, line count)`` chunks; the row count.

    Runs on executors; the DSN arrives in the task closure. A failure names its line within this
    COPY (i.e. within the partition), never the value.
    """
    target = sql.SQL("COPY {} ({}) FROM STDIN").format(
        ident(staging), sql.SQL(", ").join(map(sql.Identifier, (OP, KEEP, LSN, *columns))))
    conn = psycopg2.connect(dsn)
    reader = _ChunkReader(chunks)
    try:
        with conn.cursor() as cur:
            cur.copy_expert(target.as_string(conn), reader, size=1 << 20)
        conn.commit()
    except psycopg2.Error as exc:
        if reader.failure is not None:  # the rows' producer failed, not the target: its own error
            raise reader.failure from None
        raise copy_error(staging, exc, 0) from None
    finally:
        conn.close()
    return reader.rows


# what an input function's message quotes (``…: "abc"``, ``…: 'abc'``): the value and all after it
QUOTED_VALUE = re.compile(r""":\s*["'].*""", re.S)
# a quoted span: a quote opening after a non-letter (not the apostrophe of ``Couldn't``) up to the LAST same quote
# not followed by a letter, or to the end when none closes it. Greedy because PostgreSQL and pyarrow quote a value
# without escaping the quotes in it: ``"12" 345"`` is one span, its first closing quote is the value's own
QUOTED_SPAN = re.compile(r"""(?<![^\W\d_])(["'])(?:.*\1(?![^\W\d_])|.*\Z)""", re.S)
_COPY_POSITION = re.compile(r"line (\d+), column ([^:]+)")


def without_quoted(text: str) -> str:
    """The first line of ``text``, every quoted span replaced by ``…``: what a message quotes may be a row's value
    (``value "99999999999" is out of range for type integer``), what it says around it is the problem. The spans come
    off the whole text before its first line is taken: a value may hold a line break (``str.splitlines`` breaks at
    \x1e too), which would end the line inside the quotes and show the value's head."""
    lines = QUOTED_SPAN.sub("…", text).splitlines()
    return " ".join(lines[0].split()) if lines else ""


def server_primary(exc: psycopg2.Error) -> str:
    """A server error's primary message (its first line) without row values: up to what an input function's
    message quotes after a colon, and a data exception's (class 22) also without any quoted span, its values may
    stand anywhere in it."""
    primary = ((exc.diag.message_primary if exc.diag else None) or "").strip()
    if (exc.pgcode or "").startswith("22"):
        return QUOTED_VALUE.sub(": …", without_quoted(primary)) or type(exc).__name__
    lines = QUOTED_VALUE.sub("", primary).splitlines()
    return lines[0] if lines else type(exc).__name__


def copy_error(staging: str, exc: psycopg2.Error, copied: int) -> ApplyError:
    """A COPY failure without the value that caused it (input-function messages quote it: ``…: "abc"``).

    Executor errors reach Spark's and Airflow's logs; like ``batch_error``, only the statement of
    the problem, its SQLSTATE and its position may go there, never row data.
    """
    where = _COPY_POSITION.search((exc.diag.context if exc.diag else None) or "")
    position = f" (line {int(where.group(1)) + copied} of this partition, column {where.group(2)})" if where else ""
    return ApplyError(f"COPY into {staging} failed{position}: [{exc.pgcode}] {server_primary(exc)}")


def copy_partitions(dsn: str, staging: str, columns: Sequence[str], fields: Sequence[arrowtext.Field]
                    ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function over ``copytext.copy_columns``' frame: each partition's rows printed as COPY text
    lines (``arrowtext.line_bytes``: no Python strings, no pickling) and COPYed as one statement; yields its count."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        chunks = arrowtext.line_batches(fields)(batches)
        yield pa.RecordBatch.from_pydict({"rows": [copy_chunks(dsn, staging, columns, chunks)]},
                                         schema=pa.schema([("rows", pa.int64())]))

    return run
