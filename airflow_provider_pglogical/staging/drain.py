"""One drain cycle: peek a bounded WAL range → decode → stage a batch → publish → advance the slot."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from airflow_provider_pglogical.decoding.assembler import ChangeAssembler
from airflow_provider_pglogical.decoding.gcpause import paused_gc
from airflow_provider_pglogical.decoding.model import (
    Event,
    NonTransactionalMessage,
    RelationSchema,
    Transaction,
)
from airflow_provider_pglogical.decoding.relations import RelationCache
from airflow_provider_pglogical.decoding.values.oids import FIRST_USER_OID
from airflow_provider_pglogical.exceptions import (
    PublicationNotFoundError,
    ReplicationConnectionError,
    SlotActiveError,
    StagingError,
    format_lsn,
)
from airflow_provider_pglogical.progress import Progress, metered_blocks
from airflow_provider_pglogical.staging.layout import StagingLayout
from airflow_provider_pglogical.staging.manifest import Manifest
from airflow_provider_pglogical.staging.reader import BatchRef, StagingReader
from airflow_provider_pglogical.staging.writer import DEFAULT_ROW_GROUP_ROWS, BatchWriter, RowConverter

log = logging.getLogger(__name__)

DrainMode = Literal["peek", "get"]
DRAIN_MODES: tuple[DrainMode, ...] = ("peek", "get")
DrainRead = Literal["sql", "stream"]
DRAIN_READS: tuple[DrainRead, ...] = ("sql", "stream")


def drain_read(value: object) -> DrainRead:
    """``value`` as a drain read (the one check of the spec, the operator and ``DrainConfig``), else ValueError."""
    read = next((r for r in DRAIN_READS if r == value), None)
    if read is None:
        raise ValueError(f"drain read {value!r} is not one of {', '.join(DRAIN_READS)}")
    return read


class Logger(Protocol):
    """What a drain logs through: a ``logging.Logger``, or an Airflow task's ``self.log``."""

    def info(self, msg: str, /, *args: object) -> object: ...

    def warning(self, msg: str, /, *args: object) -> object: ...


CHECKPOINTS = ("fetched_some", "files_written", "manifest_written", "advanced")
DEFAULT_MAX_WAL_BYTES = 1 << 30
DEFAULT_MAX_CHANGES = 1_000_000


SlotRows = Iterator[tuple[int, int, bytes | memoryview]]


class ChangeStream(Protocol):
    """A slot's changes over a replication connection (``hooks.replication.ReplicationStream``): the peek's
    rows in lists up to a bound, published positions confirmed through it, the slot held until closed."""

    done: bool  # read to its bound

    @property
    def open(self) -> bool: ...

    def blocks(self) -> Iterator[list[tuple[int, int, bytes]]]: ...
    def __iter__(self) -> Iterator[tuple[int, int, bytes]]: ...
    def confirm(self, lsn: int) -> None: ...
    def close(self) -> None: ...


class SlotClient(Protocol):
    """What a drain needs from the source (``hooks.slot_client.PgLogicalClient`` implements it, and the
    Airflow ``PgLogicalHook`` which wraps one)."""

    @property
    def server_version_num(self) -> int: ...
    @property
    def proto_version(self) -> int: ...

    def check_wal_level(self) -> None: ...
    def check_replication_privilege(self) -> None: ...
    def require_slot(self, name: str) -> Any: ...
    def publication_exists(self, name: str) -> bool: ...
    def try_lock_slot(self, name: str) -> bool: ...
    def unlock_slot(self, name: str) -> None: ...
    def current_wal_flush_lsn(self) -> int: ...
    def peek_changes(self, slot: str, publication: str | Sequence[str], *, upto_lsn: int | str | None = ...,
                     itersize: int = ...) -> SlotRows: ...
    def get_changes(self, slot: str, publication: str | Sequence[str], *, upto_lsn: int | str | None = ...,
                    itersize: int = ...) -> SlotRows: ...
    def stream_changes(self, slot: str, publication: str | Sequence[str], *, start_lsn: int, upto_lsn: int,
                       itersize: int = ...) -> ChangeStream: ...
    def advance_slot(self, name: str, lsn: int) -> int: ...
    def load_type_catalog(self, oids: Sequence[int]) -> Any: ...
    def format_types(self, pairs: Sequence[tuple[int, int]]) -> list[str | None]: ...
    def missing_values(self, relid: int) -> dict[str, str]: ...
    def partition_info(self, relid: int) -> tuple[tuple[str, ...], str | None]: ...
    def primary_key(self, relid: int) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class DrainConfig:
    """Limits and options of one drain cycle.

    ``max_wal_bytes`` bounds the WAL range read per batch (``upto_lsn = start + budget``): the
    SQL function materialises its whole result on the server, so this is the real memory bound
    there. ``max_changes`` is soft: the batch closes at the first commit after that many changes.
    ``mode='get'`` consumes while reading (at-most-once: a crash after the read and before the
    manifest loses those transactions; ``max_changes`` is ignored because the server has already
    consumed the whole range); ``'peek'`` (default) is exactly-once.
    ``read``: how a peek reads the slot. ``'sql'`` (default): ``pg_logical_slot_peek_binary_changes``, whose
    whole result the server materialises before the first row. ``'stream'``: a logical replication
    connection (``hooks.replication``), decoded by the walsender while the client stages; published
    batches are confirmed through it (needs a pg_hba line letting the role connect to the database
    with ``replication=database``; not with ``mode='get'``).
    ``empty_advance_bytes``: when a run finds no published transaction but at least this much WAL
    lies between the slot and the bound, an empty batch (manifest, empty files) is published and
    the slot advanced, so a quiet publication does not pin WAL forever.
    """

    slot: str
    publication: str | tuple[str, ...]
    staging_uri: str
    max_wal_bytes: int | None = DEFAULT_MAX_WAL_BYTES
    max_changes: int | None = DEFAULT_MAX_CHANGES
    mode: DrainMode = "peek"
    read: DrainRead = "sql"
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS
    itersize: int = 5000
    empty_advance_bytes: int | None = 64 << 20
    memory_budget: int = 8 << 20  # raw bytes buffered before a transaction spills to disk
    progress_every_s: float = 30.0
    # A slot found past the staged log's end (moved outside the drain, or recreated) is refused, unless
    # ``allow_gap`` (the changes in between are knowingly lost) or every one of ``snapshot_tables`` has a
    # snapshot staged at or after the slot's position (``pglogical resync``: the snapshots hold them).
    # Either way an empty batch then spans the gap, so the staged log stays contiguous.
    allow_gap: bool = False
    snapshot_tables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        drain_read(self.read)
        if self.read == "stream" and self.mode == "get":
            raise ValueError("drain read 'stream' confirms published batches, it cannot consume while reading: "
                             "use mode 'peek' with it, or read 'sql' with mode 'get'")

    @property
    def publications(self) -> tuple[str, ...]:
        return (self.publication,) if isinstance(self.publication, str) else tuple(self.publication)


@dataclass
class DrainResult:
    """Summary of one cycle (``to_summary()`` is the XCom-sized form)."""

    slot: str
    start_lsn: int
    end_lsn: int
    staged: bool = False
    replayed: bool = False  # the batch already existed (crash after manifest): only advanced; staged stays True
    batch_path: str | None = None
    transactions: int = 0
    tables: dict[str, int] = field(default_factory=dict)
    truncates: int = 0
    messages: int = 0
    bytes: int = 0
    duration_s: float = 0.0

    @property
    def changes(self) -> int:
        return sum(self.tables.values())

    @classmethod
    def from_manifest(cls, m: Manifest, path: str, **kw: Any) -> DrainResult:
        return cls(slot=m.slot, start_lsn=m.start_lsn_int, end_lsn=m.end_lsn_int, batch_path=path,
                   transactions=m.transactions, tables={k: int(v["rows"]) for k, v in m.tables.items()},
                   truncates=m.truncates, messages=m.messages, bytes=m.bytes, **kw)

    def to_summary(self) -> dict[str, Any]:
        return {"slot": self.slot, "start_lsn": format_lsn(self.start_lsn), "start_lsn_int": self.start_lsn,
                "end_lsn": format_lsn(self.end_lsn), "end_lsn_int": self.end_lsn, "staged": self.staged,
                "replayed": self.replayed, "batch_path": self.batch_path, "transactions": self.transactions,
                "changes": self.changes, "tables": dict(self.tables), "truncates": self.truncates,
                "messages": self.messages, "bytes": self.bytes, "duration_s": round(self.duration_s, 3)}


class CatalogResolver:
    """Converters and type names for relation versions, looked up once each on the source."""

    def __init__(self, client: SlotClient) -> None:
        self.client = client
        self._names: dict[tuple[int, int], list[str | None]] = {}
        self._missing: dict[int, dict[str, str]] = {}
        self._partitions: dict[int, tuple[tuple[str, ...], str | None]] = {}
        self._keys: dict[int, tuple[str, ...]] = {}

    def converter(self, relation: RelationSchema) -> RowConverter:
        from airflow_provider_pglogical.decoding.values import RowImageConverter, TypeCatalog

        user_oids = [c.type_oid for c in relation.columns if c.type_oid >= FIRST_USER_OID]
        catalog = self.client.load_type_catalog(user_oids) if user_oids else TypeCatalog()
        return RowImageConverter(relation, catalog)

    def type_names(self, relation: RelationSchema) -> list[str | None]:
        key = (relation.relid, relation.version)
        if key not in self._names:
            self._names[key] = self.client.format_types([(c.type_oid, c.type_modifier) for c in relation.columns])
        return self._names[key]

    def missing_values(self, relation: RelationSchema) -> Mapping[str, str]:
        """Column → ``attmissingval`` text, looked up when the batch's relations are written (its end)."""
        if relation.relid not in self._missing:
            self._missing[relation.relid] = self.client.missing_values(relation.relid)
        return self._missing[relation.relid]


    def partition_info(self, relation: RelationSchema) -> tuple[tuple[str, ...], str | None]:
        """A leaf partition's ancestors (parent first) and partition constraint, looked up when the
        batch's relations are written; ``((), None)`` for other relations (``PgLogicalClient.partition_info``)."""
        if relation.relid not in self._partitions:
            self._partitions[relation.relid] = self.client.partition_info(relation.relid)
        return self._partitions[relation.relid]

    def primary_key(self, relation: RelationSchema) -> tuple[str, ...]:
        """The source table's primary key columns, looked up when the batch's relations are written (a target
        table created from the relation gets them; ``PgLogicalClient.primary_key``)."""
        if relation.relid not in self._keys:
            self._keys[relation.relid] = self.client.primary_key(relation.relid)
        return self._keys[relation.relid]

Checkpoint = Callable[[str], None]


def _noop(_name: str) -> None:
    pass


def drain_slot(client: SlotClient, config: DrainConfig, *, on_checkpoint: Checkpoint | None = None,
               logger: Logger | None = None) -> DrainResult:
    """Run one drain cycle for ``config.slot`` and return what it staged.

    Exactly-once comes from the order of the durable steps, not from any transaction spanning
    PostgreSQL and storage:

    1. ``peek`` never moves the slot, so anything read but not yet published is simply read again.
    2. The batch becomes visible only when its manifest is written, last and atomically.
    3. The slot is advanced only after that, to the end LSN recorded in the manifest.

    Crash windows and what the next run does:

    * before the manifest: a partial directory is left; the slot has not moved, so the next run
      deletes the leftover and stages the same range again (identically: same relation-cache state,
      same input, deterministic writer);
    * after the manifest, before the advance: the slot still points at the batch's start; the next
      run finds the published batch with that start and only advances (no second copy);
    * after the advance: nothing to repair.

    The library function takes a ``SlotClient`` (``PgLogicalClient``, or the ``PgLogicalHook`` wrapping
    one) and no Airflow objects, so the operator and the CLI share it.

    ``on_checkpoint(name)`` is called at each durable boundary (``CHECKPOINTS``) so tests can
    stop the process exactly there.
    """
    logger = logger or log
    checkpoint = on_checkpoint or _noop
    started = time.monotonic()
    with _locked(client, config, logger):
        result, _ = _drain_locked(client, config, checkpoint, logger, None, None, keep_open=False)
    result.duration_s = time.monotonic() - started
    return result


def drain_run(client: SlotClient, config: DrainConfig, *, max_batches: int | None = None,
              stop_at: int | None = None, on_result: Callable[[DrainResult], None] | None = None,
              on_checkpoint: Checkpoint | None = None, logger: Logger | None = None) -> list[DrainResult]:
    """Drain cycles until the slot has caught up (or ``max_batches`` batches, or a batch ending at or
    after ``stop_at``); the staged (or replayed) batches' results, each also passed to ``on_result``.

    Each cycle is exactly ``drain_slot``'s (same durable steps, same checkpoints), with two
    differences that only save work: the slot's drain lock is held for the whole run, and a batch
    cut by ``max_changes`` leaves its peek open so that the next cycle reads on from the same
    result. The server materialises a peek's whole range before the first row; a fresh peek per
    batch would make it decode everything after the first batch again (measured: a third of the
    drain of `benchmarks/apply.py --workload big`). The next cycle continues that peek only if the slot is where the
    previous batch advanced it to; its rows are then exactly what a fresh peek from there returns
    (transactions committing after the slot position, non-transactional messages from it on; the
    relation cache is the state just published), bounded by the first peek's ``upto``.

    The slot is advanced once per peek, not once per batch: when the run needs a fresh peek (which
    reads from the slot's position), when it ends, and — best effort — when it fails, always to the
    end of the last published batch. ``pg_replication_slot_advance`` decodes from the slot's
    ``restart_lsn``, which a burst of writes leaves where it was, so per-batch advances re-read every
    earlier batch's WAL (measured at 10M changes: 11 advances, 0.34 s growing to 2.7 s, 19.5 s of a
    98 s drain). A crash in between is the "published, not advanced" window of ``drain_slot``: the
    next run finds the published batches at the slot's position and only advances.
    """
    logger = logger or log
    checkpoint = on_checkpoint or _noop
    results: list[DrainResult] = []
    peek: _OpenPeek | None = None
    pending = _PendingAdvance()
    with _locked(client, config, logger):
        try:
            try:
                while max_batches is None or len(results) < max_batches:
                    started = time.monotonic()
                    keep = max_batches is None or len(results) + 1 < max_batches
                    result, peek = _drain_locked(client, config, checkpoint, logger, peek, pending, keep_open=keep)
                    result.duration_s = time.monotonic() - started
                    if not (result.staged or result.replayed):
                        break
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
                    if (stop_at is not None and result.end_lsn >= stop_at) or result.end_lsn <= result.start_lsn:
                        break
            finally:  # the peek's statement ends before the advance (its session may be what failed)
                if peek is not None:
                    peek.close()
        except BaseException:
            pending.advance_quietly(client, config, checkpoint, logger)
            raise
        pending.advance(client, config, checkpoint, logger)
    return results


def gap_uncovered(config: DrainConfig, start: int) -> list[str]:
    """The ``snapshot_tables`` without a staged snapshot at or after ``start`` (all of them when none is set)."""
    from airflow_provider_pglogical.snapshot.layout import SnapshotLayout

    layout = SnapshotLayout.from_uri(config.staging_uri, config.slot)
    out = []
    for table in config.snapshot_tables:
        ref = layout.latest(table)
        if ref is None or ref.lsn < start:
            out.append(table)
    return out if config.snapshot_tables else ["every table"]


def gap_refusal(config: DrainConfig, last_end: int, last_name: str, start: int,
                batch_starts: Collection[int] = ()) -> str | None:
    """Why the drain refuses a slot at ``start`` against a staged log ending at ``last_end`` (batch ``last_name``),
    or None when it reads on: from the log's end, replaying a visible batch starting at ``start`` (its start in
    ``batch_starts``), or bridging a gap ``DrainConfig.allow_gap`` or snapshots cover. ``pglogical status``
    reports the same line."""
    if start == last_end or start in batch_starts:
        return None
    if start < last_end:  # no resync or gap makes a log the slot never produced its own
        return (f"slot {config.slot!r} is at {format_lsn(start)}, behind the staged log's end {format_lsn(last_end)} "
                f"({last_name}): the slot was moved outside this drain, or the staging area holds another slot's "
                "batches; point staging.uri at a new location to start this slot's log afresh")
    uncovered = [] if config.allow_gap else gap_uncovered(config, start)
    if not uncovered:
        return None
    tables = " ".join(f"--table {t}" for t in uncovered) if config.snapshot_tables else "--table SCHEMA.TABLE"
    return (f"slot {config.slot!r} is at {format_lsn(start)} but the staged log ends at {format_lsn(last_end)} "
            f"({last_name}): the slot was moved outside this drain (or recreated) and the changes in between "
            f"were never staged. Snapshot the tables again (pglogical resync --spec FILE {tables}), or accept "
            "losing those changes (pglogical run --spec FILE --allow-gap)")


def bridge_gap(layout: StagingLayout, reader: StagingReader, config: DrainConfig, last: BatchRef, start: int,
               logger: Logger = log) -> None:
    """Publish an empty batch from the staged log's end to the slot's position ``start``, when allowed
    (``DrainConfig.allow_gap``, or snapshots covering it); else raise the ``StagingError`` naming the way out
    (``gap_refusal``).

    The slot is not touched: a crash after the publish leaves a contiguous log, and the cycle that follows
    stages from ``start`` as usual.
    """
    refusal = gap_refusal(config, last.end_lsn, last.name, start)
    if refusal is not None:
        raise StagingError(refusal)
    logger.warning("slot %s: the staged log ends at %s, the slot is at %s; %s", config.slot,
                   format_lsn(last.end_lsn), format_lsn(start),
                   "the changes in between are lost (allow_gap)" if config.allow_gap
                   else "snapshots staged since cover the changes in between")
    for leftover in layout.leftovers_for(last.end_lsn):
        layout.delete_dir(leftover)
    writer = BatchWriter(layout, start_lsn=last.end_lsn, slot=config.slot, publication=",".join(config.publications),
                         resolver=_NoRelations(), background_writes=False)
    try:
        writer.finish_files(start)
        writer.publish(reader.relation_state(upto_lsn=last.end_lsn))
    except BaseException:
        writer.abort()
        raise


class _NoRelations:
    """The resolver of a batch without changes: never asked for anything."""

    def converter(self, relation: RelationSchema) -> RowConverter:
        raise StagingError(f"an empty batch has no relation {relation.qualified_name}")

    def type_names(self, relation: RelationSchema) -> Sequence[str | None]:
        raise StagingError(f"an empty batch has no relation {relation.qualified_name}")


class _PendingAdvance:
    """The end of the batches ``drain_run`` has published (or found published) since it last
    advanced the slot: what the slot is advanced to before a fresh peek and when the run ends."""

    def __init__(self) -> None:
        self.staged_to: int | None = None  # end of the last published batch the slot is not advanced to

    def start(self, slot_lsn: int) -> int:
        """Where the next batch starts: the end of what is published, unless the slot moved past it
        (outside this drain: the staged log's checks then refuse the gap)."""
        if self.staged_to is None or slot_lsn > self.staged_to:
            self.staged_to = None
            return slot_lsn
        return self.staged_to

    def published(self, end_lsn: int) -> None:
        self.staged_to = end_lsn

    def advance(self, client: SlotClient, config: DrainConfig, checkpoint: Checkpoint, logger: Logger) -> None:
        if self.staged_to is None:
            return
        advance_slot_to(client, config, self.staged_to, logger)
        self.staged_to = None
        checkpoint("advanced")

    def advance_quietly(self, client: SlotClient, config: DrainConfig, checkpoint: Checkpoint,
                        logger: Logger) -> None:
        """On a failed run: keep what was published consumed, never mask the run's own error (a
        failed advance here is the crash window the next run repairs)."""
        try:
            self.advance(client, config, checkpoint, logger)
        except Exception as e:  # noqa: BLE001 - the run's error is the one to raise
            logger.warning("could not advance slot %s to the published batches' end: %s", config.slot, e)


def advance_slot_to(client: SlotClient, config: DrainConfig, end: int, logger: Logger) -> None:
    """Move the slot to ``end`` (a published batch's end) through ``pg_replication_slot_advance``, also after a
    streamed read whose status updates confirmed it already: the advance marks the slot for the next checkpoint
    to write (a stream's status updates alone do not), so the position survives a restart as the SQL read's does.
    The server clamps an advance to its flush position: a slot left short of ``end`` (WAL of another history)
    is a ``StagingError``, the slot behind everything published (the next run refuses the gap)."""
    moved = client.advance_slot(config.slot, end)
    if moved != end:
        raise StagingError(f"slot {config.slot!r} advanced to {format_lsn(moved)}, not to the published batches' "
                           f"end {format_lsn(end)}: the server's WAL does not reach it (a promoted standby or a "
                           "restored server); point staging.uri at a new location to start this slot's log afresh")
    logger.info("slot %s advanced to %s", config.slot, format_lsn(end))


class _locked:
    """The slot checks and its drain lock (an advisory lock on the hook's session) around a block."""

    def __init__(self, client: SlotClient, config: DrainConfig, logger: Logger) -> None:
        self.client, self.config, self.logger = client, config, logger

    def __enter__(self) -> None:
        client, config = self.client, self.config
        client.check_wal_level()
        client.check_replication_privilege()
        client.require_slot(config.slot)
        for pub in config.publications:
            if not client.publication_exists(pub):
                raise PublicationNotFoundError(f"publication {pub!r} does not exist; create it before draining "
                                               f"slot {config.slot!r}")
        if not client.try_lock_slot(config.slot):
            raise SlotActiveError(f"replication slot {config.slot!r} is being drained by another session",
                                  hint="another drain of this slot is running; let it finish")

    def __exit__(self, *exc: object) -> None:
        try:
            self.client.unlock_slot(self.config.slot)
        except Exception as e:  # noqa: BLE001 - a dead session drops its locks; keep the real error
            self.logger.warning("could not release the drain lock of slot %s: %s", self.config.slot, e)


def _drain_locked(client: SlotClient, config: DrainConfig, checkpoint: Checkpoint, logger: Logger,
                  peek: _OpenPeek | None, pending: _PendingAdvance | None, *,
                  keep_open: bool) -> tuple[DrainResult, _OpenPeek | None]:
    """One cycle under the lock. ``peek``: one left open by the previous cycle of this run, read on
    when the batch starts where that cycle ended. ``pending``: ``drain_run``'s deferred advance (None:
    advance right after publishing). Returns the result and the peek to keep (or None)."""
    # Re-read under the lock: a drain that finished meanwhile has moved the slot. An open stream holds
    # the slot (the server shows it active), which is then where this run's published batches end.
    if peek is not None and peek.streaming and peek.next_start is not None:
        slot_lsn = peek.next_start
    else:
        slot_lsn = client.require_slot(config.slot).confirmed_flush_lsn
    start = slot_lsn if pending is None else pending.start(slot_lsn)
    layout = StagingLayout.from_uri(config.staging_uri, config.slot)
    reader = StagingReader(layout)
    batches = reader.batches()  # raises StagingError on a gap or overlap
    if peek is not None and peek.next_start != start:
        peek.close()
        peek = None

    existing = next((b for b in batches if b.start_lsn == start), None)
    if existing is not None:
        if peek is not None:  # cannot happen under our lock; a fresh peek is always right
            peek.close()
        # Crash after the manifest and before the advance: publish nothing twice, just advance.
        manifest = reader.manifest(existing)
        logger.info("batch %s already staged; advancing slot %s to %s", existing.name, config.slot, manifest.end_lsn)
        if pending is None:
            advance_slot_to(client, config, manifest.end_lsn_int, logger)
            checkpoint("advanced")
        else:
            pending.published(manifest.end_lsn_int)
        return DrainResult.from_manifest(manifest, existing.path, staged=True, replayed=True), None
    if batches and batches[-1].end_lsn != start:
        bridge_gap(layout, reader, config, batches[-1], start, logger)

    for leftover in layout.leftovers_for(start):  # an earlier attempt that died before its manifest
        logger.info("removing unpublished leftover %s", leftover)
        layout.delete_dir(leftover)

    continued = peek is not None
    if peek is None:
        if pending is not None:  # a peek reads from the slot's position: bring it to ``start``
            pending.advance(client, config, checkpoint, logger)
        flush = client.current_wal_flush_lsn()
        upto = flush if config.max_wal_bytes is None else min(flush, start + config.max_wal_bytes)
        if upto <= start:
            logger.info("slot %s: no WAL after %s", config.slot, format_lsn(start))
            return DrainResult(slot=config.slot, start_lsn=start, end_lsn=start), None
        state = reader.relation_state(upto_lsn=start)
        cache = RelationCache.from_state(state) if state else RelationCache()
        peek = _OpenPeek.open(client, config, cache, start, upto, logger)
    else:
        logger.info("slot %s: reading on from %s in the open peek up to %s%s", config.slot, format_lsn(start),
                    format_lsn(peek.upto), " (read to its end already)" if peek.exhausted else "")
    keep_open = keep_open and config.mode == "peek"
    try:
        result = _stage(client, config, layout, reader, peek, start, checkpoint, logger, keep_open=keep_open,
                        advance=pending is None)
    except BaseException:
        peek.close()
        raise
    if pending is not None and result.staged and config.mode == "peek":
        pending.published(result.end_lsn)
        if peek.streaming:  # published: the server may drop it (the slot stays put for anything later)
            peek.confirm(result.end_lsn)
            if peek.exhausted_stream:  # read to the bound: its last batch is confirmed, the stream ends
                peek.close()
    if keep_open and result.staged:
        # Kept even when read to its end: the next cycle then knows there is nothing more up to
        # ``upto`` (what a fresh peek of that range would return) without asking the server again.
        peek.next_start = result.end_lsn
        return result, peek
    peek.close()
    if continued and not result.staged and client.current_wal_flush_lsn() > peek.upto:
        # The rest of the open peek held nothing to stage: a fresh peek looks at the WAL flushed since.
        return _drain_locked(client, config, checkpoint, logger, None, pending, keep_open=keep_open)
    return result, None


_warmed = threading.Event()


def _warm_up() -> None:
    """First-use work of the writer, done while the first rows are decoded (before the writer's first row
    group): importing the value codecs, and pandas, which pyarrow imports on the first ``pa.array`` of a
    Python sequence (1-3 s when its bytecode is not cached)."""
    try:
        import pyarrow as pa

        import airflow_provider_pglogical.decoding.values  # noqa: F401

        pa.array([], type=pa.string())
    except Exception:  # noqa: BLE001 - only a warm-up: the writer imports whatever it needs itself
        log.debug("drain warm-up failed", exc_info=True)


def _warming_up(blocks: Iterable[list[Any]]) -> Iterator[list[Any]]:
    """The peek's blocks of rows, starting the writer's warm-up with the first one: a read with nothing in it (an
    empty slot, WAL of other databases only) stages nothing and so imports nothing it would not use."""
    for block in blocks:
        if not _warmed.is_set():
            _warmed.set()
            threading.Thread(target=_warm_up, name="pglogical-drain-warm-up", daemon=True).start()
        yield block


class _OpenPeek:
    """A peek's rows being decoded: the stream, its assembler (and relation cache), and what the
    batch cut by ``max_changes`` left unread, kept across the cycles of one ``drain_run``."""

    def __init__(self, config: DrainConfig, upto: int, assembler: ChangeAssembler, stream: ChangeStream | None,
                 events: Iterator[Event], stack: ExitStack, progress: Progress) -> None:
        self.slot, self.upto, self.assembler, self.events = config.slot, upto, assembler, events
        self.stack, self.progress = stack, progress
        self.exhausted = False
        self.next_start: int | None = None
        self.loose: list[NonTransactionalMessage] = []  # read but after the last batch's end: the next one's
        self.staged = ""  # what the progress lines add (the current batch's counts)
        self.stream = stream  # a replication stream's read (None: the SQL peek's)

    @property
    def streaming(self) -> bool:
        """Whether this read is a replication stream still open (holding the slot)."""
        return self.stream is not None and self.stream.open

    @property
    def exhausted_stream(self) -> bool:
        """Whether this read is a replication stream read to its bound (its events all taken)."""
        return self.stream is not None and self.stream.done

    def confirm(self, lsn: int) -> None:
        """Report a published batch's end through the open stream. A stream that broke meanwhile (the server
        ended it) is closed instead: the slot is then advanced through SQL, and a batch still to read fails
        its cycle (nothing past the published batches is confirmed; the next run reads on from there)."""
        if self.stream is not None and self.stream.open:
            try:
                self.stream.confirm(lsn)
            except ReplicationConnectionError as exc:
                log.warning("slot %s: %s; the slot is advanced through SQL", self.slot, exc)
                self.stream.close()

    @classmethod
    def open(cls, client: SlotClient, config: DrainConfig, cache: RelationCache, start: int, upto: int,
             logger: Logger) -> _OpenPeek:
        consume = config.mode == "get"
        read = client.get_changes if consume else client.peek_changes
        logger.info("slot %s: %s %s..%s (%d bytes of WAL)", config.slot,
                    "streaming" if config.read == "stream" else "reading", format_lsn(start), format_lsn(upto),
                    upto - start)
        stack = ExitStack()
        try:
            assembler = stack.enter_context(ChangeAssembler(cache, memory_budget=config.memory_budget))
            # Progress lines come from a heartbeat thread, so they also appear while the server is still
            # materialising the peek's result (no row yet) and inside one huge transaction.
            holder: list[_OpenPeek] = []
            progress = stack.enter_context(Progress(
                f"decode slot {config.slot}", logger.info, total_bytes=upto - start, interval=config.progress_every_s,
                detail=lambda: holder[0].staged if holder else ""))
            stream: ChangeStream | None = None
            rows: SlotRows | ChangeStream
            if config.read == "stream":
                rows = stream = client.stream_changes(config.slot, config.publications, start_lsn=start,
                                                      upto_lsn=upto, itersize=config.itersize)
            else:
                rows = read(config.slot, config.publications, upto_lsn=upto, itersize=config.itersize)
            close = getattr(rows, "close", None)
            if close is not None:
                stack.callback(close)  # ends the peek transaction (or commits a fully read get)
            events = iter(assembler.feed_blocks(_warming_up(metered_blocks(rows, progress, start))))
        except BaseException:
            stack.close()
            raise
        peek = cls(config, upto, assembler, stream, events, stack, progress)
        holder.append(peek)
        return peek

    def close(self) -> None:
        """Ends the peek (its SQL statement and the temp files of what it spilled)."""
        self.exhausted = True
        self.stack.close()


def _stage(client: SlotClient, config: DrainConfig, layout: StagingLayout, reader: StagingReader,
           peek: _OpenPeek, start: int, checkpoint: Checkpoint, logger: Logger, *, keep_open: bool,
           advance: bool) -> DrainResult:
    consume = config.mode == "get"
    upto = peek.upto
    writer = BatchWriter(layout, start_lsn=start, slot=config.slot, publication=",".join(config.publications),
                         resolver=CatalogResolver(client), server_version=client.server_version_num,
                         proto_version=client.proto_version, row_group_rows=config.row_group_rows)
    loose, peek.loose = peek.loose, []  # non-transactional messages, placed at the end
    t0 = time.monotonic()
    try:
        with paused_gc():
            cut = False
            for event in peek.events:
                if isinstance(event, Transaction):
                    writer.write_transaction(event)
                elif isinstance(event, NonTransactionalMessage):
                    loose.append(event)
                else:
                    raise StagingError(f"{type(event).__name__} on slot {config.slot!r}: two-phase slots "
                                       "are not supported by the drain")
                if writer.manifest.transactions + len(loose) == 1:
                    checkpoint("fetched_some")
                peek.staged = f"{writer.changes} changes in {writer.manifest.transactions} transactions staged"
                # Soft budget: stop right after a commit so the relation cache holds no
                # schema from a transaction beyond the batch. Never under get: the server
                # has already consumed everything up to ``upto``.
                if (not consume and config.max_changes is not None and isinstance(event, Transaction)
                        and writer.changes >= config.max_changes):
                    cut = True
                    break
            if not (cut and keep_open) and peek.stream is None:
                peek.close()  # ends the statement now (a get read to its end commits its consumption here)
            end = writer.manifest.end_lsn_int if writer.manifest.transactions else None
            if consume:
                # get confirmed the end of the last record read: staging must reach it too.
                end = max(end or start, client.require_slot(config.slot).confirmed_flush_lsn)
            # A non-transactional message is skipped next time iff its record starts before
            # the new slot position, i.e. iff it ends at or before ``end``.
            if end is None and (loose or (config.empty_advance_bytes is not None
                                          and upto - start >= config.empty_advance_bytes)):
                end = max([upto, *(m.message.lsn for m in loose)])
            if end is None or end <= start:
                writer.abort()
                peek.close()
                logger.info("slot %s: nothing to stage up to %s", config.slot, format_lsn(upto))
                return DrainResult(slot=config.slot, start_lsn=start, end_lsn=start)
            for message in loose:
                if message.message.lsn <= end:
                    writer.write_message(message)
                else:  # what a fresh peek from ``end`` would send again
                    peek.loose.append(message)
            path = writer.finish_files(end)
            checkpoint("files_written")
            manifest = writer.publish(peek.assembler.relations.to_state())
    except BaseException:
        writer.abort()
        raise
    checkpoint("manifest_written")
    try:
        reader.save_state_copy(peek.assembler.relations.to_state(), manifest.end_lsn_int)
    except OSError as exc:  # only a convenience copy: the batch carries the authoritative state
        logger.warning("could not save the relation state copy: %s", exc)
    if advance and not consume:  # else drain_run advances later, once for several batches (get: consumed)
        peek.confirm(manifest.end_lsn_int)  # a stream: published, so confirmed through it, then released
        peek.close()
        advance_slot_to(client, config, manifest.end_lsn_int, logger)
    if advance or consume:
        checkpoint("advanced")
    elapsed = max(time.monotonic() - t0, 1e-9)
    logger.info("slot %s: staged %s (%d transactions, %d changes, %d bytes, %.0f changes/s)", config.slot,
                path.rsplit("/", 1)[1], manifest.transactions, manifest.changes, manifest.bytes,
                manifest.changes / elapsed)
    return DrainResult.from_manifest(manifest, path, staged=True)
