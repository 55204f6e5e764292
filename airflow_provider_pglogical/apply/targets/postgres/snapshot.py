"""Snapshot loads into PostgreSQL: one transaction empties the tables, COPYs the snapshot rows straight into
them and sets watermark and sync LSN.

Choice (docs/apply.md): the rows go into the *existing* target table emptied with ``TRUNCATE`` in
the same transaction, not into a fresh table swapped in. Readers see the old contents until
COMMIT and the new ones after (TRUNCATE is transactional in PostgreSQL), while grants, indexes,
constraints, FKs and dependent views of the target table stay as they are — a swap would have to
recreate all of them. Tables snapshotted at one LSN are loaded in one transaction, emptied by one
TRUNCATE (so FKs among them are fine) and filled parents first.

The rows are COPYed by the transaction's own connection, like a native table sync copies into the
table: the executors turn the staged rows into COPY text (``copytext.copy_columns``, ``arrowtext``) and hand it over
in chunks of whole lines (``toLocalIterator``: one partition at a time, so memory stays bounded by a
partition) — no staging table, no ``INSERT … SELECT``. Snapshot rows need no transform on the way
(``apply/snapshots.SnapshotChanges.rows``).

Crash windows (``CHECKPOINTS``, where the crash tests stop the process): everything happens inside
the load transaction, which rolls back with the connection — during a COPY, after a table's COPY,
before COMMIT; after COMMIT the sync marks make the rerun skip the group.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import psycopg2
import pyarrow as pa
from psycopg2 import sql

from airflow_provider_pglogical.apply.snapshots import PlannedSnapshot
from airflow_provider_pglogical.apply.targets.base import BatchResult
from airflow_provider_pglogical.apply.targets.postgres import arrowtext
from airflow_provider_pglogical.apply.targets.postgres.bookkeeping_schema import qualified
from airflow_provider_pglogical.apply.targets.postgres.catalog import ident, lock_key
from airflow_provider_pglogical.apply.targets.postgres.copytext import copy_columns
from airflow_provider_pglogical.apply.targets.postgres.progress import SYNC_TABLE, ensure_sync_table, sync_marks
from airflow_provider_pglogical.apply.targets.postgres.target_types import describe_types
from airflow_provider_pglogical.exceptions import ApplyError, format_lsn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# ``copying`` inside each table's COPY once its first chunk was sent, ``loaded`` after it (watermark and sync
# LSN not written yet), then right before and right after COMMIT.
CHECKPOINTS = ("snapshot_copying", "snapshot_loaded", "snapshot_before_commit", "snapshot_committed")


CHUNK_BYTES = 4 << 20  # COPY data handed from the executors to the loading connection per chunk
_QUOTED_VALUE = re.compile(r':\s*".*', re.S)


def copy_text(frame: DataFrame, types: Any) -> DataFrame:
    """The frame's rows as COPY text in chunks of whole lines (one ``data`` column), built by every executor at
    once into Spark's disk cache — before the load transaction takes its locks — so that ``stream`` only reads
    them back."""
    from pyspark import StorageLevel

    text_frame, fields = copy_columns(frame, types)
    lines = arrowtext.line_batches(fields)

    def join(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        schema = pa.schema([("data", pa.binary())])
        parts: list[bytes] = []
        size = 0
        for data, _rows in lines(batches):
            parts.append(data)
            size += len(data)
            if size >= CHUNK_BYTES:
                yield pa.RecordBatch.from_pydict({"data": [b"".join(parts)]}, schema=schema)
                parts, size = [], 0
        if parts:
            yield pa.RecordBatch.from_pydict({"data": [b"".join(parts)]}, schema=schema)

    text = text_frame.mapInArrow(join, "data binary").persist(StorageLevel.DISK_ONLY)
    text.count()
    return text


def stream(text: DataFrame) -> Iterator[bytes]:
    """``copy_text``'s chunks in order, one partition at a time on the driver (memory bounded by a partition)."""
    for row in text.toLocalIterator(prefetchPartitions=True):
        yield bytes(row[0])


class _Feed:
    """The file object ``copy_expert`` reads: each ``read`` returns the next whole chunk; ``on_sent`` is
    called when the second is asked for (the first is in the COPY)."""

    def __init__(self, chunks: Iterator[bytes], on_sent: Callable[[], None]) -> None:
        self._chunks, self._on_sent, self._sent = chunks, on_sent, 0

    def read(self, _size: int = -1) -> bytes:
        if self._sent == 1:
            self._on_sent()
        for data in self._chunks:
            if data:
                self._sent += 1
                return data
        return b""

    def readline(self, _size: int = -1) -> bytes:  # never called by COPY FROM; part of the file API
        return self.read()


def copy_into(cur: Any, table: str, columns: Sequence[str], chunks: Iterator[bytes],
              on_sent: Callable[[], None] = lambda: None) -> int:
    """``COPY table (columns) FROM STDIN`` of text chunks on ``cur``'s connection (inside its transaction);
    the row count PostgreSQL reports."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(ident(table), sql.SQL(", ").join(map(sql.Identifier, columns)))
    cur.copy_expert(statement.as_string(cur), _Feed(chunks, on_sent), size=CHUNK_BYTES)
    return int(cur.rowcount)


def apply_snapshot(target: Any, plan: PlannedSnapshot, changes: Any) -> BatchResult:
    """TRUNCATE + COPY of every table's rows + watermark + sync LSN, in one transaction."""
    conn = target.conn
    progress = target.config.progress_table
    sync_table = qualified(target.bookkeeping_schema, SYNC_TABLE)
    ensure_sync_table(conn, sync_table)
    result = BatchResult(applied=False)
    started = time.monotonic()
    marks = sync_marks(conn, plan.slot, sync_table)
    conn.commit()
    if all(marks.get(t.target, -1) >= plan.lsn for t in plan.tables):
        return result  # loaded by an earlier run (checked again under the lock below)
    # The COPY text is built before the transaction takes its locks: it only streams it into the tables.
    texts: dict[str, DataFrame] = {}
    copy_s = 0.0
    try:
        for t in plan.tables:
            types = describe_types(conn, [(c, target._existing(t.target).columns[c]) for c in t.columns])
            conn.commit()
            texts[t.target] = copy_text(changes.rows(t), types)
        staged_at = time.monotonic()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock_key(plan.slot),))
                marks = sync_marks(conn, plan.slot, sync_table)
                load = [t for t in plan.tables if marks.get(t.target, -1) < plan.lsn]
                if not load:
                    conn.rollback()
                    return result
                cur.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(ident(t.target) for t in load)))
                for t in load:
                    copy_started = time.monotonic()
                    inserted = copy_into(cur, t.target, t.columns, stream(texts[t.target]),
                                         lambda: target.checkpoint("snapshot_copying"))
                    copy_s += time.monotonic() - copy_started
                    result.rows[t.target] = {"snapshot_rows": inserted}
                    target.checkpoint("snapshot_loaded")
                    cur.execute(sql.SQL(
                        "INSERT INTO {} (slot, target_table, end_lsn) VALUES (%s, %s, %s::pg_lsn) "
                        "ON CONFLICT (slot, target_table) DO UPDATE SET end_lsn = EXCLUDED.end_lsn, applied_at = now()"
                    ).format(ident(progress)), (plan.slot, t.target, format_lsn(plan.lsn)))
                    cur.execute(sql.SQL(
                        "INSERT INTO {} (slot, target_table, sync_lsn, rows) VALUES (%s, %s, %s::pg_lsn, %s) "
                        "ON CONFLICT (slot, target_table) DO UPDATE SET sync_lsn = EXCLUDED.sync_lsn, "
                        "rows = EXCLUDED.rows, synced_at = now()"
                    ).format(ident(sync_table)), (plan.slot, t.target, format_lsn(plan.lsn), inserted))
                cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
                target.checkpoint("snapshot_before_commit")
            conn.commit()
            target.checkpoint("snapshot_committed")
        except psycopg2.Error as exc:
            conn.rollback()
            # input-function messages quote the value (``…: "abc"``): never row data in an error
            primary = _QUOTED_VALUE.sub("", (exc.diag.message_primary if exc.diag else None) or type(exc).__name__)
            hint = ""
            if exc.pgcode == "0A000":  # TRUNCATE of a table other target tables reference
                hint = "; resync the tables referencing it together with it (--table for each)"
            raise ApplyError(f"snapshot at {format_lsn(plan.lsn)} of {', '.join(t.target for t in plan.tables)} "
                             f"not applied: [{exc.pgcode}] {primary}{hint}") from None
        except BaseException:
            conn.rollback()
            raise
    finally:
        for text in texts.values():
            text.unpersist()
    result.applied = True
    # "stage": Spark building the COPY text; "apply": the load transaction (its COPYs took ``copy``)
    result.seconds = {"stage": round(staged_at - started, 3), "apply": round(time.monotonic() - staged_at, 3),
                      "copy": round(copy_s, 3)}
    return result
