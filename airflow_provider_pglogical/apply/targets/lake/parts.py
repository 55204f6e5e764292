"""A lake mirror's table-batch the direct path covers, streamed into the lake's commit from this process: no Spark,
memory bounded by a key partition (or a staged row group).

A table-batch the direct path nets in this process (``DirectNet.compacted``) gives one batch of net rows per key
partition (``direct.compacted_batches``, ``apply/partitioned.py``; one within the in-memory bounds). Their keys are
disjoint — a key's net row is in its own partition only, a key change's two halves in their keys' partitions —
so together they are the table-batch's net changes as key-disjoint chunks: what the lakes' streamed commit takes
from Spark's key-hash buckets (``lake/stream.py``: Delta's one MERGE reading a ``RecordBatchReader``, Iceberg's
copy-on-write plan chunk by chunk, one commit with the watermark either way). One whose keys never repeat gives
its staged row groups' per-row rewrite (``direct.plain_net_rows``): a net row per key, so any cut is key-disjoint.

That commit must know, before its first row, how many rows come and which columns some change keeps (the MERGE's
CASE per column), and whether some inserted row keeps a column (then the whole table's changes are needed:
``NetSummary.needs_collected``). So the partitions are netted (or the row groups read) first, one at a time,
each one's net rows written to an Arrow IPC file in a spill directory of their own (``spill_dirs``: removed when
the apply ends, however it ends) while the summary is counted; then the commit reads them back, one
memory-mapped file at a time, in chunks of the target's bucket size joined across files. A table-batch whose
summary needs the collected path goes to Spark (its ordered changes are Spark's), having committed nothing. A spill file that cannot be written is an ``ApplyError``
raised while spilling, before any commit. One that cannot be read back (gone, truncated, overwritten) is an
``ApplyError`` raised inside the commit, which then commits nothing — unless the target commits a bucket at a time
(Delta's ``max_merge_rows``): a failure in bucket k leaves the k-1 bucket commits before it. Either way the
watermark stays where it was, so the batch is applied again, to the same table.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_pglogical.apply import direct, partitioned
from airflow_provider_pglogical.apply.targets.base import DirectNet
from airflow_provider_pglogical.apply.targets.lake.direct import framed
from airflow_provider_pglogical.apply.targets.lake.stream import NetSummary
from airflow_provider_pglogical.apply.transforms import KEEP, KIND
from airflow_provider_pglogical.exceptions import ApplyError

SPILL_PREFIX = "pglogical-lake-net-"


@dataclass(frozen=True)
class SpilledNet:
    """A table-batch's net rows, one Arrow IPC file per key partition (``paths``), and their summary."""

    source: str
    directory: str
    paths: tuple[str, ...]
    summary: NetSummary

    def pieces(self, chunk_rows: int) -> Generator[pa.Table, None, None]:
        """The net rows in chunks of ``chunk_rows`` (the last one fewer), joined across partitions as they are read;
        one empty (typed) chunk when there is no row."""
        size = max(1, chunk_rows)
        held: list[pa.Table] = []
        have = 0
        last: pa.Table | None = None
        for j, path in enumerate(self.paths):
            rows = last = self._read(j, path)
            while rows.num_rows:
                take = min(size - have, rows.num_rows)
                held.append(rows.slice(0, take))
                have += take
                rows = rows.slice(take)
                if have == size:
                    yield pa.concat_tables(held)
                    held, have = [], 0
        if held:
            yield pa.concat_tables(held)
        elif self.summary.rows == 0:
            assert last is not None  # ``spilled`` writes a file whenever it yields a net with rows to read
            yield last

    def buckets(self, count: int) -> Generator[pa.Table, None, None]:
        """The net rows in exactly ``count`` chunks (key-disjoint: any cut of key-disjoint rows is) of
        ``ceil(rows / count)`` rows but the last, for one commit per chunk."""
        made = 0
        last: pa.Table | None = None
        for piece in self.pieces(-(-self.summary.rows // max(1, count))):
            made, last = made + 1, piece
            yield piece
        assert last is not None  # ``pieces`` yields at least one chunk
        for _ in range(made, count):  # fewer rows than chunks
            yield last.slice(0, 0)

    def _read(self, j: int, path: str) -> pa.Table:
        try:
            # mapped, not copied: the table's buffers keep the pages mapped while it is used (also once removed)
            return pa.ipc.open_file(pa.memory_map(path)).read_all()
        except OSError as e:  # gone or unreadable
            cause, way = partitioned.reason(e), partitioned.way_out(e, "a directory nothing else cleans")
        except pa.ArrowInvalid:  # truncated or overwritten
            cause = "not a whole Arrow IPC file"
            way = f"set {partitioned.SPILL_SWITCH} to a directory nothing else cleans"
        raise ApplyError(f"{self.source}: reading the net changes of spill file {j + 1} of {len(self.paths)} "
                         f"back from {self.directory} failed ({cause}); {way}")


@contextlib.contextmanager
def spilled(net: DirectNet, columns: Sequence[str]) -> Iterator[SpilledNet]:
    """``net``'s table-batch's net rows (``_net_batches``), each batch of them in the net frame's layout
    (``lake/direct.framed``) written to a file of a spill directory that is removed when the block ends; yields
    them with their summary (``columns``: the written columns, in order)."""
    source = net.source or net.target
    what = f"the net changes of {net.partitions} key partition(s)" if net.compacted else "the net changes"
    with partitioned.claim_spill_dir(source, SPILL_PREFIX, what) as directory, contextlib.closing(
            _net_batches(net)) as batches:
        # closed on a failure here too: the netting's spill goes at once
        paths: list[str] = []
        rows, special = 0, False
        kept: set[str] = set()
        for batch in batches:
            table = framed([batch], net.key, net.columns)
            assert table is not None  # one batch given
            rows += table.num_rows
            keep = table.column(KEEP)
            has_keep = pc.fill_null(pc.greater(pc.list_value_length(keep), 0), False)
            special = special or bool(pc.any(pc.and_(has_keep, pc.is_in(table.column(KIND), pa.array(["I", "R"]))))
                                      .as_py())
            if special:  # the batch goes to Spark: no need to net the rest
                break
            kept.update(v for v in pc.unique(pc.list_flatten(keep)).to_pylist() if v is not None)
            paths.append(_write(table, os.path.join(directory, f"net-{len(paths)}.arrow"), source, directory))
        summary = NetSummary(rows=rows, kept=tuple(c for c in columns if c in kept), needs_collected=special)
        yield SpilledNet(source, directory, tuple(paths), summary)


def _net_batches(net: DirectNet) -> Generator[pa.RecordBatch, None, None]:
    """``net``'s net rows: netted in its key partitions (``direct.compacted_batches``; one within the in-memory
    bounds), or a staged row group's per-row rewrite at a time (``direct.plain_net_rows``: keys never repeat)."""
    if net.compacted:
        yield from direct.compacted_batches(direct.staged_chunks(net.files, net.filesystem), net)
        return
    for path in net.files:
        parquet = pq.ParquetFile(path, filesystem=net.filesystem)
        for group in range(parquet.num_row_groups):
            yield from direct.plain_net_rows(parquet, group, net.key, net.columns, net.cut)


def _write(table: pa.Table, path: str, source: str, directory: str) -> str:
    try:
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
            writer.write_table(table)
    except OSError as e:
        raise ApplyError(f"{source}: spilling the net changes of a key partition to {directory} failed "
                         f"({partitioned.reason(e)}); {partitioned.way_out(e, 'a directory with room')}") from None
    return path
