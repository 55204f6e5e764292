"""The provider's exception hierarchy.

Plain Python (no Airflow import) so the pure decoder can raise these too; Airflow fails a task
on any exception. Messages name identifiers, LSNs and counts, never row values.
"""

from __future__ import annotations

from airflow_provider_pglogical.lsn import format_lsn

__all__ = ["format_lsn"]  # re-exported: messages name LSNs everywhere


class PgLogicalError(Exception):
    """Base class of every error this provider raises on purpose."""


class DecodeError(PgLogicalError):
    """pgoutput bytes that cannot be decoded: truncated, malformed, or out of protocol order."""

    def __init__(self, reason: str, *, lsn: int | None = None, offset: int | None = None,
                 message_type: str | None = None) -> None:
        self.reason = reason
        self.lsn = lsn
        self.offset = offset
        self.message_type = message_type
        where = []
        if message_type is not None:
            where.append(f"message {message_type!r}")
        if lsn is not None:
            where.append(f"at LSN {format_lsn(lsn)}")
        if offset is not None:
            where.append(f"byte offset {offset}")
        super().__init__(f"{reason} ({', '.join(where)})" if where else reason)


class UnknownRelationError(DecodeError):
    """A change refers to a relation OID that no Relation message described."""


class SlotError(PgLogicalError):
    """Base for replication-slot problems; ``hint`` says what the user can do."""

    hint = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        if hint is not None:
            self.hint = hint
        super().__init__(f"{message}. Hint: {self.hint}" if self.hint else message)


class SlotNotFoundError(SlotError):
    hint = "create it (PgLogicalHook.create_slot, or `create: true` in the pipeline spec)"


class SlotActiveError(SlotError):
    hint = "another consumer holds the slot; wait for it or terminate its backend (pg_replication_slots.active_pid)"


class SlotInvalidatedError(SlotError):
    hint = ("WAL it needed was removed (max_slot_wal_keep_size); drop the slot (a run with source.create "
            "creates it again), then resync every table (pglogical resync --spec FILE --table SCHEMA.TABLE ...) "
            "or accept losing the changes it missed (pglogical run --spec FILE --allow-gap)")


class SlotWalRetentionError(SlotError):
    """The slot is about to lose WAL it needs (safe_wal_size under the threshold, or unreserved)."""

    hint = ("drain the slot now (decode more often or with larger batches), or raise "
            "max_slot_wal_keep_size on the source")


class SlotPluginMismatchError(SlotError):
    hint = "the slot must use the pgoutput plugin; drop it or choose another slot name"


class PublicationNotFoundError(PgLogicalError):
    """The publication named in the pipeline does not exist on the source."""


class WalLevelError(PgLogicalError):
    """The source server does not run with wal_level=logical."""


class PrivilegeError(PgLogicalError):
    """The connected role lacks a privilege; ``privilege`` names it (``"REPLICATION"``,
    ``"CREATE ON DATABASE app"``, ``"CREATE ON SCHEMA public"``, ``"owner of table public.t"``...)."""

    def __init__(self, message: str, *, privilege: str) -> None:
        super().__init__(message)
        self.privilege = privilege


class ReplicationPermissionError(PrivilegeError):
    """The role may not use replication slots (needs REPLICATION, or rds_replication on Amazon RDS)."""

    def __init__(self, message: str, *, privilege: str = "REPLICATION") -> None:
        super().__init__(message, privilege=privilege)


class PipelineBusyError(PgLogicalError):
    """A run holds the pipeline (its slot's drain lock on the source, its apply lock on the target) or another
    consumer has the slot active: ``pglogical drop`` refuses rather than pull the slot from under it."""


class ConfirmationRequiredError(PgLogicalError):
    """A command that removes what cannot be recreated was run without ``--yes``."""


class StagingError(PgLogicalError):
    """The staging area holds something inconsistent (gap, overlap, unreadable manifest)."""


class StagingCorruptError(StagingError):
    """A staged file differs from what its manifest records (missing, another size, hash, row count or LSN
    range, unreadable Parquet). ``batch`` names the batch (its LSN range) or snapshot, ``file`` the file
    relative to its directory (None when the manifest itself is inconsistent)."""

    def __init__(self, message: str, *, batch: str, file: str | None = None) -> None:
        super().__init__(message)
        self.batch, self.file = batch, file


class StagingPrunedError(StagingError):
    """What a target needs from the staged log was pruned by ``staging.retention``: the message names the pruned
    range and the way out (a resync, which stages a snapshot past it)."""


class SpecError(PgLogicalError):
    """A pipeline spec that does not validate."""


class ApplyError(PgLogicalError):
    """Applying staged changes to a target failed before anything was committed."""


class CaseInsensitiveNamesError(ApplyError):
    """A target whose names are case-insensitive (Delta Lake's columns) cannot hold names PostgreSQL keeps apart
    (``"Val"`` and ``val``); nothing was committed. ``table`` is the target table, ``columns`` the clashing names."""

    def __init__(self, message: str, *, table: str, columns: tuple[str, ...]) -> None:
        super().__init__(message)
        self.table, self.columns = table, columns


class InternalColumnNameError(ApplyError):
    """A replicated column is named like the apply's own working columns (``_pgl_…``), which share one namespace with
    the table's columns in its frames; nothing was committed. ``table`` is the source table, ``columns`` the names."""

    def __init__(self, message: str, *, table: str, columns: tuple[str, ...]) -> None:
        super().__init__(message)
        self.table, self.columns = table, columns


class WatermarksMissingError(ApplyError):
    """The staging area says batches were applied to the target, but the target holds no watermark of the slot."""


class SparkStartError(ApplyError):
    """The Spark session of an in-process apply did not start (the JVM exited, a bad master or setting)."""


class RowFilterError(ApplyError):
    """A row filter that is invalid or references columns it may not use."""


class UnresolvableToastError(ApplyError):
    """An unchanged-TOAST value is needed but exists neither in the target nor the old image."""


class ConstraintViolationError(ApplyError):
    """A batch violates a target constraint even when applied change by change in commit order.

    ``table``, ``constraint`` and ``sqlstate`` come from PostgreSQL; ``lsn`` is the change that failed
    (None when only the batch's end state violates a deferred constraint). No row values.
    """

    def __init__(self, message: str, *, table: str | None, lsn: int | None, constraint: str | None,
                 sqlstate: str | None) -> None:
        super().__init__(message)
        self.table, self.lsn, self.constraint, self.sqlstate = table, lsn, constraint, sqlstate


class SnapshotError(PgLogicalError):
    """An initial snapshot or table resync could not be taken or staged (nothing of it was published)."""


class SnapshotOnExistingSlotError(SnapshotError):
    """An initial snapshot was requested but the slot already exists: its exported snapshot is gone."""


class SnapshotConnectionLostError(SnapshotError):
    """The replication connection holding the exported snapshot closed before every reader imported it."""


class ReplicaIdentityError(ApplyError):
    """An UPDATE or DELETE arrived that the table's replica identity cannot apply.

    A table without a replica identity (no primary key, ``REPLICA IDENTITY NOTHING``) is applied
    insert-only, and a row filter over columns outside the replica identity can only judge
    INSERTs; PostgreSQL refuses such an UPDATE/DELETE on the publisher. ``table`` is the source
    table, ``lsn`` the first offending change. No row values.
    """

    def __init__(self, message: str, *, table: str, lsn: int | None) -> None:
        super().__init__(message)
        self.table, self.lsn = table, lsn


class SchemaChangeError(ApplyError):
    """A source schema change the target cannot follow (or ``schema_changes: fail``); nothing was written.

    ``table`` is the target table, ``column`` the column, ``old_type``/``new_type`` the target's and
    the source's type (None for an added/dropped column), ``lsn`` where the new schema was first seen.
    """

    def __init__(self, message: str, *, table: str, column: str | None, old_type: str | None,
                 new_type: str | None, lsn: int | None) -> None:
        super().__init__(message)
        self.table, self.column, self.old_type, self.new_type, self.lsn = table, column, old_type, new_type, lsn


class ReplicationConnectionError(SlotError):
    """The server refused the logical replication connection of a streamed drain (``source.read: stream``)."""

    hint = ("allow the role a connection to this database in pg_hba.conf (a replication=database connection "
            "matches the database's own lines; the role needs REPLICATION), or read through SQL (source.read: sql)")
