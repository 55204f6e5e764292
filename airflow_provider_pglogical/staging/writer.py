"""Streaming batch writer: decoded transactions → per-table Parquet row groups → atomic manifest."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.decoding import speedups
from airflow_provider_pglogical.decoding.model import (
    LogicalMessage,
    NonTransactionalMessage,
    RelationSchema,
    RowChange,
    RowImage,
    Transaction,
    TruncateChange,
)
from airflow_provider_pglogical.decoding.spill import SpilledChanges
from airflow_provider_pglogical.decoding.values.vector import PAD, with_mask
from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging import schema as S
from airflow_provider_pglogical.staging.layout import (
    MESSAGES,
    RELATIONS,
    TRANSACTIONS,
    TRUNCATES,
    StagingLayout,
    make_dirs,
    table_file,
)
from airflow_provider_pglogical.staging.manifest import (
    FileRecord,
    Manifest,
    hash_file,
    write_manifest,
    write_relation_state,
)

log = logging.getLogger(__name__)

DEFAULT_ROW_GROUP_ROWS = 32_768


class ConvertedImages(Protocol):
    """``decoding.values.ConvertedImages`` (a frozen dataclass: read-only here too)."""

    @property
    def array(self) -> pa.StructArray: ...

    @property
    def notes(self) -> pa.MapArray: ...  # map<string,string> per row: exactness notes

    @property
    def unchanged(self) -> pa.ListArray: ...  # list<string> per row: columns sent as unchanged TOAST


class RowConverter(Protocol):
    """``decoding.values.RowImageConverter``: row images (TupleData/WireTuple) → Arrow, a row group at a time."""

    arrow_type: pa.StructType

    def convert(self, images: Sequence[RowImage | None]) -> ConvertedImages: ...


class RelationResolver(Protocol):
    """Supplies what the pure writer cannot know: typed converters and SQL type names."""

    def converter(self, relation: RelationSchema) -> RowConverter: ...

    def type_names(self, relation: RelationSchema) -> Sequence[str | None]: ...


class RowGroupWriter:
    """Writes row groups on one background thread, in the order they were handed over.

    Encoding and compressing a row group (pyarrow's ``write_table``, without the GIL) is a fifth
    of the drain's CPU; on its own thread it overlaps with decoding the next rows. One thread for
    all files of a batch keeps each file's row groups in order (the same bytes as writing inline).
    At most ``depth`` row groups wait, so memory stays bounded. The first failure is raised again
    in the caller's thread at the next ``submit`` or at ``wait`` (which every file's close calls
    before the manifest can be written), and nothing after it is written.
    """

    def __init__(self, depth: int = 2) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=depth)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, write: Callable[[], None]) -> None:
        self._raise()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pglogical-row-groups", daemon=True)
            self._thread.start()
        self._queue.put(write)

    def wait(self) -> None:
        """Until everything handed over is written; raises the first failure."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (write := self._queue.get()) is not None:
            if self._error is None:  # after a failure: only drain the queue
                try:
                    write()
                except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                    self._error = exc


class _Sink:
    """One Parquet file written a row group at a time: memory holds at most one row group
    (plus those waiting for ``pool``'s thread, when one is given).

    Row groups are cut every ``row_group_rows`` rows counted from the start of the file, so
    the same input always gives the same row groups (re-staging is byte-for-byte stable).
    The file is created on the first flush: an unused sink leaves no file behind.
    """

    def __init__(self, layout: StagingLayout, path: str, schema: pa.Schema, row_group_rows: int,
                 compression: str, pool: RowGroupWriter | None = None, lsn_index: int | None = None) -> None:
        self.layout, self.path, self.schema = layout, path, schema
        self.row_group_rows, self.compression = row_group_rows, compression
        self.buffer: list[tuple[Any, ...]] = []  # row tuples; transposed once per row group
        self.rows = 0
        # The range of the file's commit_lsn column (value ``lsn_index`` of a row), for its FileRecord.
        self.lsn_index = lsn_index
        self.min_lsn: int | None = None
        self.max_lsn: int | None = None
        self.pool = pool
        self._writer: pq.ParquetWriter | None = None

    @property
    def pending(self) -> int:
        return len(self.buffer)

    def note_lsn(self, lsn: int) -> None:
        if self.min_lsn is None or lsn < self.min_lsn:
            self.min_lsn = lsn
        if self.max_lsn is None or lsn > self.max_lsn:
            self.max_lsn = lsn

    def append(self, *values: Any) -> None:
        if self.lsn_index is not None and values[self.lsn_index] is not None:
            self.note_lsn(values[self.lsn_index])
        self.buffer.append(values)
        if len(self.buffer) >= self.row_group_rows:
            self.flush()

    def columns(self) -> list[tuple[Any, ...]]:
        return list(zip(*self.buffer, strict=True))

    def arrays(self) -> list[pa.Array]:
        return [pa.array(col, type=f.type) for col, f in zip(self.columns(), self.schema, strict=True)]

    def flush(self) -> None:
        if not self.pending:
            return
        table = pa.Table.from_arrays(self.arrays(), schema=self.schema)
        if self.pool is None:
            self._write(table)
        else:
            self.pool.submit(lambda: self._write(table))
        self.rows += self.pending
        self._clear()

    def _write(self, table: pa.Table) -> None:
        if self._writer is None:
            parent = self.path.rsplit("/", 1)[0]
            make_dirs(self.layout.fs, parent)
            # No dictionary pages: staged columns are mostly unique per row (LSNs, keys, hashes), so
            # dictionary encoding is tried, abandoned and costs time; without it a row group of the
            # 1.75M-change benchmark writes in ~55% of the CPU time and the file is ~25% smaller (zstd).
            self._writer = pq.ParquetWriter(self.path, self.schema, filesystem=self.layout.fs,
                                            compression=self.compression, use_dictionary=False)
        self._writer.write_table(table, row_group_size=self.row_group_rows)

    def _clear(self) -> None:
        self.buffer = []

    def close(self, *, write_empty: bool = False) -> bool:
        """Flush and close; returns whether the file exists."""
        self.flush()
        if self.pool is not None:
            self.pool.wait()
        if self._writer is None and write_empty:
            make_dirs(self.layout.fs, self.path.rsplit("/", 1)[0])
            pq.write_table(self.schema.empty_table(), self.path, filesystem=self.layout.fs,
                           compression=self.compression)
            return True
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            return True
        return False


class _TableSink(_Sink):
    """Row changes of one relation schema version, buffered column-wise, Arrow a row group at a time.

    Per row only the change is kept; its order in the transaction once per run of consecutive orders, and
    transaction fields once per run of consecutive rows of one transaction, both expanded with numpy at flush.
    """

    def __init__(self, layout: StagingLayout, path: str, converter: RowConverter, version: int,
                 row_group_rows: int, compression: str, pool: RowGroupWriter | None = None) -> None:
        super().__init__(layout, path, S.row_change_schema(converter.arrow_type), row_group_rows, compression, pool)
        self.converter, self.version = converter, version
        self._clear()

    def _clear(self) -> None:
        self.changes: list[RowChange] = []
        self.order_runs: list[tuple[int, int]] = []  # (first row, its order): the next rows' orders count up from it
        self.runs: list[tuple[int, tuple[int, int, int, int]]] = []  # (first row, (commit_lsn, end_lsn, xid, time))
        self._run: tuple[int, int, int, int] | None = None
        self._next_order: int | None = None

    @property
    def pending(self) -> int:
        return len(self.changes)

    def add(self, tx_fields: tuple[int, int, int, int], order: int, change: RowChange) -> None:
        if tx_fields is not self._run:
            self.runs.append((len(self.changes), tx_fields))
            self._run = tx_fields
            self.note_lsn(tx_fields[0])
        if order != self._next_order:
            self.order_runs.append((len(self.changes), order))
        self._next_order = order + 1
        self.changes.append(change)
        if len(self.changes) >= self.row_group_rows:
            self.flush()

    def add_run(self, tx_fields: tuple[int, int, int, int], order: int, changes: Sequence[RowChange], i: int,
                j: int) -> None:
        """``add`` of ``changes[i:j]`` with orders ``order, order + 1, …``: the same rows, runs and row
        groups as one ``add`` each, a row-group's worth of list work at a time."""
        row_group_rows = self.row_group_rows
        while i < j:
            if tx_fields is not self._run:
                self.runs.append((len(self.changes), tx_fields))
                self._run = tx_fields
                self.note_lsn(tx_fields[0])
            if order != self._next_order:
                self.order_runs.append((len(self.changes), order))
            k = min(j, i + row_group_rows - len(self.changes))
            self.changes.extend(changes[i:k])
            order += k - i
            self._next_order = order
            i = k
            if len(self.changes) >= row_group_rows:
                self.flush()

    def arrays(self) -> list[pa.Array]:
        changes, n = self.changes, len(self.changes)
        bounds = [first for first, _ in self.runs] + [n]
        per_tx = np.repeat(np.array([f for _, f in self.runs], dtype=np.int64).reshape(-1, 4), np.diff(bounds), axis=0)
        commit_lsn, end_lsn, xid, time = (np.ascontiguousarray(per_tx[:, i]) for i in range(4))
        # One pass in C over the row group when every change is plain (wire images): the same columns.
        columns = _columns_of(changes, PAD) if _columns_of is not None else None
        convert_joined = getattr(self.converter, "convert_joined", None)
        if columns is not None and convert_joined is not None:
            lsn_bytes, op_bytes, key_bytes, old_side, new_side = columns
            lsn = np.frombuffer(lsn_bytes, dtype=np.int64)
            ops = pa.StringArray.from_buffers(n, pa.py_buffer(np.arange(n + 1, dtype=np.int32)), pa.py_buffer(op_bytes))
            key_only_values = np.frombuffer(key_bytes, dtype=bool)
            # Notes carry what the typed column cannot hold (numeric NaN in a decimal column, array
            # dimensions/lower bounds): without them the staged log would be lossy.
            old_images = convert_joined(old_side, lambda: list(map(_OLD, changes)))
            new_images = convert_joined(new_side, lambda: list(map(_NEW, changes)))
        else:
            lsn = np.fromiter(map(_LSN, changes), dtype=np.int64, count=n)
            ops = pa.array(list(map(_OP, changes)), type=pa.string())
            key_only_values = np.fromiter(map(_KEY_ONLY, changes), dtype=bool, count=n)
            old_images = self.converter.convert(list(map(_OLD, changes)))
            new_images = self.converter.convert(list(map(_NEW, changes)))
        # with_mask wraps the numpy arrays as pa.array would (no copy either way); it saves no pandas import here:
        # the drain's warm-up imports pandas on purpose, and _Sink.arrays calls pa.array on tuples.
        orders = _orders(self.order_runs, n)
        position = [with_mask(c, None, pa.int64()) for c in (commit_lsn, end_lsn, lsn, orders, xid)]
        position.append(with_mask(time, None, S.COMMIT_TIME))
        version = with_mask(np.full(n, self.version, dtype=np.int32), None, pa.int32())
        key_only = with_mask(key_only_values, None, pa.bool_())
        return [*position, ops, version, old_images.array, key_only, new_images.array, new_images.unchanged,
                old_images.notes, new_images.notes]


def _orders(order_runs: list[tuple[int, int]], n: int) -> np.ndarray:
    """Each row's order in its transaction: from each run's first row on, one more per row."""
    firsts = np.array([first for first, _ in order_runs], dtype=np.int64)
    shift = np.array([order for _, order in order_runs], dtype=np.int64) - firsts
    return np.arange(n, dtype=np.int64) + np.repeat(shift, np.diff(np.append(firsts, n)))


_OP, _LSN, _OLD, _NEW, _KEY_ONLY = (attrgetter(f) for f in ("op", "lsn", "old", "new", "old_key_only"))
_columns_of = speedups.compiled.rowchange_columns if speedups.compiled is not None else None


def relation_run_py(changes: Sequence[Any], start: int, relation: RelationSchema) -> int:
    """The index after the run of ``RowChange``s of ``relation`` (by identity) from ``changes[start]``:
    the reference of ``_speedups.relation_run``, which ``write_transaction`` calls once per run. A negative
    ``start`` is a ``ValueError`` (it would index from the end)."""
    if start < 0:
        raise ValueError(f"relation_run: start {start} is negative")
    i, n = start, len(changes)
    while i < n and type(c := changes[i]) is RowChange and c[1] is relation:  # c.relation
        i += 1
    return i


_relation_run: Callable[[Sequence[Any], int, RelationSchema], int] = (
    speedups.compiled.relation_run if speedups.compiled is not None else relation_run_py)


class BatchWriter:
    """Writes one batch into ``<batches>/_partial-<start>/`` and publishes it.

    Crash windows: until ``publish`` writes the manifest, nothing is visible; a crashed
    attempt leaves a partial (or manifest-less final) directory that the next attempt for the
    same start LSN deletes before writing (``StagingLayout.leftovers_for``).
    """

    def __init__(self, layout: StagingLayout, *, start_lsn: int, slot: str, publication: str,
                 resolver: RelationResolver, server_version: int = 0, proto_version: int = 0,
                 row_group_rows: int = DEFAULT_ROW_GROUP_ROWS, compression: str = "zstd",
                 background_writes: bool = True) -> None:
        self.layout, self.start_lsn, self.resolver = layout, start_lsn, resolver
        self.row_group_rows, self.compression = row_group_rows, compression
        # Row groups are encoded and compressed on a thread while decoding goes on (RowGroupWriter).
        self.pool = RowGroupWriter() if background_writes else None
        self.manifest = Manifest(slot=slot, publication=publication, start_lsn_int=start_lsn, end_lsn_int=start_lsn,
                                 server_version=server_version, proto_version=proto_version)
        self.dir = layout.partial_dir(start_lsn)
        self.final_dir: str | None = None
        self._tables: dict[tuple[int, int], tuple[str, _TableSink]] = {}
        self._paths: set[str] = set()
        self._relations: dict[tuple[int, int], tuple[RelationSchema, int]] = {}
        # lsn_index: where each file's commit_lsn is in an appended row (null for non-transactional messages)
        self._transactions = self._sink(TRANSACTIONS, S.TRANSACTIONS_SCHEMA, lsn_index=1)
        self._messages = self._sink(MESSAGES, S.MESSAGES_SCHEMA, lsn_index=0)
        self._truncates = self._sink(TRUNCATES, S.TRUNCATES_SCHEMA, lsn_index=0)
        self.changes = 0
        make_dirs(layout.fs, self.dir)

    def _sink(self, name: str, schema: pa.Schema, lsn_index: int | None = None) -> _Sink:
        return _Sink(self.layout, f"{self.dir}/{name}", schema, self.row_group_rows, self.compression, self.pool,
                     lsn_index)

    def _note_relation(self, relation: RelationSchema, lsn: int) -> None:
        self._relations.setdefault((relation.relid, relation.version), (relation, lsn))

    def _table_sink(self, relation: RelationSchema) -> _TableSink:
        key = (relation.relid, relation.version)
        entry = self._tables.get(key)
        if entry is None:
            rel_path = table_file(relation.namespace, relation.name, relation.version)
            if rel_path in self._paths:
                # The same schema.table name with another relid (dropped and recreated inside
                # the batch) would collide: keep both, the later one suffixed with its relid.
                rel_path = rel_path.replace(".parquet", f"-r{relation.relid}.parquet")
            self._paths.add(rel_path)
            sink = _TableSink(self.layout, f"{self.dir}/{rel_path}", self.resolver.converter(relation),
                              relation.version, self.row_group_rows, self.compression, self.pool)
            entry = self._tables[key] = (rel_path, sink)
        return entry[1]

    def write_transaction(self, tx: Transaction) -> None:
        """Append a committed transaction; rows land in file order = (commit_lsn, tx_order)."""
        if tx.end_lsn <= self.manifest.end_lsn_int and self.manifest.transactions:
            raise StagingError(f"transaction end LSN {tx.end_lsn} is not after the previous one "
                               f"{self.manifest.end_lsn_int}: input is not in commit order")
        pos = (tx.commit_lsn, tx.end_lsn)
        time = S.to_unix_us(tx.commit_time_us)
        tx_fields = (tx.commit_lsn, tx.end_lsn, tx.xid, time)
        order = 0
        relation: RelationSchema | None = None
        sink: _TableSink | None = None
        changes = tx.changes
        # A spilled transaction hands its changes over a slice at a time; in either case runs of row
        # changes of one relation (the common case) go to their sink as one run, not one call per row.
        chunks = changes.chunks() if type(changes) is SpilledChanges else (changes,)
        for chunk in chunks:
            i, n = 0, len(chunk)
            while i < n:
                change = chunk[i]
                if type(change) is RowChange:
                    rel = change.relation
                    if rel is not relation:
                        relation = rel
                        self._note_relation(rel, change.lsn)
                        sink = self._table_sink(rel)
                    j = _relation_run(chunk, i + 1, rel)
                    sink.add_run(tx_fields, order, chunk, i, j)  # type: ignore[union-attr, arg-type]
                    order += j - i
                    i = j
                    continue
                self._write_other(tx, pos, time, order, change)
                order += 1
                i += 1
        self.changes += order
        self._transactions.append(tx.xid, tx.commit_lsn, tx.end_lsn, time, tx.origin, tx.origin_lsn, order,
                                  tx.streamed)
        self.manifest.transactions += 1
        self.manifest.end_lsn_int = tx.end_lsn

    def _write_other(self, tx: Transaction, pos: tuple[int, int], time: int, order: int, change: Any) -> None:
        """A change that is not a row change: TRUNCATE or a transactional logical message."""
        if isinstance(change, TruncateChange):
            for rel in change.relations:
                self._note_relation(rel, change.lsn)
            self._truncates.append(*pos, change.lsn, order, tx.xid, time,
                                   [r.qualified_name for r in change.relations],
                                   [r.relid for r in change.relations], change.cascade, change.restart_identity)
        elif isinstance(change, LogicalMessage):
            self._messages.append(*pos, change.lsn, order, tx.xid, True, change.prefix, change.content)
        else:
            raise StagingError(f"unexpected change type {type(change).__name__} in xid {tx.xid}")

    def write_message(self, event: NonTransactionalMessage) -> None:
        m = event.message
        self._messages.append(None, None, m.lsn, None, event.xid, False, m.prefix, m.content)

    def finish_files(self, end_lsn: int | None = None) -> str:
        """Close every file and move the batch to ``<start>-<end>/`` (still invisible)."""
        if end_lsn is not None:
            self.manifest.end_lsn_int = end_lsn
        m = self.manifest
        if m.end_lsn_int <= self.start_lsn:
            raise StagingError(f"batch end LSN {m.end_lsn} is not after its start {m.start_lsn}")
        files: list[tuple[str, _Sink]] = []
        for (relid, version), (rel_path, sink) in sorted(self._tables.items()):
            relation = self._relations[(relid, version)][0]
            sink.close()
            entry = m.tables.setdefault(relation.qualified_name, {"rows": 0, "files": []})
            entry["rows"] += sink.rows
            entry["files"].append(rel_path)
            files.append((rel_path, sink))
        self._transactions.close(write_empty=True)
        self._messages.close(write_empty=True)
        if self._truncates.close():
            files.append((TRUNCATES, self._truncates))
        m.truncates, m.messages = self._truncates.rows, self._messages.rows
        relations = self._write_relations()
        files += [(TRANSACTIONS, self._transactions), (MESSAGES, self._messages), (RELATIONS, relations)]
        m.files = {rel: self._record(rel, sink).to_dict() for rel, sink in files}
        m.bytes = sum(int(f["bytes"]) for f in m.files.values())
        final = self.layout.batch_dir(self.start_lsn, m.end_lsn_int)
        if self.layout.exists(final):  # a manifest-less leftover that cleanup did not catch
            self.layout.delete_dir(final)
        self.layout.move_tree(self.dir, final, m.files.keys())
        self.final_dir = final
        return final

    def _record(self, rel: str, sink: _Sink) -> FileRecord:
        """The file as written, read back once for its hash (from the page cache locally: about 1 GB/s)."""
        size, digest = hash_file(self.layout.fs, f"{self.dir}/{rel}")
        return FileRecord(size, sink.rows, digest, sink.min_lsn, sink.max_lsn)

    def _write_relations(self) -> _Sink:
        sink = self._sink(RELATIONS, S.RELATIONS_SCHEMA)
        for (_relid, _version), (rel, first_lsn) in sorted(
                self._relations.items(), key=lambda kv: (kv[1][0].namespace, kv[1][0].name, kv[0])):
            names = list(self.resolver.type_names(rel))
            # Optional on resolvers: the value older rows read for a column added with a DEFAULT.
            missing_of = getattr(self.resolver, "missing_values", None)
            missing: Mapping[str, str] = missing_of(rel) if missing_of is not None else {}
            columns = [{"name": c.name, "type_oid": c.type_oid, "type_modifier": c.type_modifier,
                        "is_identity": c.is_identity, "type_name": names[i] if i < len(names) else None,
                        "missing": missing.get(c.name)}
                       for i, c in enumerate(rel.columns)]
            # Optional too: a leaf partition's ancestors and constraint (routing leaves to one target).
            partition_of = getattr(self.resolver, "partition_info", None)
            ancestors, constraint = partition_of(rel) if partition_of is not None else ((), None)
            # And the source's primary key (the key of a target table created from it); null when not known.
            key_of = getattr(self.resolver, "primary_key", None)
            sink.append(rel.relid, rel.namespace, rel.name, rel.version, rel.replica_identity, columns, first_lsn,
                        list(ancestors), constraint, list(key_of(rel)) if key_of is not None else None)
        sink.close(write_empty=True)
        return sink

    def publish(self, relation_state: Any) -> Manifest:
        """Write the relation state, then the manifest (atomically, last): the batch is visible."""
        if self.final_dir is None:
            raise StagingError("finish_files() must run before publish()")
        write_relation_state(self.layout, self.final_dir, relation_state, self.manifest.end_lsn_int)
        write_manifest(self.layout, self.final_dir, self.manifest)
        return self.manifest

    def abort(self) -> None:
        """Drop everything written so far (best effort; a later attempt also cleans up)."""
        try:
            if self.pool is not None:
                self.pool.wait()
        except Exception:  # noqa: BLE001 - cleanup must not mask the original error
            pass
        for sink in [*(s for _p, s in self._tables.values()), self._transactions, self._messages, self._truncates]:
            try:
                if sink._writer is not None:
                    sink._writer.close()
            except Exception:  # noqa: BLE001 - cleanup must not mask the original error
                pass
        for path in (self.dir, self.final_dir):
            try:
                if path and self.layout.exists(path):
                    self.layout.delete_dir(path)
            except Exception:  # noqa: BLE001 - cleanup must not mask the original error; the next attempt retries it
                pass
