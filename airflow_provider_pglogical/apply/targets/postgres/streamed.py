"""One table's snapshot COPYed into the target while the snapshot still reads it: as a native table sync worker
copies its table, the rows go into the target as each chunk's file is whole, not once the whole table is staged.

For a table the snapshot reads alone (no source foreign key links it to another, not routed) and in more than one
chunk (``snapshot/run.py`` ``ChunkListener``), a loader under the overlapped load's target session
(``overlap.py``) opens one transaction on a connection of its own: TRUNCATE, then one COPY fed with each chunk as
the snapshot writes it — read once into memory, its SHA-256 taken from those bytes, printed like the load after
the snapshot prints them (``snapshot.StreamedText``). The transaction sets the sync marks and commits only once
the table is published and its manifest names, chunk by chunk, the very bytes that were COPYed, and the rows:
exactly what the load after the snapshot writes, in the same transaction (``snapshot.load_transaction``).

Nothing partial is ever committed: a snapshot that fails or dies before publishing the table takes the
transaction with it (rolled back, or gone with the connection), and the table is loaded as without this. A
table this loader does not take (linked by a foreign key of the target to a table not loaded yet, rows that need
Spark's transforms, an exactness note, a loader that could not start before the last chunk) is loaded after its
publication as any other set (``overlap.OverlappedLoad``), which reports why it is left to the apply.

The snapshot moves a table's files to their published directory only once the loader has read every chunk where
it was written (``ChunkStream.publishing``); a loader that has not begun its COPY by then is not waited for.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.apply import direct, snapshots
from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.targets.base import PlannedTable
from airflow_provider_pglogical.apply.targets.postgres import arrownet
from airflow_provider_pglogical.apply.targets.postgres.bookkeeping_schema import qualified
from airflow_provider_pglogical.apply.targets.postgres.progress import SYNC_TABLE
from airflow_provider_pglogical.apply.targets.postgres.snapshot import column_types, load_transaction, streamed_text
from airflow_provider_pglogical.apply.targets.postgres.target_types import PgType
from airflow_provider_pglogical.exceptions import ApplyError, format_lsn
from airflow_provider_pglogical.snapshot.layout import SnapshotLayout
from airflow_provider_pglogical.snapshot.run import WrittenChunk
from airflow_provider_pglogical.staging.reader import RelationInfo

if TYPE_CHECKING:
    from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget

WAITING, COPYING, PUBLISHED, DROPPED = "waiting", "copying", "published", "dropped"


class NotStreamed(Exception):
    """The table is loaded after its publication instead (the message says why, for the log)."""


class ChunkStream:
    """The chunks of one table as the snapshot writes them, between the snapshot (``add``, ``publishing``,
    ``publish``, ``end``) and the loader that COPYs them (``begin``, ``take``, ``wait_published``, ``drop``).

    ``state``: ``waiting`` until the loader begins its COPY, ``copying``, then ``published`` once the snapshot
    handed the table to it; ``dropped`` when the loader will not load it (the load after publication does)."""

    def __init__(self, first: WrittenChunk) -> None:
        self.table, self.lsn, self.chunks = first.table, first.lsn, first.chunks
        self.relation, self.row_filter = first.relation, first.row_filter
        self.state = WAITING
        self.read = 0  # chunks read where they were written (in order), their bytes hashed
        self.hashes: dict[int, str] = {}  # chunk index → SHA-256 of the bytes COPYed
        self.published_s: float | None = None  # when handed over, in the overlapped load's timeline
        self._written: dict[int, WrittenChunk] = {}
        self._ended = False
        self._claimed = False  # a loader was started for it
        self._changed = threading.Condition()

    def add(self, chunk: WrittenChunk) -> None:
        with self._changed:
            self._written[chunk.index] = chunk
            self._changed.notify_all()

    def claim(self) -> bool:
        """A loader may start for it (once: while its chunks are still being written and nobody else did)."""
        with self._changed:
            if self.state != WAITING or self._ended or self._claimed:
                return False
            self._claimed = True
            return True

    def begin(self) -> bool:
        """The loader's COPY begins: False when the table is no longer its to load."""
        with self._changed:
            if self.state != WAITING or self._ended:
                return False
            self.state = COPYING
            return True

    def take(self, index: int) -> WrittenChunk:
        """Chunk ``index`` once written; ``NotStreamed`` when the snapshot ended without it."""
        with self._changed:
            self._changed.wait_for(lambda: index in self._written or self._ended)
            if index not in self._written:
                raise NotStreamed(f"the snapshot of {self.table} ended before its chunk {index} was written")
            return self._written[index]

    def was_read(self, index: int, sha256: str) -> None:
        with self._changed:
            self.hashes[index] = sha256
            self.read = index + 1
            self._changed.notify_all()

    def drop(self) -> None:
        """The loader will not commit the table (before the snapshot handed it over: it is loaded after it)."""
        with self._changed:
            if self.state != PUBLISHED:
                self.state = DROPPED
            self._changed.notify_all()

    def publishing(self) -> bool:
        """Before the files move: wait while the loader, copying, has chunks still to read; a loader not copying
        yet is not waited for (the table is then loaded after its publication). Whether no loader was started."""
        with self._changed:
            if self.state == WAITING:
                self.state = DROPPED
            self._changed.wait_for(lambda: self.state != COPYING or self.read == self.chunks)
            return not self._claimed

    def publish(self, at_s: float) -> bool:
        """The table is published (``at_s``: when, in the overlapped load's timeline): whether the loader takes it
        (it read every chunk and is still copying). Once only: a stream already published answers no later set."""
        with self._changed:
            taken = self.state == COPYING and self.read == self.chunks
            if taken:
                self.state, self.published_s = PUBLISHED, at_s
            self._changed.notify_all()
            return taken

    def end(self) -> None:
        """The snapshot's steps are over: a table not handed over by now never will be."""
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_published(self) -> bool:
        with self._changed:
            self._changed.wait_for(lambda: self.state == PUBLISHED or self._ended)
            return self.state == PUBLISHED


def plan_streamed(target: PostgresTarget, config: ApplyConfig, stream: ChunkStream) -> PlannedTable:
    """The table as the load after the snapshot plans it (``snapshots.planned_table``); ``NotStreamed`` when that
    load must take it: not a table of the apply, linked by a target foreign key to a table not loaded yet, or
    rows that are not their ``new`` images as they are (``direct.plain_snapshot``)."""
    cfg = config.table_config(stream.table)
    if cfg is None:
        raise NotStreamed(f"{stream.table} is not a table of the apply")
    if linked := snapshots.linked_outside(config, target, (stream.table,)):
        raise NotStreamed(f"{stream.table} is linked by a foreign key of the target to {', '.join(linked)}")
    table = snapshots.planned_table(target, stream.table, cfg, RelationInfo.from_row(stream.relation))
    target.conn.commit()  # no catalog lock of this connection may hold the load's TRUNCATE
    if not direct.enabled() or not direct.plain_snapshot(table, has_notes=False, row_filter=stream.row_filter):
        raise NotStreamed(f"the rows of {stream.table} need Spark's transforms")
    return table


def load_streamed(target: PostgresTarget, config: ApplyConfig, stream: ChunkStream) -> dict[str, dict[str, int]]:
    """Load ``stream``'s table in one transaction (``snapshot.load_transaction``, as the load after the snapshot)
    while the snapshot writes its chunks, in a load slot of the target the caller holds
    (``LoadSlots.start_when_free``); its rows committed (``snapshot_rows`` by target table; none when it was
    loaded before). ``NotStreamed`` when rolled back before the snapshot handed the table over: it is loaded
    after its publication. Any other failure after the handover: the apply after the snapshot loads the table."""
    table = plan_streamed(target, config, stream)
    types = column_types(target, table)
    target.conn.commit()
    layout = SnapshotLayout.from_uri(config.staging_root, config.slot)
    if not stream.begin():
        raise NotStreamed(f"{stream.table} was read before its loader could begin")
    try:
        rows, _copy_s = load_transaction(
            target, target.config.slot, stream.lsn, qualified(target.bookkeeping_schema, SYNC_TABLE), (table,),
            lambda t: _chunk_text(target, layout, t, types, stream),
            lambda _t, inserted: _handed_over(layout, stream, inserted), passed=(NotStreamed,))
        return rows
    finally:
        stream.drop()  # whatever happened, nothing reads the chunks any more


def _handed_over(layout: SnapshotLayout, stream: ChunkStream, rows: int) -> None:
    """Before the sync marks: the snapshot published the table, and its manifest names the chunks COPYed."""
    if not stream.wait_published():
        raise NotStreamed(f"the snapshot ended without publishing {stream.table}")
    _verify(layout, stream, rows)


def _chunk_text(target: PostgresTarget, layout: SnapshotLayout, table: PlannedTable,
                types: dict[str, PgType], stream: ChunkStream) -> Iterator[bytes]:
    """The COPY text of every chunk in order, each as soon as it is written: read once, hashed, checked to be
    plain rows (no exactness note, printable columns), then printed while the COPY sends it."""
    for index in range(stream.chunks):
        chunk = stream.take(index)
        with layout.fs.open_input_stream(chunk.path) as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != chunk.sha256:
            raise NotStreamed(f"chunk {index} of {stream.table} is not the file its reader wrote")
        buffer = pa.py_buffer(data)
        if snapshots.file_has_notes(pq.ParquetFile(buffer)):
            raise NotStreamed(f"the rows of {stream.table} carry exactness notes: they need Spark's transforms")
        plan = arrownet.plan_rows([buffer], table.columns, types)
        if plan is None:
            raise NotStreamed(f"the rows of {stream.table} need Spark's transforms")
        stream.was_read(index, digest)
        yield from streamed_text(target, plan).chunks()


def _verify(layout: SnapshotLayout, stream: ChunkStream, inserted: int) -> None:
    """The published manifest names, chunk by chunk, the bytes COPYed (by SHA-256), at the LSN and with the rows
    COPYed: what the transaction commits is the published snapshot."""
    ref = layout.latest(stream.table)
    manifest = layout.manifest(ref) if ref is not None else None
    if manifest is None or ref is None or ref.lsn != stream.lsn:
        raise ApplyError(f"snapshot of {stream.table} at {format_lsn(stream.lsn)} is not the one published")
    records = [manifest.file_records.get(f, {}).get("sha256") for f in manifest.files]
    if records != [stream.hashes.get(i) for i in range(stream.chunks)] or manifest.rows != inserted:
        raise ApplyError(f"snapshot of {stream.table} at {format_lsn(stream.lsn)}: the published files are not "
                         "the chunks COPYed while it was read")
