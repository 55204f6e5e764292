"""The PostgreSQL target's plan of one batch: per-table staging tables, the batch transaction's inputs, its result."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from psycopg2 import sql

from airflow_provider_pglogical.apply.targets.base import BatchResult, from_column
from airflow_provider_pglogical.exceptions import ApplyError

# The frames' meta columns (apply/transforms.py: KIND, KEEP, LSN, TOUCHED), as staging-table columns.
OP, KEEP, LSN, TOUCHED = "_pgl_kind", "_pgl_keep", "_pgl_lsn", "_pgl_touched"
TOAST_REASON = "unchanged TOAST value unavailable (not in the target, not in the old image)"

__all__ = ["KEEP", "LSN", "OP", "TOAST_REASON", "TOUCHED", "BatchPlan", "BatchResult", "TablePlan", "from_column",
           "staging_name", "staging_prefix"]


@dataclass
class TablePlan:
    """What one target table gets in one batch (built on the driver, executed in one transaction)."""

    source: str
    target: str
    key: tuple[str, ...]
    columns: tuple[str, ...]  # target columns written (key included)
    staging: str | None = None  # None: no row changes for this table in the batch
    conflict: str = "upsert"
    unchanged_toast: str = "fail"
    # Staged rows per op (I/U/D/R) and rows with a keep list, counted once the staging table is written: the
    # merge transaction skips the statements the batch cannot need. None: not counted, every statement runs.
    staged_ops: dict[str, int] | None = None
    keep_rows: int | None = None
    # The target has a unique index on exactly the key: key joins may walk it (setbased.key_ordered_joins).
    key_indexed: bool = False
    # The key may hold NULLs: every column of a REPLICA IDENTITY FULL table whose target has no primary key.
    # Rows are then matched NULL = NULL (``IS NOT DISTINCT FROM``), as the native apply worker compares rows.
    null_safe_key: bool = False

    @property
    def key_equals(self) -> str:
        """The operator that matches key values (``null_safe_key``)."""
        return " IS NOT DISTINCT FROM " if self.null_safe_key else " = "

    def may_have(self, *ops: str) -> bool:
        """Whether the staging table may hold rows of one of ``ops`` (always, when not counted)."""
        return self.staged_ops is None or any(self.staged_ops.get(op, 0) for op in ops)

    @property
    def may_keep(self) -> bool:
        """Whether a staged row may carry a keep list (unchanged-TOAST columns to take from the target)."""
        return self.keep_rows is None or self.keep_rows > 0

    @property
    def staging_table(self) -> str:
        """``staging``, for the steps that only run on tables with row changes."""
        if self.staging is None:
            raise ApplyError(f"{self.target} has no staging table in this batch (no row changes)")
        return self.staging


@dataclass
class BatchPlan:
    slot: str
    start_lsn: int
    end_lsn: int
    tables: list[TablePlan]  # parents before children
    truncate: list[str] = field(default_factory=list)  # target tables, one TRUNCATE statement
    restart_identity: list[str] = field(default_factory=list)  # subset whose owned sequences restart
    watermark_tables: list[str] = field(default_factory=list)
    # Source schema changes the target follows (schema.alter_statements), run first in the transaction.
    ddl: list[sql.Composable] = field(default_factory=list)
    # Routed leaf partitions' TRUNCATEs: (target, source, partition constraint) — DELETE … WHERE constraint,
    # right after the TRUNCATE statement.
    leaf_deletes: list[tuple[str, str, str]] = field(default_factory=list)


def staging_prefix(slot: str, target: str) -> str:
    """What every staging table name of ``target`` in ``slot``'s applies starts with (batches, ordered, snapshots)."""
    digest = hashlib.sha1(f"{slot}\0{target}".encode()).hexdigest()[:12]
    return f"_pglogical_stg_{digest}_"


def staging_name(slot: str, end_lsn: int, target: str, schema: str = "public") -> str:
    """The unlogged staging table of ``target`` in one batch, in the bookkeeping ``schema``."""
    return f"{schema}.{staging_prefix(slot, target)}{end_lsn:016X}"
