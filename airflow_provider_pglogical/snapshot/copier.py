"""Copy one chunk of one table inside an exported snapshot into a Parquet file (runs in worker processes).

Memory stays bounded by two converted row groups plus one row group of raw COPY bytes: COPY rows are buffered until ``row_group_rows`` rows or
``row_group_bytes`` bytes, framed and converted with the decoder's codecs, and written by a thread of the sink
while the next row group is read; a row group waits for the previous one's write before its own starts.
The file is written under a ``_tmp-`` name and renamed when complete, so a chunk file that exists
is whole.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.decoding.model import ColumnDef, RelationSchema
from airflow_provider_pglogical.decoding.values.vector import repeated_string, string_array, with_mask
from airflow_provider_pglogical.exceptions import SnapshotConnectionLostError, SnapshotError
from airflow_provider_pglogical.hooks.cursor import use_server_encoding
from airflow_provider_pglogical.snapshot.copyframe import TRAILER, frame_copy_block, header_length, join_rows
from airflow_provider_pglogical.staging import schema as S
from airflow_provider_pglogical.staging.layout import make_dirs, move_file, resolve_filesystem
from airflow_provider_pglogical.staging.manifest import hash_file
from airflow_provider_pglogical.text import first_line

if TYPE_CHECKING:
    from airflow_provider_pglogical.decoding.values import RowImageConverter, TypeCatalog

log = logging.getLogger(__name__)

# As a native table sync's connection (libpqrcv_connect): names in the row filter resolve in pg_catalog only,
# so a same-named function or operator someone created in public is never called. String literals read as
# the parser that checked the filter read them (row_filter.py).
_READER_SETTINGS = "SET LOCAL search_path = ''; SET LOCAL standard_conforming_strings = on"

FIRST_USER_OID = 10_000
DEFAULT_ROW_GROUP_ROWS = 65_536
DEFAULT_ROW_GROUP_BYTES = 32 << 20


@dataclass(frozen=True)
class ChunkTask:
    dsn: str
    snapshot_name: str
    lsn: int
    table: str
    relation: dict[str, Any]
    copy_sql: str
    staging_uri: str  # the staging root URI (filesystem resolved in the worker)
    path: str  # final file path on that filesystem
    index: int
    commit_time_us: int
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    part: str = ""  # the leaf partition read for ``table`` (a routed root's snapshot), for messages

    @property
    def what(self) -> str:
        return f"{self.table} (leaf {self.part})" if self.part else self.table


@dataclass(frozen=True)
class ChunkResult:
    table: str
    index: int
    rows: int
    bytes: int
    copied_bytes: int
    seconds: float
    sha256: str = ""  # of the written file: the snapshot manifest's file record


def relation_schema(relation: dict[str, Any]) -> RelationSchema:
    cols = tuple(ColumnDef(c["name"], int(c["type_oid"]), int(c["type_modifier"]), bool(c["is_identity"]))
                 for c in relation["columns"])
    return RelationSchema(int(relation["relid"]), relation["schema"], relation["table"], relation["replica_identity"],
                          cols, 1)


class _ParquetSink:
    """Where the COPY's rows go: ``write`` (``copy_expert``'s file API: one call per CopyData message = one row)
    or ``write_block`` (the compiled reader: many messages at once). Both cut row groups at the same rows."""

    def __init__(self, task: ChunkTask, converter: Any, fs: Any) -> None:
        self.task, self.converter, self.fs = task, converter, fs
        self.schema = S.row_change_schema(converter.arrow_type)
        self.ncols = len(converter.names)
        self.rows: list[bytes] = []
        self.blocks: list[tuple[bytes, np.ndarray]] = []
        self.nrows = 0
        self.buffered = 0
        self.total_rows = 0
        self.copied_bytes = 0
        self.first = True
        self.writer: pq.ParquetWriter | None = None
        # Row groups are written by a thread of their own while the next one is read and converted (pyarrow's
        # writer releases the GIL): the COPY, the conversion and the Parquet encoding overlap.
        self.background = ThreadPoolExecutor(1, thread_name_prefix="snapshot-write")
        self.writing: Future[None] | None = None
        self.tmp = task.path.rsplit("/", 1)[0] + "/_tmp-" + task.path.rsplit("/", 1)[1]

    def write(self, data: bytes) -> int:
        # Called once per row: only buffer and count here; header and trailer are handled at flush.
        self.rows.append(data)
        self.nrows += 1
        self.buffered += len(data)
        if self.buffered >= self.task.row_group_bytes or self.nrows >= self.task.row_group_rows:
            self.flush()
        return 0

    def room(self) -> tuple[int, int]:
        """How many more messages, and bytes, before the row group is full (``write_block``'s limits)."""
        return self.task.row_group_rows - self.nrows, self.task.row_group_bytes - self.buffered

    def write_block(self, data: bytes, sizes: np.ndarray) -> None:
        """Messages back to back with their lengths, read within ``room()``: the row group is cut where
        ``write`` would cut it."""
        if not len(sizes):
            return
        self.blocks.append((data, sizes))
        self.nrows += len(sizes)
        self.buffered += len(data)
        if self.buffered >= self.task.row_group_bytes or self.nrows >= self.task.row_group_rows:
            self.flush()

    def _buffered_rows(self) -> tuple[bytes, np.ndarray]:
        if self.blocks:
            data = b"".join(d for d, _ in self.blocks)
            sizes = np.concatenate([z for _, z in self.blocks])
        else:
            data, sizes = join_rows(self.rows)
        self.rows, self.blocks, self.nrows = [], [], 0
        return data, sizes

    def flush(self) -> None:
        self.copied_bytes += self.buffered
        data, sizes = self._buffered_rows()
        if self.first and len(sizes):
            self.first = False
            header = header_length(data[:int(sizes[0])])
            data, sizes = data[header:], sizes.copy()
            sizes[0] -= header
            if not sizes[0]:
                sizes = sizes[1:]
        if len(sizes) and sizes[-1] == len(TRAILER) and data.endswith(TRAILER):
            data, sizes = data[:-len(TRAILER)], sizes[:-1]
        n = len(sizes)
        if not n and self.writer is not None:
            self.buffered = 0
            return
        framed = frame_copy_block(data, sizes, self.ncols)
        images = self.converter.convert_framed(framed, n)
        # The row-change columns from buffers: the first ``pa.array`` of a process imports pandas (1–4.5 s per reader).
        lsn = with_mask(np.full(n, self.task.lsn, dtype=np.int64), None, pa.int64())
        order = with_mask(np.arange(self.total_rows, self.total_rows + n, dtype=np.int64), None, pa.int64())
        arrays = [lsn, lsn, lsn, order, with_mask(np.zeros(n, dtype=np.int64), None, pa.int64()),
                  with_mask(np.full(n, self.task.commit_time_us, dtype=np.int64), None, S.COMMIT_TIME),
                  repeated_string("I", n, f"{self.task.what}: op"), with_mask(np.ones(n, dtype=np.int32), None, pa.int32()),
                  pa.nulls(n, type=self.converter.arrow_type), with_mask(np.zeros(n, dtype=bool), None, pa.bool_()),
                  images.array, images.unchanged,
                  pa.MapArray.from_arrays(with_mask(np.zeros(n + 1, dtype=np.int32), None, pa.int32()),
                                          string_array([], "old_value_notes"),
                                          string_array([], "old_value_notes")),
                  images.notes]
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        if self.writer is None:
            make_dirs(self.fs, self.tmp.rsplit("/", 1)[0])
            # No dictionary pages: a snapshot's columns are mostly distinct values (keys, timestamps, amounts),
            # where dictionary encoding only costs time; zstd alone wrote 500k orders rows 1.9x faster and 48%
            # smaller (docs/performance.md). Readers see no difference.
            self.writer = pq.ParquetWriter(self.tmp, self.schema, filesystem=self.fs, compression="zstd",
                                           use_dictionary=False)
        self._wait()  # one row group in writing at a time: two converted row groups plus one of raw COPY bytes
        self.writing = self.background.submit(self.writer.write_table, table, row_group_size=max(n, 1))
        self.total_rows += n
        self.buffered = 0

    def _wait(self) -> None:
        """Wait for the row group in writing; its error (a full disk, a lost object store) is raised here."""
        writing, self.writing = self.writing, None
        if writing is not None:
            writing.result()

    def close(self) -> tuple[int, str]:
        """Close and rename the file; its size and SHA-256 (read back once) for the manifest."""
        self.flush()
        # The last row group's write error is raised here, and only here: pyarrow's ``ParquetWriter.close()``
        # returns normally after a failed write, and the truncated file would be renamed into place.
        self._wait()
        self.background.shutdown()
        if self.writer is None:  # flush() opens it, for an empty chunk too
            raise SnapshotError(f"snapshot chunk {self.task.path} was never opened for writing")
        self.writer.close()
        move_file(self.fs, self.tmp, self.task.path)
        return hash_file(self.fs, self.task.path)

    def abort(self) -> None:
        """Stop writing and delete the temporary file. Every step runs whatever the one before raised (a second
        interrupt during the wait, a failing close): cleanup never masks the original error, nor skips the delete."""
        try:
            try:
                self._wait()
            except Exception:  # noqa: BLE001 - the chunk already failed; its own error is the one raised
                pass
            finally:
                self.background.shutdown()  # the write in flight ends before the writer is closed
        finally:
            try:
                if self.writer is not None:
                    self.writer.close()
            except Exception:  # noqa: BLE001 - as above
                pass
            finally:
                try:
                    self.fs.delete_file(self.tmp)
                except Exception:  # noqa: BLE001 - as above (no file: nothing was opened)
                    pass


def _reader_imports() -> tuple[Any, type[RowImageConverter], type[TypeCatalog]]:
    """What ``copy_chunk`` imports on its first call (psycopg2, the decoder's codecs), imported once per process;
    ``warm`` calls it before the first task."""
    import psycopg2

    from airflow_provider_pglogical.decoding.values import RowImageConverter, TypeCatalog

    return psycopg2, RowImageConverter, TypeCatalog


def warm() -> None:
    """Import what ``copy_chunk`` imports on its first call (a reader process does this before its first task)."""
    _reader_imports()
    _compiled_reader()


def copy_chunk(task: ChunkTask) -> ChunkResult:
    """Import the exported snapshot, COPY the chunk in binary, write it as one Parquet file."""
    psycopg2, RowImageConverter, TypeCatalog = _reader_imports()  # noqa: N806 - the classes, under their names
    started = time.monotonic()
    fs, _root = resolve_filesystem(task.staging_uri)
    relation = relation_schema(task.relation)
    conn = psycopg2.connect(task.dsn, application_name="airflow-provider-pglogical-snapshot")
    try:
        use_server_encoding(conn)
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                cur.execute("SET TRANSACTION SNAPSHOT %s", (task.snapshot_name,))
            except psycopg2.Error as exc:
                raise SnapshotConnectionLostError(
                    f"could not import exported snapshot {task.snapshot_name} for {task.what} "
                    f"(SQLSTATE {exc.pgcode}): the replication connection holding it is gone; run again") from None
            cur.execute(_READER_SETTINGS)
            user_oids = sorted({c.type_oid for c in relation.columns if c.type_oid >= FIRST_USER_OID})
            catalog = TypeCatalog()
            if user_oids:
                cur.execute(TypeCatalog.CATALOG_QUERY, {"oids": user_oids})
                catalog = TypeCatalog.from_rows(cur.fetchall())
            sink = _ParquetSink(task, RowImageConverter(relation, catalog), fs)
            try:
                compiled = _compiled_reader()
                if compiled is None or not _copy_compiled(compiled, conn, task, sink):
                    cur.copy_expert(task.copy_sql, sink)
                size, digest = sink.close()
            except _CopyFailed as exc:
                sink.abort()
                raise SnapshotError(f"reading {task.what} chunk {task.index} failed "
                                    f"({server_error(exc.sqlstate, exc.message)}); nothing of it was published") from None
            except psycopg2.Error as exc:
                sink.abort()
                raise SnapshotError(f"reading {task.what} chunk {task.index} failed "
                                    f"({server_error(exc.pgcode, exc.diag.message_primary)}); "
                                    "nothing of it was published") from None
            except BaseException:
                sink.abort()
                raise
        conn.rollback()
    finally:
        conn.close()
    return ChunkResult(task.table, task.index, sink.total_rows, size, sink.copied_bytes, time.monotonic() - started,
                       digest)


def server_error(sqlstate: str | None, message: str | None) -> str:
    """The server's error for a message of ours: ``SQLSTATE <code>: <primary message>``, except that a data exception
    (class 22: a cast in the row filter that a row's value fails, a value out of range) is named by its
    condition alone, since PostgreSQL quotes the offending value in the message."""
    from psycopg2 import errorcodes

    code = sqlstate or ""
    if code.startswith("22"):
        try:
            condition = errorcodes.lookup(code).lower()
        except KeyError:
            condition = "data_exception"
        return (f"SQLSTATE {code}: {condition} while evaluating the row filter or reading a row; the server's "
                "message is not shown, as it quotes row values")
    # the compiled reader's message goes on with LINE, HINT
    return f"SQLSTATE {code}: {first_line(message or '', '')}"


class _CopyFailed(Exception):
    """The compiled reader's COPY failed: the server's SQLSTATE (empty for a lost connection) and message."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"{sqlstate}: {message}")
        self.sqlstate, self.message = sqlstate, message.strip().removeprefix("ERROR:").strip()


def _compiled_reader() -> Any:
    """The compiled module when it can read this COPY (built with libpq, new enough), else None."""
    from airflow_provider_pglogical.decoding import speedups
    from airflow_provider_pglogical.hooks import copystream

    compiled = speedups.compiled
    if compiled is None or not hasattr(compiled, "copy_messages") or not copystream.available():
        return None
    return compiled


def _copy_compiled(compiled: Any, conn: Any, task: ChunkTask, sink: _ParquetSink) -> bool:
    """The COPY read a row group at a time by the compiled helper, without the GIL and without a Python call
    per row (``copy_expert`` calls ``write`` once per row: a fifth of a snapshot worker's CPU). The helper
    reads only connections of its own libpq (``hooks.copystream``): one opened like ``conn`` imports the same
    exported snapshot, with the same settings, while ``conn``'s transaction keeps it importable. False, and
    nothing read, when that libpq cannot honour ``conn``'s settings; a failure cancels the COPY."""
    from airflow_provider_pglogical.hooks import copystream

    with conn.cursor() as cur:
        setup = cur.mogrify("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT %s; "
                            + _READER_SETTINGS, (task.snapshot_name,))
    try:
        own = copystream.LibpqConnection.like(conn, client_encoding=conn.encoding)
    except copystream.UnsupportedConnection as exc:
        log.warning("compiled snapshot COPY not used (%s); the chunk goes through copy_expert", exc)
        return False
    with own:
        failed = own.execute(setup)
        if failed is not None:
            raise _CopyFailed(*failed)
        _copy_messages(compiled, own.handle, task.copy_sql, sink)
    return True


def _copy_messages(compiled: Any, handle: Any, copy_sql: str, sink: _ParquetSink) -> None:
    refused = compiled.copy_start(handle, copy_sql.encode())
    if refused is not None:
        raise _CopyFailed(*refused)
    done = False
    try:
        while not done:
            rows, size = sink.room()
            data, sizes, done, error = compiled.copy_messages(handle, max(rows, 1), max(size, 1))
            sink.write_block(data, np.frombuffer(sizes, dtype=np.int64))
            if error is not None:
                raise _CopyFailed(*error)
    finally:
        if not done:
            compiled.copy_cancel(handle)
