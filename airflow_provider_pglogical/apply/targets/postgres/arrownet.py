"""Net changes of a transform-free table-batch (``apply/direct.py``) printed as COPY text straight from the staged files.

The executors read their row groups of the staged Parquet with pyarrow, turn each change into its net row(s) —
the rows ``to_key_events`` + ``single_event_net`` give for such a batch (``direct.net_rows``) — print them with
``arrowtext`` and COPY them into the staging table: no Spark Parquet read, no struct handling in the JVM, no
Arrow conversion of typed columns there. Only types ``arrowtext`` prints exactly qualify (``arrowtext.arrow_kind``,
the same decision as ``copytext._arrow_kind`` on the type Spark would read), and dates/timestamps only when the
row groups' statistics keep them within Arrow's printable range (``arrowtext.ARROW_DAYS`` / ``ARROW_MICROS``);
anything else keeps the Spark path.

A compacted plan (``DirectNet.compacted``: keys repeat, or unchanged-TOAST values) runs its tasks in one slice: its
row groups are read together and netted in one piece by ``direct.compacted_rows`` (Arrow kernels, ``apply/kernels.py``), or
above the in-memory bounds in key partitions spilled to disk (``direct.compacted_batches``, ``apply/partitioned.py``),
whose net rows are COPYed one partition after another into the one staging table; keep lists are printed as text
arrays; the rows are those of Spark's net frame, staged and applied the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_provider_pglogical.apply import direct
from airflow_provider_pglogical.apply.targets.base import Cut, DirectNet
from airflow_provider_pglogical.apply.targets.postgres import arrowtext
from airflow_provider_pglogical.apply.targets.postgres.copy import copy_chunks
from airflow_provider_pglogical.apply.targets.postgres.target_types import ARRAY, SCALAR, PgType
from airflow_provider_pglogical.apply.versions import SchemaUnion
from airflow_provider_pglogical.exceptions import ApplyError
from airflow_provider_pglogical.staging.layout import is_local_filesystem

CHUNK_ROWS = 65_536
# A staged file by its path in the plan's filesystem, or its bytes already read (a snapshot chunk streamed into
# its COPY while the snapshot reads on: ``streamed.py`` hashes what it loads)
StagedFile: TypeAlias = "str | pa.Buffer"


@dataclass(frozen=True)
class DirectPlan:
    """What the executors need: the row groups to read, the key, the written columns and each one's kind."""

    key: tuple[str, ...]
    columns: tuple[str, ...]
    kinds: tuple[str, ...]  # arrowtext kind of each written column
    key_kinds: tuple[str, ...]
    tasks: tuple[tuple[str, int], ...]  # (file, row group)
    compacted: bool = False  # the tasks are netted together (``direct.compacted_rows``): run them as one
    identity: tuple[str, ...] = ()  # the source's replica identity columns (the TOAST refill of compacted rows)
    row_filter: str | None = None  # the publication of compacted rows (``DirectNet``), applied before netting
    actions: tuple[str, ...] = ("insert", "update", "delete")
    # The staging area's filesystem the task files are paths of (``DirectNet.filesystem``); None: local.
    filesystem: pafs.FileSystem | None = field(default=None, compare=False, repr=False)
    partitions: int = 1  # key partitions a compacted plan is netted in (``DirectNet.partitions``)
    source: str = ""  # the source table (named in a spill's errors)
    cut: Cut | None = None  # the changes that count (``DirectNet.cut``): the others are left out as they are read
    union: SchemaUnion | None = None  # several schema versions' union (``DirectNet.union``), each file conformed to it

    @property
    def local(self) -> bool:
        """Whether the files are local paths (an executor's task may be handed them as they are)."""
        return is_local_filesystem(self.filesystem)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled only to be handed to Spark's tasks, which only local files may be: a plan on an object store holds
        the staging area's filesystem with its credentials, so this process copies it itself (``_copy_here``)."""
        if not self.local:
            raise ApplyError(f"a direct plan of {len(self.tasks)} task(s) on a {self.filesystem.type_name} "  # type: ignore[union-attr]
                             "filesystem is copied by this process only, never handed to Spark's tasks")
        return dict(self.__dict__)


def _in_printable_range(parquet: pq.ParquetFile, column_paths: Iterable[str]) -> bool:
    """Whether every row group's min/max of these date/timestamp leaf columns lies in Arrow's printable range
    (BC, five-digit years and ±infinity do not); a row group without statistics answers False."""
    meta = parquet.metadata
    paths = set(column_paths)
    if not paths:
        return True
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        for i in range(group.num_columns):
            chunk = group.column(i)
            if chunk.path_in_schema not in paths:
                continue
            stats = chunk.statistics
            if stats is None:
                return False
            if not stats.has_min_max:
                if stats.has_null_count and stats.null_count == chunk.num_values:
                    continue  # only nulls
                return False
            low, high = arrowtext.ARROW_DAYS if chunk.physical_type == "INT32" else arrowtext.ARROW_MICROS
            lo, hi = stats.min_raw, stats.max_raw
            if not isinstance(lo, int) or not isinstance(hi, int) or lo < low or hi > high:
                return False
    return True


def _image_kinds(schema: pa.Schema, image: str, wanted: Sequence[str],
                 temporal: list[str], *, arrays: bool = False) -> list[str] | None:
    """The ``arrowtext`` kind of each ``wanted`` field of the file's ``image`` struct (its date/timestamp leaf
    paths appended to ``temporal``), or None when the image or a field is missing or a type needs the JVM."""
    if image not in schema.names or not pa.types.is_struct(schema.field(image).type):
        return None
    struct = schema.field(image).type
    names = [struct.field(i).name for i in range(struct.num_fields)]
    kinds: list[str] = []
    for c in wanted:
        if c not in names:
            return None
        kind = arrowtext.arrow_kind(struct.field(names.index(c)).type, arrays=arrays)
        if kind is None:
            return None
        if kind in (arrowtext.TEMPORAL, arrowtext.TIMESTAMPTZ):
            temporal.append(f"{image}.{c}")
        kinds.append(kind)
    return kinds


def plan_direct(net: DirectNet, types: Mapping[str, PgType]) -> DirectPlan | None:
    """The executors' plan for ``net``, or None when a column needs the JVM's text (its type, its target type
    tree, or a date/timestamp beyond Arrow's range) — then the table-batch takes the Spark path."""
    if any(c in types for c in net.columns):
        return None
    kinds: list[str] = []
    key_kinds: list[str] = []
    tasks: list[tuple[str, int]] = []
    for n, path in enumerate(net.files):
        parquet = pq.ParquetFile(path, filesystem=net.filesystem)
        temporal: list[str] = []
        # several schema versions: every file is printed in the union's types (``versions.conform``)
        schema = net.union.staged_schema(parquet.schema_arrow) if net.union is not None else parquet.schema_arrow
        new_kinds = _image_kinds(schema, "new", net.columns, temporal)
        old_kinds = _image_kinds(schema, "old", net.key, temporal)
        if new_kinds is None or old_kinds is None or not _in_printable_range(parquet, temporal):
            return None
        if n == 0:
            kinds, key_kinds = new_kinds, old_kinds
        tasks.extend((path, rg) for rg in range(parquet.metadata.num_row_groups))
    return DirectPlan(net.key, net.columns, tuple(kinds), tuple(key_kinds), tuple(tasks), net.compacted, net.identity,
                      net.row_filter, net.actions, net.filesystem, net.partitions, net.source, net.cut, net.union)


@dataclass(frozen=True)
class RowsPlan:
    """A snapshot table's plain rows (the ``new`` images as they are) to print: row groups, columns, kinds."""

    columns: tuple[str, ...]
    kinds: tuple[str, ...]
    tasks: tuple[tuple[StagedFile, int], ...]  # (file, row group)
    filesystem: pafs.FileSystem | None = field(default=None, compare=False, repr=False)  # of the files; None: local


def plan_rows(files: Sequence[StagedFile], columns: Sequence[str], types: Mapping[str, PgType],
              filesystem: pafs.FileSystem | None = None) -> RowsPlan | None:
    """The plan for printing a snapshot's rows (``SnapshotChanges.direct_rows``), or None when a column needs the
    JVM's text — as ``plan_direct`` decides, on the ``new`` image only, and with arrays of text or plain scalars
    too (a snapshot with a shape or element note never gets here: its rows are not plain)."""
    if not files or not columns or any(c in types and not _scalar_array(types[c]) for c in columns):
        return None
    kinds: list[str] | None = None
    tasks: list[tuple[StagedFile, int]] = []
    for path in files:
        parquet = pq.ParquetFile(path, filesystem=filesystem)
        temporal: list[str] = []
        file_kinds = _image_kinds(parquet.schema_arrow, "new", columns, temporal, arrays=True)
        if file_kinds is None or (kinds is not None and file_kinds != kinds) or not _in_printable_range(parquet, temporal):
            return None
        kinds = file_kinds
        tasks.extend((path, rg) for rg in range(parquet.metadata.num_row_groups))
    return RowsPlan(tuple(columns), tuple(kinds or ()), tuple(tasks), filesystem)


def _scalar_array(tree: PgType) -> bool:
    """A target array of a plain scalar type (not of money, ranges, composites or arrays)."""
    return tree.kind == ARRAY and tree.element is not None and tree.element.kind == SCALAR


def row_text(plan: RowsPlan, chunk_bytes: int) -> Callable[[Iterable[tuple[StagedFile, int]]], Iterator[bytes]]:
    """A ``mapPartitions`` function over ``plan.tasks``: each row group's ``new`` columns read with pyarrow and
    printed by ``arrowtext``, yielded in chunks of whole lines of about ``chunk_bytes``."""
    fields = [arrowtext.Field(k, c) for k, c in zip(plan.kinds, plan.columns, strict=True)]

    def run(tasks: Iterable[tuple[StagedFile, int]]) -> Iterator[bytes]:
        parts: list[bytes] = []
        size = 0
        for path, rg in tasks:
            new = (pq.ParquetFile(path, filesystem=plan.filesystem).read_row_group(rg, columns=["new"]).column("new")
                   .combine_chunks())
            if not len(new):
                continue
            batch = pa.RecordBatch.from_arrays([new.field(c) for c in plan.columns], names=list(plan.columns))
            for start in range(0, batch.num_rows, CHUNK_ROWS):
                data = arrowtext.line_bytes(batch.slice(start, CHUNK_ROWS), fields)
                parts.append(data)
                size += len(data)
                if size >= chunk_bytes:
                    yield b"".join(parts)
                    parts, size = [], 0
        if parts:
            yield b"".join(parts)

    return run


def _fields(plan: DirectPlan) -> list[arrowtext.Field]:
    """op, keep, lsn, the moved-from key, touched, the written columns (``direct.net_rows``' batches):
    ``staging_columns``' order."""
    names = [*direct.net_row_names(plan.key), *[f"c{i}" for i in range(len(plan.columns))]]
    keep = arrowtext.ARRAY_TEXT if plan.compacted else arrowtext.PLAIN  # a list of names, or the literal '{}'
    kinds = [arrowtext.PLAIN, keep, arrowtext.PLAIN, *plan.key_kinds, arrowtext.PLAIN, *plan.kinds]
    return [arrowtext.Field(k, n) for k, n in zip(kinds, names, strict=True)]


def copy_tasks(dsn: str, staging: str, columns: Sequence[str], plan: DirectPlan
               ) -> Callable[[Iterable[tuple[str, int]]], Iterable[int]]:
    """A ``mapPartitions`` function over ``plan.tasks``: each partition's row groups read, netted, printed and
    COPYed as one statement into ``staging`` (``columns``: ``staging_columns``' names); yields the row count."""
    fields = _fields(plan)

    def net_batches(tasks: Iterable[tuple[str, int]]) -> Generator[pa.RecordBatch, None, None]:
        if plan.compacted:  # every row group of the table-batch, netted together (in key partitions above the bounds)
            net = DirectNet(plan.source, "", (), plan.key, plan.columns, compacted=True, identity=plan.identity,
                            row_filter=plan.row_filter, actions=plan.actions, partitions=plan.partitions, cut=plan.cut,
                            union=plan.union)
            groups = (direct.staged_group(pq.ParquetFile(path, filesystem=plan.filesystem), rg) for path, rg in tasks)
            yield from direct.compacted_batches(groups, net)
            return
        for path, rg in tasks:
            yield from direct.plain_net_rows(pq.ParquetFile(path, filesystem=plan.filesystem), rg, plan.key,
                                             plan.columns, plan.cut)

    def chunks(tasks: Iterable[tuple[str, int]]) -> Generator[tuple[bytes, int], None, None]:
        with contextlib.closing(net_batches(tasks)) as batches:  # its close reaches the netting's
            for batch in batches:
                for start in range(0, batch.num_rows, CHUNK_ROWS):
                    part = batch.slice(start, CHUNK_ROWS)
                    yield arrowtext.line_bytes(part, fields), part.num_rows

    def run(tasks: Iterable[tuple[str, int]]) -> Iterable[int]:
        # Closed however the COPY ends: a failed COPY's traceback holds the generator, whose netting would keep
        # its spill files (``partitioned.netted``) until garbage collection.
        with contextlib.closing(chunks(tasks)) as lines:
            yield copy_chunks(dsn, staging, columns, lines)

    return run
