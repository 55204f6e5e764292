"""A lake target's net changes streamed from Spark: a batch's net changes of one table reach delta-rs's MERGE (Delta)
or the copy-on-write plan (Iceberg, ``IcebergTarget.apply_net_stream``) chunk by chunk. What follows describes
Delta's MERGE; Iceberg reads the same buckets.

Collecting a table's net changes whole (``DataFrame.toArrow``) holds every row on the driver — in a Spark
Connect client too — several times over while it is converted and turned into the MERGE source. Here the
net frame is cached where Spark runs, summarised by one aggregation (rows, the columns some change keeps,
whether a change needs the target's rows or the batch order), and collected one key-hash bucket at a time
(``pmod(xxhash64(key), n)``: a bucket's rows are the same whenever it is read, even after a lost cache
block is recomputed). Each bucket is converted on its own and handed to ``DeltaTable.merge`` through a
``pyarrow.RecordBatchReader``, which delta-rs reads lazily (``streamed_exec``) — still ONE MERGE, one commit
with the watermark, so the exactly-once and atomic-visibility rules of ``mirror`` hold unchanged (unless the spec
opts into one commit per bucket, ``target.max_merge_rows``: docs/delta.md, "Driver memory").

What stays proportional to the batch: delta-rs (DataFusion) builds its join's hash table from the MERGE
source, so the compact source (kind, keep flags, written columns) is held once in delta-rs's memory while
the MERGE runs. Everything Python held besides — the collected frame, its converted copy, the source built
from it — is one bucket now (docs/delta.md, "Driver memory"; ``benchmarks/delta_memory.py``).

Bucket collection runs on a thread of this process (delta-rs pulls the stream from its own threads, and
Spark calls belong to a Python thread), at most ``AHEAD`` buckets ahead of the MERGE.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_provider_pglogical.apply.sparkenv import quoted
from airflow_provider_pglogical.apply.transforms import KEEP, KIND
from airflow_provider_pglogical.exceptions import ApplyError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# Net changes per bucket collected at a time. A table-batch that staged no more changes than this is collected
# whole (one bucket costs a cached frame and a summary pass more than collecting it: the streamed path is for
# batches beyond it, where it bounds what Python holds to about one bucket).
DEFAULT_CHUNK_ROWS = 1_000_000
AHEAD = 1  # buckets collected while the MERGE consumes the current one
BUCKET = "_pgl_bucket"


@dataclass(frozen=True)
class NetSummary:
    """What the MERGE must know before its first row: every row's columns are known only per bucket."""

    rows: int
    kept: tuple[str, ...]  # columns some change keeps (unchanged TOAST): the MERGE's CASE per column
    # An I/R change keeping a column: its value is in the target or earlier in the batch (``mirror.resolve_keeps``,
    # ``replay_net``), which reads the whole table's changes: such a table takes the collected path.
    needs_collected: bool


def summarise(net: DataFrame, columns: Sequence[str]) -> NetSummary:
    """One aggregation over ``net`` (cache it first: the buckets read it again)."""
    from pyspark.sql import functions as F

    has_keep = F.coalesce(F.size(F.col(KEEP)) > 0, F.lit(False))
    special = has_keep & F.col(KIND).isin("I", "R")
    row = net.agg(F.count(F.lit(1)).alias("n"), F.max(special.cast("int")).alias("special"),
                  F.flatten(F.collect_set(F.col(KEEP))).alias("kept")).first()
    assert row is not None  # a global aggregation has one row
    kept = set(row["kept"] or ())
    return NetSummary(rows=int(row["n"]), kept=tuple(c for c in columns if c in kept),
                      needs_collected=bool(row["special"]))


def worth_streaming(chunk_rows: int | None, staged_rows: int | None) -> bool:
    """Whether a table-batch's MERGE source streams: a bucket size is set and the manifest does not show the
    table-batch's staged changes (an upper bound of its net changes) fitting in one bucket."""
    return bool(chunk_rows) and (staged_rows is None or staged_rows > (chunk_rows or 0))


def buckets(rows: int, chunk_rows: int) -> int:
    return max(1, math.ceil(rows / max(1, chunk_rows)))


@dataclass(frozen=True)
class NetChunks:
    """A table-batch's net changes as key-disjoint Arrow tables in the net frame's layout, for a streamed commit:
    ``pieces(rows)`` any number of them of at most about ``rows`` each (one commit reads them all), ``buckets(count)``
    exactly ``count`` (one commit each). Spark's key-hash buckets (``frame_chunks``), or the key partitions netted in
    this process (``lake/parts.py``)."""

    pieces: Callable[[int], Generator[pa.Table, None, None]]
    buckets: Callable[[int], Generator[pa.Table, None, None]]


def frame_chunks(net: DataFrame, key: Sequence[str], rows: int) -> NetChunks:
    """``net`` (cached; ``rows`` net changes) collected one key-hash bucket at a time, ``AHEAD`` ahead."""
    def in_buckets(count: int) -> Generator[pa.Table, None, None]:
        return prefetched([partial(arrow, f) for f in bucket_frames(net, key, count)])

    return NetChunks(pieces=lambda chunk_rows: in_buckets(buckets(rows, chunk_rows)), buckets=in_buckets)


def arrow(frame: DataFrame) -> pa.Table:
    """A Spark frame collected as Arrow on the driver (no per-row Python): a bucket here, a whole frame in the
    lake targets."""
    return frame.toArrow()


def bucket_frames(net: DataFrame, key: Sequence[str], count: int) -> list[DataFrame]:
    """``net`` split into ``count`` frames by the hash of ``key`` (every row in exactly one; deterministic)."""
    from pyspark.sql import functions as F

    if count == 1:
        return [net]
    tagged = net.withColumn(BUCKET, F.pmod(F.xxhash64(*[F.col(quoted(k)) for k in key]), F.lit(count)))
    return [tagged.where(F.col(BUCKET) == i).drop(BUCKET) for i in range(count)]


_DONE = object()


def prefetched(produce: Sequence[Callable[[], pa.Table]], ahead: int = AHEAD) -> Generator[pa.Table, None, None]:
    """The tables ``produce`` makes, in order, made on a thread of their own at most ``ahead`` in advance; an error
    there is raised here. Closing the iterator early stops the thread after the table it is making."""
    slots: queue.Queue[object] = queue.Queue(maxsize=max(1, ahead))
    stop = threading.Event()

    def run() -> None:
        try:
            for make in produce:
                if stop.is_set():
                    return
                item: object = make()
                while not stop.is_set():
                    try:
                        slots.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
            slots.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            slots.put(exc)

    thread = threading.Thread(target=run, name="pglogical-merge-source", daemon=True)
    thread.start()
    try:
        while True:
            item = slots.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, pa.Table)
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                slots.get_nowait()
            except queue.Empty:
                thread.join(0.1)


class SourceStream:
    """Converted chunks as one ``RecordBatchReader`` of a fixed schema (the first chunk's), for delta-rs.

    delta-rs reports an exception raised while it reads the stream as its own error text; ``error`` keeps the
    original (a ``DeltaValueError`` naming column and LSN, a Spark failure) for the caller to raise instead. A
    stream that ends with another count of rows than the summary planned fails the MERGE too (``ApplyError``).
    """

    def __init__(self, chunks: Iterator[pa.Table], first: pa.Table, *, rows: int, where: str) -> None:
        self.schema = first.schema
        self.expected, self.where = rows, where
        self.error: BaseException | None = None
        self.rows = 0
        self._chunks = chunks
        self._first: pa.Table | None = first

    def _batches(self) -> Iterator[pa.RecordBatch]:
        try:
            while True:
                if self._first is not None:
                    table, self._first = self._first, None
                else:
                    table = next(self._chunks, None)
                    if table is None:
                        if self.rows != self.expected:  # raised inside the MERGE: it commits nothing
                            raise ApplyError(f"{self.where}: {self.rows} net change(s) reached the MERGE, "
                                             f"{self.expected} were planned")
                        return
                if table.schema != self.schema:
                    table = table.cast(self.schema)
                self.rows += table.num_rows
                yield from table.to_batches()
        except BaseException as exc:
            self.error = exc
            raise

    def reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, self._batches())
