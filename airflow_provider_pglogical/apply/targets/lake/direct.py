"""A lake mirror's table-batch read straight from its staged files: the direct path (``apply/direct.py``) for the
lake targets (Delta, Iceberg).

When the direct path covers a table-batch (``DirectNetSource.direct_net``: a row filter and actions it applies per change,
no exactness note, one schema version, keys that never repeat — or few enough changes to net in this process,
several schema versions among them, in their union: ``apply/versions.py``),
its net rows are the per-row rewrite ``direct.net_rows`` (or the Arrow kernels' ``direct.compacted_rows``) of
the staged Parquet. ``net_table`` gives them in the layout of ``BatchChanges.net`` collected as Arrow (``KIND``,
``KEEP`` as a list of column names, ``LSN``, the moved-from key columns, ``TOUCHED``, the written columns), so the
lake's collected apply (``lake/net.py``) merges them exactly as it merges Spark's frame — no JVM, no Parquet scan
by Spark, no ``toArrow``.

Only for written columns of the flat types whose staged Arrow values are what Spark's read gives after the lake's
conversion: integers, floats, booleans, text, bytes, ``decimal128``, dates and µs timestamps. Both lakes convert
with one mapping (``delta/types.delta_type``; Iceberg's ``iceberg/types.iceberg_type`` only widens 8- and 16-bit
integers to ``int``, which it does to Spark's ``short`` alike), so the set is the same for both: ``pg_lsn``'s
``uint64`` becomes the ``decimal(20,0)`` Spark reads, ``money``'s minor units the same ``decimal(19,2)``.
Anything else (arrays, composites, ranges, ``time``/``timetz``, ``interval``, ``numeric`` wider than 38 digits)
goes through Spark. ``PGLOGICAL_APPLY_DIRECT=0`` switches it off with the rest of the direct path (the
reference); ``tests/integration/test_lake_direct_apply.py`` applies random batches, filtered tables and every
source type (the direct path's types as one table, a column each) both ways into each lake.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.apply import direct
from airflow_provider_pglogical.apply.targets.base import DirectNet, from_column
from airflow_provider_pglogical.apply.transforms import KEEP, KIND, LSN, TOUCHED


def flat_type(dtype: pa.DataType) -> bool:
    """Whether a staged column of this Arrow type converts for the lake as Spark's read of it does."""
    return bool(pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype)
                or pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_binary(dtype)
                or pa.types.is_large_binary(dtype) or pa.types.is_decimal128(dtype) or pa.types.is_date32(dtype)
                or (pa.types.is_timestamp(dtype) and dtype.unit == "us"))


def readable(net: DirectNet) -> bool:
    """Whether every written column of the table-batch's staged images has a ``flat_type`` (of several schema
    versions: in their union, ``versions.conform``'s types, which are Spark's union's)."""
    image = (net.union.new if net.union is not None
             else pq.read_schema(net.files[0], filesystem=net.filesystem).field("new").type)
    if not isinstance(image, pa.StructType):
        return False
    types = {image.field(i).name: image.field(i).type for i in range(image.num_fields)}
    return all(c in types and flat_type(types[c]) for c in net.columns)


def net_table(net: DirectNet) -> pa.Table | None:
    """The table-batch's net rows as ``BatchChanges.net`` collected as Arrow, or None when a written column's type
    is not ``flat_type`` (then Spark's frame is the way)."""
    if not net.files or not readable(net) or (net.key and net.partitions > 1):
        return None  # a keyed table-batch in key partitions: ``lake/parts.py`` streams it
    if net.compacted:  # keyless: the published INSERTs appended a row group at a time, any size; keyed: the Arrow
        # kernels net the whole table-batch at once (several schema versions: in their union, as Spark's frame has
        # them, so the mirror follows the same columns and types; an overflow is ``compacted_batches``' typed error)
        batches = list(direct.compacted_batches(direct.staged_chunks(net.files, net.filesystem), net))
    else:
        batches = [b for p in net.files
                   for b in direct.plain_net_rows(pq.ParquetFile(p, filesystem=net.filesystem), None, net.key,
                                                  net.columns, net.cut)]
    return framed(batches, net.key, net.columns)


def framed(batches: Sequence[pa.RecordBatch], key: Sequence[str], columns: Sequence[str]) -> pa.Table | None:
    """``direct.net_rows`` / ``direct.compacted_rows`` batches named as the net frame: the per-row rewrite's ``keep``
    (an empty array as COPY text) becomes an empty list, as every row of it keeps nothing. Both give a batch of
    their types when no row is left (every change before a cut), so the frame is typed without Spark; None only
    without any batch (no staged file)."""
    names = [KIND, KEEP, LSN, *[from_column(i) for i in range(len(key))], TOUCHED, *columns]
    out = []
    for batch in batches:
        arrays = list(batch.columns)
        if not pa.types.is_list(arrays[1].type):
            arrays[1] = pa.array([[]] * batch.num_rows, pa.list_(pa.string()))
        out.append(pa.table(arrays, names=names))
    if not out:
        return None
    return pa.concat_tables(out, promote_options="default")
