"""Changelog mode: every published change of a batch appended to the table's change feed, in one commit.

Shape (one row per change, ordered by ``(_commit_lsn, _tx_order)``):

| column | type | meaning |
|---|---|---|
| `_op` | string | `insert`, `update`, `delete`, `truncate` — after row filters: a transformed UPDATE is the INSERT or DELETE it became |
| `_commit_lsn`, `_tx_order` | long | position: commit LSN, order in the transaction |
| `_lsn` | long | LSN of the change's own WAL record |
| `_commit_time` | timestamp (UTC) | commit time |
| `_xid` | long | top-level transaction id |
| `_unchanged_toast` | array<string> | columns of the new image sent as unchanged TOAST: their value is the row's previous one, not NULL |
| *table columns* | as in mirror mode | the new image (column list applied); null for `delete` and `truncate` |
| `_old` | struct<table columns> | the old image where one exists (DELETE, UPDATE of the key or of a REPLICA IDENTITY FULL table) |
| `_old_key_only` | boolean | `_old` is a key-only image: only the key fields are meaningful |
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply.meta import META
from airflow_provider_pglogical.apply.targets.base import PlannedTruncate
from airflow_provider_pglogical.exceptions import ApplyError

OP, COMMIT_LSN, TX_ORDER, LSN, COMMIT_TIME, XID = "_op", "_commit_lsn", "_tx_order", "_lsn", "_commit_time", "_xid"
UNCHANGED, OLD, OLD_KEY_ONLY = "_unchanged_toast", "_old", "_old_key_only"
LEADING = (OP, COMMIT_LSN, TX_ORDER, LSN, COMMIT_TIME, XID, UNCHANGED)
TRAILING = (OLD, OLD_KEY_ONLY)
OPS = {"I": "insert", "U": "update", "D": "delete"}


def check_names(target: str, columns: Sequence[str]) -> None:
    clash = sorted(set(columns) & set(LEADING + TRAILING))
    if clash:
        raise ApplyError(f"{target}: column(s) {', '.join(clash)} collide with the changelog's own columns")


def to_changelog(columns: Sequence[str]) -> Callable[[DataFrame], DataFrame]:
    """Step: published changes (``changes.published_changes``) → changelog rows."""

    def step(df: DataFrame) -> DataFrame:
        new, old = F.col(META + "new"), F.col(META + "old")
        op = F.col(META + "op")
        return df.select(
            F.when(op == "I", "insert").when(op == "U", "update").otherwise("delete").alias(OP),
            F.col(META + "commit_lsn").alias(COMMIT_LSN), F.col(META + "tx_order").alias(TX_ORDER),
            F.col(META + "lsn").alias(LSN), F.col(META + "commit_time").alias(COMMIT_TIME),
            F.col(META + "xid").alias(XID),
            F.when(op == "D", F.array().cast("array<string>")).otherwise(
                F.col(META + "new_unchanged_toast")).alias(UNCHANGED),
            *[new.getField(c).alias(c) for c in columns],
            old.alias(OLD),
            F.when(old.isNotNull(), F.coalesce(F.col(META + "old_key_only"), F.lit(False))).alias(OLD_KEY_ONLY))

    return step


def with_truncates(rows: pa.Table, truncates: Sequence[PlannedTruncate]) -> pa.Table:
    """Changelog rows plus one ``truncate`` row per truncate of the table, all in (commit LSN, order)."""
    if truncates:
        values = {OP: ["truncate"] * len(truncates),
                  COMMIT_LSN: [t.commit_lsn for t in truncates],
                  TX_ORDER: [t.tx_order for t in truncates], LSN: [t.lsn for t in truncates],
                  COMMIT_TIME: [t.commit_time for t in truncates], XID: [t.xid for t in truncates],
                  UNCHANGED: [[] for _ in truncates]}
        extra = {name: pa.array(values[name], rows.schema.field(name).type) if name in values
                 else pa.nulls(len(truncates), rows.schema.field(name).type) for name in rows.column_names}
        rows = pa.concat_tables([rows, pa.table(extra, schema=rows.schema)])
    return rows.sort_by([(COMMIT_LSN, "ascending"), (TX_ORDER, "ascending")])
