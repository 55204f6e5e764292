"""A lake mirror's table-batch netted in key partitions in this process: no Spark, memory bounded by a partition.

A table-batch the direct path nets in this process but above its in-memory bounds (``DirectNet.partitions`` > 1:
``direct.compacted_batches``, ``apply/partitioned.py``) gives one batch of net rows per key partition. Their keys
are disjoint — a key's net row is in its own partition only, a key change's two halves in their keys' partitions —
so together they are the table-batch's net changes as key-disjoint chunks: what the lakes' streamed commit takes
from Spark's key-hash buckets (``lake/stream.py``: Delta's one MERGE reading a ``RecordBatchReader``, Iceberg's
copy-on-write plan chunk by chunk, one commit with the watermark either way).

That commit must know, before its first row, how many rows come and which columns some change keeps (the MERGE's
CASE per column), and whether some inserted row keeps a column (then the whole table's changes are needed:
``NetSummary.needs_collected``). So the partitions are netted first, one at a time, each partition's net rows
written to an Arrow IPC file in a spill directory of their own (``spill_dirs``: removed when the apply ends, however
it ends) while the summary is counted; then the commit reads them back, one memory-mapped file at a time, in
chunks of at most the target's bucket size. A table-batch whose summary needs the collected path goes to Spark
(its ordered changes are Spark's), having written nothing. A spill file that cannot be written or read back is an
``ApplyError`` raised inside the commit, which then commits nothing: the watermark stays, the batch is applied again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.apply import direct, partitioned, spill_dirs
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
        """The net rows, a partition at a time, each cut into chunks of at most ``chunk_rows``; one empty (typed)
        chunk when there is no row."""
        yielded = False
        for j, path in enumerate(self.paths):
            rows = self._read(j, path)
            for start in range(0, rows.num_rows, max(1, chunk_rows)):
                yielded = True
                yield rows.slice(start, chunk_rows)
            if not yielded and j == len(self.paths) - 1:
                yield rows

    def buckets(self, count: int) -> Generator[pa.Table, None, None]:
        """The net rows in exactly ``count`` chunks (key-disjoint: any cut of key-disjoint rows is) of
        ``ceil(rows / count)`` rows but the last, for one commit per chunk."""
        size = max(1, -(-self.summary.rows // max(1, count)))
        held: list[pa.Table] = []
        have = made = 0
        last: pa.Table | None = None
        for piece in self.pieces(size):
            last = piece
            while piece.num_rows:
                take = min(size - have, piece.num_rows)
                held.append(piece.slice(0, take))
                have += take
                piece = piece.slice(take)
                if have == size and made < count - 1:
                    yield pa.concat_tables(held)
                    held, have, made = [], 0, made + 1
        assert last is not None  # ``pieces`` yields at least one chunk
        yield pa.concat_tables(held) if held else last.slice(0, 0)
        for _ in range(made + 1, count):  # fewer rows than chunks
            yield last.slice(0, 0)

    def _read(self, j: int, path: str) -> pa.Table:
        try:
            # mapped, not copied: the table's buffers keep the pages mapped while it is used (also once removed)
            return pa.ipc.open_file(pa.memory_map(path)).read_all()
        except OSError as e:
            raise ApplyError(f"{self.source}: reading the net changes of key partition {j + 1} of {len(self.paths)} "
                             f"back from {self.directory} failed ({partitioned.reason(e)}); "
                             f"{partitioned.way_out(e, 'a directory nothing else cleans')}") from None


@contextlib.contextmanager
def spilled(net: DirectNet, columns: Sequence[str]) -> Iterator[SpilledNet]:
    """``net``'s table-batch netted in its key partitions (``direct.compacted_batches``), each partition's net rows
    in the net frame's layout (``lake/direct.framed``) written to a file of a spill directory that is removed when
    the block ends; yields them with their summary (``columns``: the written columns, in order)."""
    source = net.source or net.target
    base = partitioned.spill_directory()
    with contextlib.ExitStack() as claim:
        try:
            directory = claim.enter_context(spill_dirs.claimed(base, SPILL_PREFIX))
        except OSError as e:
            raise ApplyError(f"{source}: cannot spill the net changes of {net.partitions} key partitions to {base} "
                             f"({partitioned.reason(e)}); {partitioned.way_out(e, 'a writable directory')}") from None
        paths: list[str] = []
        rows, special = 0, False
        kept: set[str] = set()
        batches = direct.compacted_batches(direct.staged_chunks(net.files, net.filesystem), net)
        if isinstance(batches, Generator):  # closed on a failure here too: the netting's spill goes at once
            claim.callback(batches.close)
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


def _write(table: pa.Table, path: str, source: str, directory: str) -> str:
    try:
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
            writer.write_table(table)
    except OSError as e:
        raise ApplyError(f"{source}: spilling the net changes of a key partition to {directory} failed "
                         f"({partitioned.reason(e)}); {partitioned.way_out(e, 'a directory with room')}") from None
    return path
