"""Table-batches whose net changes need none of the shared transforms: a target may read their staged files itself.

``transforms.py`` turns staged changes into one net change per key through Spark. For the common table-batch —
every action published, no row filter, no exactness notes, no truncate or snapshot cut-off, no routed parts, no
unchanged-TOAST value, one schema version holding every written column (``same_schema``: a table-batch spanning
several versions goes through Spark, which writes each change with its own version's columns), and no key in two
changes (``keys_never_repeat``) — that pipeline reduces to a per-row rewrite (``to_key_events`` then
``single_event_net``):

* an INSERT is an ``I`` of its new image;
* an UPDATE that keeps its key is a ``U`` of its new image (old and new key are equal);
* an UPDATE that changes its key is a ``D`` of the old key plus an ``I`` of the new image moved from the old key;
* a DELETE is a ``D`` of its old key;

nothing kept from the target, nothing touched. A target that can print and load those rows without Spark's
Parquet read, struct handling and Arrow conversion asks ``DirectNetSource.direct_net`` and gets the files (or
None: then ``BatchChanges.net`` as always). ``PGLOGICAL_APPLY_DIRECT=0`` switches it off (the general path),
which the semantic suites use to run both paths.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from airflow_provider_pglogical.apply.targets.base import PlannedTable

ENV_SWITCH = "PGLOGICAL_APPLY_DIRECT"


@dataclass(frozen=True)
class DirectNet:
    """One table-batch's staged files (absolute local paths) whose rows map one-to-one to net changes (module
    docstring); ``columns`` are the written columns (``PlannedTable.columns``), ``key`` its key."""

    source: str
    target: str
    files: tuple[str, ...]
    key: tuple[str, ...]
    columns: tuple[str, ...]


@runtime_checkable
class DirectNetSource(Protocol):
    """``BatchChanges`` that can hand a table-batch's staged files to a target (``direct_net``)."""

    def direct_net(self, table: PlannedTable) -> DirectNet | None: ...


@runtime_checkable
class DirectRowsSource(Protocol):
    """Snapshot changes that can hand a table's staged snapshot files to a target (``direct_rows``): their
    rows are the ``new`` images as they are (``SnapshotChanges.rows``' plain case)."""

    def direct_rows(self, table: PlannedTable) -> tuple[str, ...] | None: ...


def enabled() -> bool:
    """Whether the direct path may be used (``PGLOGICAL_APPLY_DIRECT=0`` forces the Spark transforms)."""
    return os.environ.get(ENV_SWITCH, "1") != "0"


def plain_table(table: PlannedTable) -> bool:
    """The parts of the decision that need no file: a single-source keyed table, every action published, no
    row filter, no truncate inside the batch, nothing refused for UPDATE/DELETE."""
    return (enabled() and not table.parts and bool(table.key) and table.truncated_at is None
            and table.update_delete_problem is None and not table.config.row_filter
            and set(table.config.actions) >= {"insert", "update", "delete"})


def no_unchanged_toast(paths: Sequence[str]) -> bool:
    """Whether no staged change in ``paths`` lists an unchanged-TOAST column (read from that list column only)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for path in paths:
        column = pq.read_table(path, columns=["new_unchanged_toast"]).column(0)
        if len(column) and (pc.max(pc.list_value_length(column)).as_py() or 0) > 0:
            return False
    return True


def same_schema(paths: Sequence[str], columns: Sequence[str]) -> bool:
    """Whether every file has one Arrow schema whose images hold every written column (one schema version with
    all the batch's columns: nothing to union, no defaults to fill, no column a change's version lacks, which
    a change must leave alone — ``batches.ABSENT``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schemas = [pq.read_schema(p) for p in paths]
    if not all(s.equals(schemas[0]) for s in schemas[1:]):
        return False
    image = schemas[0].field("new").type
    return isinstance(image, pa.StructType) and set(columns) <= {image.field(i).name for i in range(image.num_fields)}
