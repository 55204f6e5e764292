"""In-process netting of a table-batch larger than the in-memory bounds, by key partitions.

``kernels.compact_changes`` nets a table-batch in one piece: its memory grows with the batch (about 6 bytes per
staged byte), so ``direct.py`` bounds it (``PGLOGICAL_APPLY_INPROCESS_ROWS`` / ``_BYTES``). Netting is per key —
a key's net row depends on its own events only — so a larger table-batch is netted here in ``partitions`` pieces
that fit those bounds on average (``partition_count``: hash partitions are only as even as the keys' hashes, and
a key change counts in two of them):

1. the staged row groups are read once, a few at a time (``_gathered``: at most ``ROUTE_ROWS`` rows and about
   ``ROUTE_BYTES`` bytes, whatever the rows' width); the publication is applied per change
   (``published.publish``: actions, row filter);
2. each change is routed by a hash of its key events' keys (``kernels.key_events``: the old key of a DELETE or of
   an UPDATE that keeps its key, the refilled new key of an INSERT or of the new half of a key change) to one
   partition; a key change touches two keys, so it goes to both keys' partitions when they differ (``route``);
3. each partition is spilled to an Arrow IPC file in a temporary directory under ``spill_directory()``;
4. each partition is read back into memory and netted by ``kernels.compact_changes``, the code the whole
   batch would go through; of its net rows, those whose key belongs to the partition (``key_hash``) are kept: a
   key change routed to the partition of its other key also makes a partial group of a key netted elsewhere.

Every event of a key lands in that key's partition, so each key's net row is the one the whole-batch netting gives
(``tests/unit/apply/test_partitioned.py`` compares them on random batches). The union of the partitions' rows is
the whole batch's net rows, which a target receives as a stream of batches (the PostgreSQL target COPYs them into
its staging table and applies them together, as it does a single batch). Spill files are removed as each partition
is netted, and the directory when the netting ends, whether it succeeded or failed, or when its consumer closes
it (``arrownet.copy_tasks`` closes it when the COPY fails); a failure raises ``ApplyError`` before the target
commits, so nothing is lost. A killed process leaves its ``pglogical-net-*`` directory behind until the next netting
under the same base removes it (``spill_dirs``: each directory is locked by its live process). A single key's
changes are never split: a key changed more often than a partition's share holds its partition above the bounds.
A partition whose string or binary column reaches Arrow's 2 GiB offsets fails with an ``ApplyError`` that names
``PGLOGICAL_APPLY_INPROCESS_ROWS=0`` (``overflow_error``), which leaves such table-batches to Spark.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Generator, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.apply import kernels, published, spill_dirs
from airflow_provider_pglogical.exceptions import ApplyError

SPILL_SWITCH = "PGLOGICAL_APPLY_SPILL_DIR"
SPILL_PREFIX = "pglogical-net-"
# Staged rows routed at a time: row groups (32k rows by default) are gathered to this many, or to this many bytes
# of Arrow buffers, whichever comes first, so the per-chunk cost of the routing and of the spill writes stays small
# beside the rows' own while a chunk of wide rows (and its published and per-partition copies) stays small beside
# the bounds and far below Arrow's 2 GiB offsets.
ROUTE_ROWS = 262_144
ROUTE_BYTES = 32 * 2**20
_NULL_HASH = np.uint64(0x9E3779B97F4A7C15)  # a null key value's hash (nulls group together)
_MIX = np.uint64(1_000_003)


def spill_directory() -> str:
    """Where partitions are spilled: ``PGLOGICAL_APPLY_SPILL_DIR``, else the system's temporary directory."""
    return os.environ.get(SPILL_SWITCH, "").strip() or tempfile.gettempdir()


def partition_count(rows: int, staged_bytes: int, rows_bound: int, bytes_bound: int) -> int:
    """Partitions of a table-batch of ``rows`` staged changes and ``staged_bytes`` uncompressed staged bytes so that
    each holds at most ``rows_bound`` changes and ``bytes_bound`` bytes on average (0: no such bound); 1 when it fits
    whole."""
    count = 1
    if rows_bound:
        count = max(count, -(-rows // rows_bound))
    if bytes_bound:
        count = max(count, -(-staged_bytes // bytes_bound))
    return count


def key_hash(keys: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """A 64-bit hash per row of key columns: equal keys by Arrow equality (nulls equal to nulls, values of one type)
    hash equally, whatever their chunks or their neighbours' nulls (a function of each value's bytes only)."""
    n = len(keys[0]) if keys else 0
    out = np.zeros(n, dtype=np.uint64)
    for values in keys:
        whole = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        out = _mix(out * _MIX ^ _column_hash(whole))
    return out


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: every input bit moves every output bit (wrapping uint64 arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def _column_hash(values: pa.Array) -> np.ndarray:
    dtype = values.type
    if pa.types.is_boolean(dtype):
        values = values.cast(pa.int8())
    elif pa.types.is_temporal(dtype) and dtype.bit_width in (32, 64):  # dates, times, timestamps, durations
        values = values.view(pa.int32() if dtype.bit_width == 32 else pa.int64())
    if pa.types.is_integer(values.type):
        words = np.asarray(pc.fill_null(values.cast(pa.int64(), safe=False), 0).to_numpy()).view(np.uint64)
        hashed = _mix(words)
    elif (pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_binary(dtype)
          or pa.types.is_large_binary(dtype)):
        hashed = _bytes_hash(values)
    elif dtype.bit_width and dtype.bit_width % 8 == 0:  # decimals, fixed-size binaries: their fixed-width bytes
        hashed = _fixed_hash(values, dtype.bit_width // 8)
    else:
        raise ApplyError(f"a key of type {dtype} cannot be partitioned")  # not groupable: never netted here
    hashed[~kernels.mask(values.is_valid())] = _NULL_HASH
    return hashed


def _fixed_hash(values: pa.Array, width: int) -> np.ndarray:
    n = len(values)
    data = np.frombuffer(values.buffers()[1], dtype=np.uint8)[values.offset * width:(values.offset + n) * width]
    padded = np.zeros((n, -(-width // 8) * 8), dtype=np.uint8)
    padded[:, :width] = data.reshape(n, width)
    words = padded.view(np.uint64)
    out = np.zeros(n, dtype=np.uint64)
    for i in range(words.shape[1]):
        out = _mix(out * _MIX ^ words[:, i])
    return out


_P = 0x100000001B3  # odd, so invertible modulo 2**64
_P_INVERSE = pow(_P, -1, 2**64)
# Values hashed at a time, at most this many rows and about this many bytes of them (a single longer value alone):
# the byte-wise uint64 arrays below take 8 bytes per value byte each.
_HASH_SLICE = 16_384
_HASH_BYTES = 2**20


def _hash_slices(offsets: np.ndarray) -> Iterator[tuple[int, int]]:
    """The ``[first, last)`` row ranges ``_bytes_hash`` hashes at a time, from the values' offsets."""
    n = len(offsets) - 1
    first = 0
    while first < n:
        within = int(np.searchsorted(offsets, offsets[first] + _HASH_BYTES, side="right")) - 1
        last = min(n, first + _HASH_SLICE, max(within, first + 1))
        yield first, last
        first = last


def _bytes_hash(values: pa.Array) -> np.ndarray:
    """Per value, its bytes as a polynomial in ``_P`` modulo 2**64 (prefix sums over the data buffer, rescaled to
    each value's start by the inverse powers), mixed with its length."""
    n = len(values)
    large = pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)
    buffers = values.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if large else np.int32)[values.offset:values.offset + n + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, dtype=np.uint8)
    out = np.empty(n, dtype=np.uint64)
    for first, last in _hash_slices(offsets):
        bounds = offsets[first:last + 1].astype(np.int64)
        lo = int(bounds[0])
        segment = data[lo:int(bounds[-1])].astype(np.uint64)
        powers = np.cumprod(np.full(len(segment), _P, dtype=np.uint64)) * np.uint64(_P_INVERSE)  # P**i
        inverse = np.cumprod(np.full(len(segment) + 1, _P_INVERSE, dtype=np.uint64)) * np.uint64(_P)  # P**-i
        sums = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(segment * powers, dtype=np.uint64)])
        start, end = bounds[:-1] - lo, bounds[1:] - lo
        out[first:first + len(start)] = _mix((sums[end] - sums[start]) * inverse[start]
                                             ^ (end - start).astype(np.uint64))
    return out


def route(staged: pa.Table, key: Sequence[str], identity: Sequence[str], partitions: int) -> list[np.ndarray]:
    """Per partition, the staged rows (ascending) it needs: each change goes where its key event's key hashes, a key
    change also where its old key's (its away event) hashes when that differs. ``staged``: in one chunk."""
    events = kernels.key_events(staged, key, key, identity)  # the key columns are all the routing needs
    where = (key_hash(events.key) % np.uint64(partitions)).astype(np.int64)
    n = staged.num_rows
    away_rows, away_where = events.source[n:], where[n:]
    second = away_where != where[away_rows]
    rows = np.concatenate([np.arange(n), away_rows[second]])
    part = np.concatenate([where[:n], away_where[second]])
    order = np.lexsort((rows, part))
    rows, part = rows[order], part[order]
    bounds = np.searchsorted(part, np.arange(partitions + 1))
    return [rows[bounds[j]:bounds[j + 1]] for j in range(partitions)]


def _gathered(chunks: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """The staged row groups gathered to about ``ROUTE_ROWS`` rows or ``ROUTE_BYTES`` bytes, each in one chunk."""
    held: list[pa.Table] = []
    rows = size = 0
    for chunk in chunks:
        held.append(chunk)
        rows += chunk.num_rows
        size += chunk.nbytes
        if rows >= ROUTE_ROWS or size >= ROUTE_BYTES:
            yield pa.concat_tables(held).combine_chunks()
            held, rows, size = [], 0, 0
    if held:
        yield pa.concat_tables(held).combine_chunks()


def netted(chunks: Iterable[pa.Table], *, source: str, key: Sequence[str], columns: Sequence[str],
           identity: Sequence[str], row_filter: str | None, actions: Sequence[str], partitions: int
           ) -> Generator[kernels.Net, None, None]:
    """The net rows of a table-batch's staged changes (``chunks``: its row groups, ``kernels.STAGED_COLUMNS``),
    published then netted in ``partitions`` key partitions spilled to disk (module docstring): one ``kernels.Net``
    per partition, whose union is ``kernels.compact_changes`` of the whole published batch. ``source`` names the
    table in errors."""
    # removes the directory however the netting ends (closed early included)
    with claim_spill_dir(source, SPILL_PREFIX, f"{partitions} key partitions of the table-batch") as directory:
        paths = [os.path.join(directory, f"part-{j}.arrow") for j in range(partitions)]
        spilled = _spill(chunks, paths, key=key, identity=identity, row_filter=row_filter, actions=actions,
                         source=source, directory=directory)
        for j, path in enumerate(paths):
            if not spilled[j]:
                continue
            try:
                with pa.OSFile(path) as f:  # read into memory: the netting copies its columns anyway
                    staged = pa.ipc.open_file(f).read_all()
            except OSError as e:
                raise ApplyError(f"{source}: reading key partition {j + 1} of {partitions} of the table-batch back "
                                 f"from {directory} failed ({reason(e)}); {way_out(e, 'a directory nothing else cleans')}"
                                 ) from None
            try:
                rows = kernels.compact_changes(staged, key, columns, identity)
            except pa.ArrowInvalid:
                raise overflow_error(source, f"netting key partition {j + 1} of {partitions} "
                                             f"({spilled[j]} staged changes)") from None
            del staged
            os.remove(path)
            owned = (key_hash(rows.keys) % np.uint64(partitions)) == j
            yield rows if owned.all() else rows.take(np.flatnonzero(owned))


@contextlib.contextmanager
def claim_spill_dir(source: str, prefix: str, what: str) -> Iterator[str]:
    """A spill directory of its own (``prefix``) under ``spill_directory``, removed when the block ends however it
    ends; one that cannot be made is a typed error naming ``source`` and ``what`` was to be spilled."""
    base = spill_directory()
    with contextlib.ExitStack() as claim:
        try:
            directory = claim.enter_context(spill_dirs.claimed(base, prefix))
        except OSError as e:
            raise ApplyError(f"{source}: cannot spill {what} to {base} ({reason(e)}); "
                             f"{way_out(e, 'a writable directory')}") from None
        yield directory


def overflow_error(source: str, where: str) -> ApplyError:
    """Arrow refused to build a piece of a table-batch in memory: a string or binary column of 2 GiB or more in one
    array (32-bit offsets), which the staged files' Parquet sizes did not foretell. Its message (which may quote a
    value) is left out; the way out is Spark, which reads the files in parts."""
    return ApplyError(f"{source}: {where}, a string or binary column of the table-batch reached Arrow's 2 GiB "
                      "array limit; set PGLOGICAL_APPLY_INPROCESS_ROWS=0 to net such table-batches with Spark")


def reason(e: OSError) -> str:
    """An ``OSError``'s reason alone (pyarrow's messages also quote the path, which the error names already)."""
    return os.strerror(e.errno) if e.errno else str(e)


def way_out(e: OSError, directory: str) -> str:
    """What to change after a spill's ``OSError``, by its errno."""
    if e.errno in (errno.EMFILE, errno.ENFILE):  # one open file per partition while spilling
        return ("raise PGLOGICAL_APPLY_INPROCESS_BYTES / PGLOGICAL_APPLY_INPROCESS_ROWS for fewer partitions, or the "
                "open-file limit (ulimit -n)")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"give this user write access to it, or set {SPILL_SWITCH} to a writable directory"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"set {SPILL_SWITCH} to a directory with room"
    return f"set {SPILL_SWITCH} to {directory}"


def _spill(chunks: Iterable[pa.Table], paths: Sequence[str], *, key: Sequence[str], identity: Sequence[str],
           row_filter: str | None, actions: Sequence[str], source: str, directory: str) -> list[int]:
    """Publish, route and write every change to its partitions' files; the rows written to each."""
    writers: list[pa.ipc.RecordBatchFileWriter] = []
    written = [0] * len(paths)
    schema: pa.Schema | None = None
    try:
        for chunk in _gathered(chunks):
            chunk = published.publish(chunk, row_filter=row_filter, actions=actions, identity=identity)
            if not chunk.num_rows:
                continue
            chunk = chunk.combine_chunks()
            if schema is None:
                schema = chunk.schema
                writers = [pa.ipc.new_file(p, schema) for p in paths]
            elif not chunk.schema.equals(schema):
                chunk = chunk.cast(schema)
            for j, rows in enumerate(route(chunk, key, identity, len(paths))):
                if len(rows):
                    writers[j].write_table(chunk.take(pa.array(rows, pa.int64())))
                    written[j] += len(rows)
        while writers:
            writers.pop().close()
    except OSError as e:
        raise ApplyError(f"{source}: spilling key partitions of the table-batch to {directory} failed after "
                         f"{sum(written)} staged changes ({reason(e)}); {way_out(e, 'a directory with room')}"
                         ) from None
    except pa.ArrowInvalid:
        raise overflow_error(source, f"spilling {len(paths)} key partitions (after {sum(written)} staged "
                                     "changes)") from None
    finally:
        for writer in writers:  # left open by a failure: their files go with the directory
            try:
                writer.close()
            except OSError:
                pass
    return written
