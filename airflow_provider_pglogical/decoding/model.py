"""Immutable records the pgoutput decoder emits: schemas, raw tuples, changes, transactions.

This module is the contract between the pure decoder and everything downstream (staging,
apply). Values stay *raw* (kind + bytes) in these records; typed decoding happens either per
value (``decoding.values``) or column-at-a-time into Arrow (``decoding.values.arrow``). The
tuple of plain DML is not even split into values by the assembler: it stays a
``wiretuple.WireTuple`` (same ``kinds``/``values`` on access) until the Arrow converter frames a
whole row group at once, which is what keeps decode-into-Arrow close to the fetch rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from airflow_provider_pglogical.relation_shape import RelationShape

# pgoutput relreplident values (pg_class.relreplident)
REPLICA_IDENTITY_DEFAULT = "d"
REPLICA_IDENTITY_NOTHING = "n"
REPLICA_IDENTITY_FULL = "f"
REPLICA_IDENTITY_INDEX = "i"

# TupleData column kinds (logicalproto.h)
COLUMN_NULL = "n"
COLUMN_UNCHANGED_TOAST = "u"
COLUMN_TEXT = "t"
COLUMN_BINARY = "b"

OP_INSERT = "I"
OP_UPDATE = "U"
OP_DELETE = "D"


@dataclass(frozen=True, slots=True)
class ColumnDef:
    name: str
    type_oid: int
    type_modifier: int
    is_identity: bool  # Relation column flag bit 1: part of the replica identity


@dataclass(frozen=True, slots=True)
class RelationSchema(RelationShape):
    """One version of a published relation's shape.

    ``version`` starts at 1 per relid and increments whenever a Relation message arrives whose
    namespace, name, replica identity or columns differ from the current one (pgoutput re-sends
    identical Relation messages on every SQL call, which do not bump the version).
    """

    relid: int
    namespace: str  # "" on the wire already resolved to "pg_catalog"
    name: str
    replica_identity: str
    columns: tuple[ColumnDef, ...]
    version: int = 1

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """A Type ('Y') message: user-defined type OID → *base* type namespace and name."""

    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class TupleData:
    """A TupleData as sent: per column a kind ('n','u','t','b') and the bytes for 't'/'b'.

    ``values[i]`` is ``None`` for 'n' and 'u'. Which of the two is told by ``kinds[i]``; an
    unchanged TOAST value must never be read as NULL.
    """

    kinds: str  # one character per column, e.g. "bbnu"
    values: tuple[bytes | None, ...]


class RowImage(Protocol):
    """A row image as the decoder hands it on: a ``TupleData``, or (straight from the assembler) a
    ``wiretuple.WireTuple`` still in its wire form, which splits into the same kinds and values on access.
    Named here by what it offers, so these records need no import of the reader that splits it."""

    @property
    def kinds(self) -> str: ...

    @property
    def values(self) -> tuple[bytes | None, ...]: ...


class RowChange(NamedTuple):
    """An INSERT, UPDATE or DELETE of one row, in relation column order.

    ``old`` is absent for INSERT and for an UPDATE that changed no identity column (pgoutput
    sends no old tuple then). ``old_key_only`` marks a 'K' image: only identity columns are
    meaningful and every other column arrives as 'n' without meaning NULL. Images are
    ``TupleData`` or, straight from the assembler, an equal ``wiretuple.WireTuple``.

    A NamedTuple, unlike the other records: the decoder makes one per row, and a tuple is built
    in a third of the time of a frozen dataclass.
    """

    op: str
    relation: RelationSchema
    lsn: int  # start LSN of the change's WAL record
    old: RowImage | None
    new: RowImage | None
    old_key_only: bool = False


@dataclass(frozen=True, slots=True)
class TruncateChange:
    lsn: int
    relations: tuple[RelationSchema, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """pg_logical_emit_message() output; ``lsn`` is the end LSN of the message record."""

    lsn: int
    transactional: bool
    prefix: str
    content: bytes


Change = RowChange | TruncateChange | LogicalMessage


@dataclass(frozen=True, slots=True)
class Transaction:
    """A committed transaction, emitted in commit order.

    ``changes[i]`` has order-in-transaction ``i``; ``end_lsn`` is the commit record's end LSN,
    which is the Commit row's ``lsn`` and the value to pass to ``pg_replication_slot_advance``.
    Timestamps are microseconds since 2000-01-01 UTC, as on the wire.
    """

    xid: int
    commit_lsn: int  # start of the commit record
    end_lsn: int
    commit_time_us: int
    # A tuple, or for a transaction over the decoder's memory budget a lazy re-iterable
    # ``decoding.spill.SpilledChanges`` backed by a temp file (iterate it; ``len`` is exact).
    changes: Sequence[Change]
    origin: str | None = None
    origin_lsn: int | None = None
    streamed: bool = False
    gid: str | None = None  # set when committed through COMMIT PREPARED
    types: tuple[TypeInfo, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class NonTransactionalMessage:
    """A non-transactional logical message, emitted immediately where it was decoded."""

    message: LogicalMessage
    xid: int  # 0 when emitted outside any xid-assigned transaction


@dataclass(frozen=True, slots=True)
class PreparedTransaction:
    """A PREPARE TRANSACTION seen on a two-phase slot (its changes arrive again at commit time
    only if decoding restarts before the prepare; pgoutput sends COMMIT PREPARED without rows).
    """

    xid: int
    gid: str
    prepare_lsn: int
    end_lsn: int
    prepare_time_us: int
    changes: Sequence[Change]  # tuple or SpilledChanges, as for Transaction


@dataclass(frozen=True, slots=True)
class PreparedOutcome:
    """COMMIT PREPARED ('K') or ROLLBACK PREPARED ('r') of an earlier PreparedTransaction."""

    xid: int
    gid: str
    committed: bool
    end_lsn: int
    time_us: int


Event = Transaction | NonTransactionalMessage | PreparedTransaction | PreparedOutcome
