"""Arrow schemas of the staged files (docs/staging-format.md) and the 2000-01-01 epoch shift."""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_pglogical.decoding.values.temporal import PG_TO_UNIX_USECS

# PostgreSQL timestamps count µs from 2000-01-01 UTC; Arrow counts from 1970-01-01.
POSTGRES_EPOCH_OFFSET_US = PG_TO_UNIX_USECS

COMMIT_TIME = pa.timestamp("us", tz="UTC")
# value path → exact text, for values the typed column cannot hold (see docs/types.md)
VALUE_NOTES = pa.map_(pa.string(), pa.string())

# Columns every positioned row carries (row changes, truncates): the ordering key first.
POSITION_FIELDS = [
    pa.field("commit_lsn", pa.int64(), nullable=False),
    pa.field("end_lsn", pa.int64(), nullable=False),
    pa.field("lsn", pa.int64(), nullable=False),
    pa.field("tx_order", pa.int64(), nullable=False),
    pa.field("xid", pa.int64(), nullable=False),
    pa.field("commit_time", COMMIT_TIME, nullable=False),
]


def row_change_schema(row_type: pa.StructType) -> pa.Schema:
    """Schema of ``tables/<schema>.<table>/v<N>.parquet`` for a relation whose rows are ``row_type``."""
    return pa.schema([
        *POSITION_FIELDS,
        pa.field("op", pa.string(), nullable=False),
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("old", row_type),
        pa.field("old_key_only", pa.bool_(), nullable=False),
        pa.field("new", row_type),
        pa.field("new_unchanged_toast", pa.list_(pa.string()), nullable=False),
        pa.field("old_value_notes", VALUE_NOTES, nullable=False),
        pa.field("new_value_notes", VALUE_NOTES, nullable=False),
    ])


TRUNCATES_SCHEMA = pa.schema([
    *POSITION_FIELDS,
    pa.field("relations", pa.list_(pa.string()), nullable=False),
    pa.field("relids", pa.list_(pa.int64()), nullable=False),
    pa.field("cascade", pa.bool_(), nullable=False),
    pa.field("restart_identity", pa.bool_(), nullable=False),
])

RELATION_COLUMN = pa.struct([
    pa.field("name", pa.string()),
    pa.field("type_oid", pa.int64()),
    pa.field("type_modifier", pa.int32()),
    pa.field("is_identity", pa.bool_()),
    pa.field("type_name", pa.string()),
    # pg_attribute.attmissingval as text (a one-element array literal) when the column has one:
    # what rows older than its ADD COLUMN … DEFAULT read on the source. Absent in older batches.
    pa.field("missing", pa.string()),
])

RELATIONS_SCHEMA = pa.schema([
    pa.field("relid", pa.int64(), nullable=False),
    pa.field("schema", pa.string(), nullable=False),
    pa.field("table", pa.string(), nullable=False),
    pa.field("schema_version", pa.int32(), nullable=False),
    pa.field("replica_identity", pa.string(), nullable=False),
    pa.field("columns", pa.list_(RELATION_COLUMN), nullable=False),
    pa.field("first_lsn", pa.int64(), nullable=False),
    # A leaf partition's ancestors (``schema.table``, parent first) and its partition constraint
    # (pg_get_partition_constraintdef, looked up when the batch is staged); empty / null otherwise,
    # and absent in older batches.
    pa.field("partition_ancestors", pa.list_(pa.string())),
    pa.field("partition_constraint", pa.string()),
    # The source table's primary key columns (looked up when the batch is staged, like the partition
    # information): what a target table created from this relation gets as its key. Null in older batches.
    pa.field("primary_key", pa.list_(pa.string())),
])

MESSAGES_SCHEMA = pa.schema([
    pa.field("commit_lsn", pa.int64()),
    pa.field("end_lsn", pa.int64()),
    pa.field("lsn", pa.int64(), nullable=False),
    pa.field("tx_order", pa.int64()),
    pa.field("xid", pa.int64(), nullable=False),
    pa.field("transactional", pa.bool_(), nullable=False),
    pa.field("prefix", pa.string(), nullable=False),
    pa.field("content", pa.binary(), nullable=False),
])

TRANSACTIONS_SCHEMA = pa.schema([
    pa.field("xid", pa.int64(), nullable=False),
    pa.field("commit_lsn", pa.int64(), nullable=False),
    pa.field("end_lsn", pa.int64(), nullable=False),
    pa.field("commit_time", COMMIT_TIME, nullable=False),
    pa.field("origin", pa.string()),
    pa.field("origin_lsn", pa.int64()),
    pa.field("changes", pa.int64(), nullable=False),
    pa.field("streamed", pa.bool_(), nullable=False),
])


def to_unix_us(pg_us: int) -> int:
    """PostgreSQL µs-since-2000 → Unix µs (what Arrow timestamps hold)."""
    return pg_us + POSTGRES_EPOCH_OFFSET_US
