"""Turns the ordered rows of pg_logical_slot_*_binary_changes into committed-transaction events."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from airflow_provider_pglogical.decoding import messages as m
from airflow_provider_pglogical.decoding.messages import parse_message, parse_row
from airflow_provider_pglogical.decoding.model import (
    Change,
    Event,
    LogicalMessage,
    NonTransactionalMessage,
    PreparedOutcome,
    PreparedTransaction,
    RelationSchema,
    Transaction,
    TypeInfo,
)
from airflow_provider_pglogical.decoding.relations import (
    ROW_OPS,
    RelationCache,
    is_unsplit_row,
    row_change,
    to_change,
    unknown_relation,
    unsplit_row_change,
)
from airflow_provider_pglogical.decoding.speedups import compiled
from airflow_provider_pglogical.decoding.spill import SpilledChanges, SpillFile, SpillRecord
from airflow_provider_pglogical.exceptions import DecodeError
from airflow_provider_pglogical.progress import chunked

DEFAULT_MEMORY_BUDGET = 64 * 1024 * 1024
_SCHEMA_MESSAGES = (m.RelationMessage, m.TypeMessage)


def _spill_decoder(in_stream: bool) -> Callable[[bytes, int, Mapping[int, RelationSchema]], Change]:
    base = 5 if in_stream else 1  # where the relid starts: after the [xid] inside a stream

    def decode(data: bytes, lsn: int, relations: Mapping[int, RelationSchema]) -> Change:
        change = unsplit_row_change(data, lsn, relations.get, base)
        if change is not None:
            return change
        return to_change(parse_message(data, lsn=lsn, in_stream=in_stream), lsn, relations.get)
    return decode


def _spill_decoder_many(in_stream: bool) -> Callable[[list[SpillRecord], Mapping[int, RelationSchema]], list[Change]] | None:
    """The compiled twin of ``_spill_decoder`` over a slice of records (None without the compiled module):
    plain DML is framed in C, anything else by ``_spill_decoder``."""
    if compiled is None:
        return None
    base, one = 5 if in_stream else 1, _spill_decoder(in_stream)
    unsplit_records = compiled.unsplit_records

    def decode_many(records: list[SpillRecord], relations: Mapping[int, RelationSchema]) -> list[Change]:
        rels = relations if type(relations) is dict else dict(relations)
        out: list[Change | None] = unsplit_records(records, rels, base)
        if None not in out:  # all plain DML, the common case: no Python pass over the slice
            return out  # type: ignore[return-value]  # no None in it
        for i, change in enumerate(out):
            if change is None:
                lsn, _subxid, data = records[i]
                out[i] = one(data, lsn, relations)
        return out  # type: ignore[return-value]  # every None was replaced above
    return decode_many


BLOCK_ROWS = 4096  # rows handed to the compiled path at a time

# A message of a streamed transaction, kept until its commit: (lsn, subxid, message, size of its bytes).
StreamedItem = tuple[int, int | None, m.Message, int]


@dataclass(eq=False, slots=True)
class _Buffer:
    """One open transaction. Non-streamed: its Changes are in ``items``. Streamed: ``streamed`` holds
    ``(lsn, subxid, wire message, size)`` resolved at commit, because Relation messages inside a
    stream must only reach the cache if and when the transaction commits."""

    xid: int
    kind: str  # 'B' (Begin), 'b' (Begin Prepare) or 'S' (streamed)
    start: m.BeginMessage | m.BeginPrepareMessage | None = None
    items: list[Change] = field(default_factory=list)
    streamed: list[StreamedItem] = field(default_factory=list)
    types: list[TypeInfo] = field(default_factory=list)
    origin: str | None = None
    origin_lsn: int | None = None
    mem_bytes: int = 0
    spill: SpillFile | None = None
    base: dict[int, RelationSchema] | None = None  # relation snapshot when spilling began
    side: list[tuple[int, RelationSchema]] = field(default_factory=list)  # (spill index, schema) while spilling
    stream_side: list[tuple[int, m.RelationMessage | m.TypeMessage]] = field(default_factory=list)  # streamed: wire R/Y
    spill_counts: dict[int, int] = field(default_factory=dict)  # subxid → spilled changes
    aborted: set[int] = field(default_factory=set)
    stream_relids: set[int] = field(default_factory=set)

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()


class ChangeAssembler:
    """Feed rows in slot order; get ``model.Event``s in commit order.

    ``feed(lsn, xid, data)`` takes one row of ``pg_logical_slot_{peek,get}_binary_changes`` and
    returns the Event it completes (a Transaction at Commit/Stream Commit, a PreparedTransaction at
    Prepare/Stream Prepare, a PreparedOutcome, a NonTransactionalMessage) or ``None``.

    Streaming (proto >= 2, ``streaming`` on/parallel): changes arrive in Stream Start…Stop blocks,
    tagged with their (sub)xid, buffered per top-level xid and emitted at Stream Commit/Prepare.
    Stream Abort of the top-level xid drops the transaction; of a subxid, drops only changes tagged
    with that subxid (PostgreSQL sends one Stream Abort per aborted subtransaction that streamed
    changes, nested ones included). Relation/Type messages are never dropped by a subxact abort:
    pgoutput sends the schema once per streamed transaction, so later changes still need it.

    Memory: buffered raw message bytes over all open transactions are bounded by
    ``memory_budget``. A transaction that receives a message while over budget keeps what it holds
    and writes its remaining messages to an anonymous temp file (``spill_dir``). Its Transaction then
    has ``changes`` = ``SpilledChanges``: a lazy, re-iterable Sequence decoding the file on each
    pass, ``len()`` exact. Such sequences stay readable until closed or until this assembler is
    closed, so consume each Event before ``close()``. Use ``with ChangeAssembler(...)``.

    One SQL call's rows end with ``finish()``: incomplete transactions (only streamed ones can
    be) are dropped and their xids returned, since the next call re-sends them from the start.
    ``pending()`` names them without dropping; ``last_commit_end_lsn`` is the end LSN of the last
    completed transaction (Commit, Stream Commit, Prepare, Commit/Rollback Prepared): the safe
    position to advance the slot to. ``relations`` survives across calls and across runs via
    ``RelationCache.to_state``; save the state that goes with the slot position you advance to.

    Protocol order is enforced (DecodeError): no Commit without Begin, no nesting, Stream Stop only
    in a block, changes only inside a transaction or block, Commit LSN = Begin's final LSN. Origin
    is accepted anywhere inside a transaction or stream block (pgoutput sends it right after Begin,
    Begin Prepare or the first Stream Start); an origin_lsn of 0 (InvalidXLogRecPtr) becomes None.
    """

    def __init__(self, relations: RelationCache | None = None, *, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                 spill_dir: str | os.PathLike[str] | None = None) -> None:
        self.relations = relations if relations is not None else RelationCache()
        self._get_relation = self.relations.getter()
        self._budget = memory_budget
        self._spill_dir = spill_dir
        self._buffered = 0
        self._tx: _Buffer | None = None
        self._stream: _Buffer | None = None  # the streamed transaction whose block is open
        self._streams: dict[int, _Buffer] = {}
        self._emitted: weakref.WeakSet[SpilledChanges] = weakref.WeakSet()
        self.last_commit_end_lsn: int | None = None  # end LSN of the last completed transaction

    # -- hot path ---------------------------------------------------------------------------

    def feed(self, lsn: int, xid: int, data: bytes | bytearray | memoryview) -> Event | None:
        """One slot row; returns the Event it completes, else None. ``xid`` labels non-transactional
        messages only (0 outside any transaction)."""
        for event in self.feed_rows(((lsn, xid, data),)):
            return event
        return None

    def feed_rows(self, rows: Iterable[tuple[int, int, bytes | bytearray | memoryview]]) -> Iterator[Event]:
        """Feed every ``(lsn, xid, data)`` row in order; yield the events they complete."""
        if compiled is None:
            yield from self._feed_rows_py(rows)
            return
        for block in chunked(rows, BLOCK_ROWS):
            yield from self.feed_block(block)

    def feed_blocks(self, blocks: Iterable[list[tuple[int, int, bytes | bytearray | memoryview]]]) -> Iterator[Event]:
        """``feed_rows`` over rows that come in lists (the drain's fetch hands them so)."""
        for block in blocks:
            yield from self.feed_block(block) if compiled is not None else self._feed_rows_py(block)

    def feed_block(self, block: list[tuple[int, int, bytes | bytearray | memoryview]]) -> Iterator[Event]:
        """One list of rows through the compiled path (``_speedups``): runs of plain DML inside a
        transaction are taken in C — RowChanges appended, or spill records written in one piece —
        and every other row goes through ``_feed_rows_py``, so both paths give the same events."""
        assert compiled is not None
        if block and type(block[0][2]) is not bytes:  # the named cursor's memoryviews: one copy each, as below
            block = [(lsn, xid, data if type(data) is bytes else bytes(data)) for lsn, xid, data in block]
        take_plain, spill_plain = compiled.take_plain, compiled.spill_plain
        relations = self.relations.live()
        budget = self._budget
        i, n = 0, len(block)
        while i < n:
            tx = self._tx
            if tx is not None:
                spill = tx.spill
                if spill is None:
                    j, size = take_plain(block, i, relations, tx.items, budget - self._buffered)
                    if j > i:
                        tx.mem_bytes += size
                        self._buffered += size
                        if self._buffered > budget:
                            self._start_spill(tx)
                        i = j
                        continue
                else:
                    j, records = spill_plain(block, i, relations)
                    if j > i:
                        spill.append_records(records, j - i)
                        i = j
                        continue
            yield from self._feed_rows_py(block[i:i + 1])
            i += 1

    def _feed_rows_py(self, rows: Iterable[tuple[int, int, bytes | bytearray | memoryview]]) -> Iterator[Event]:
        """The pure-Python row loop: the reference the compiled path is tested against."""
        get_relation, budget, unsplit, is_unsplit = self._get_relation, self._budget, unsplit_row_change, is_unsplit_row
        for lsn, xid, data in rows:
            if type(data) is not bytes:  # psycopg2 hands out memoryviews whose items may be bytes, not ints
                data = bytes(data)
            tx = self._tx
            if tx is not None:
                spill = tx.spill
                if spill is None:
                    # Plain DML inside Begin…Commit, the bulk of all rows: its tuple stays unsplit
                    # and the Arrow converter frames a whole row group at once (values.framing).
                    change = unsplit(data, lsn, get_relation)
                    if change is not None:
                        tx.items.append(change)
                        # self._account(tx, size), inlined: this runs once per row
                        size = len(data)
                        tx.mem_bytes += size
                        self._buffered += size
                        if self._buffered > budget:
                            self._start_spill(tx)
                        continue
                elif is_unsplit(data, lsn, get_relation):
                    # A spilling transaction's plain DML goes to the file as is (relation checked); it
                    # is framed when read back, like any unsplit tuple. Counted at commit (_resolve).
                    spill.append(lsn, 0, data)
                    continue
            event = self._feed_message(lsn, xid, data)
            if event is not None:
                yield event

    def _feed_message(self, lsn: int, xid: int, data: bytes) -> Event | None:
        if not data:
            raise DecodeError("empty message", lsn=lsn, offset=0)
        t = data[0]
        tx = self._tx
        if tx is not None and tx.spill is None and (t == 73 or t == 85 or t == 68):
            # DML that does not frame as ``unsplit_row_change`` expects: parsed eagerly for the precise error
            _, relid, old, key_only, new = parse_row(data, lsn, False)
            rel = self._get_relation(relid)
            if rel is None:
                raise unknown_relation(relid, lsn, chr(t))
            tx.items.append(row_change(ROW_OPS[t], rel, lsn, old, new, key_only))
            self._account(tx, len(data))
            return None
        if tx is not None and tx.spill is not None and is_unsplit_row(data, lsn, self._get_relation):
            # (feed_rows takes this path inline; kept for direct callers) counted at commit (_resolve)
            tx.spill.append(lsn, 0, data)
            return None
        if self._stream is not None:
            return self._feed_stream_block(self._stream, lsn, data)
        msg = parse_message(data, lsn=lsn)
        if tx is not None:
            return self._feed_transaction(tx, lsn, data, msg)
        return self._feed_idle(lsn, xid, msg)

    # -- per-state handling -----------------------------------------------------------------

    def _feed_transaction(self, tx: _Buffer, lsn: int, data: bytes, msg: m.Message) -> Event | None:
        if isinstance(msg, m.RelationMessage):
            schema = self.relations.apply_relation(msg)
            if tx.spill is not None:
                tx.side.append((tx.spill.records, schema))
        elif isinstance(msg, m.TypeMessage):
            tx.types.append(self.relations.apply_type(msg))
        elif isinstance(msg, m.OriginMessage):
            tx.origin, tx.origin_lsn = msg.name, msg.origin_lsn or None
        elif isinstance(msg, m.LogicalDecodingMessage) and not msg.transactional:
            return NonTransactionalMessage(LogicalMessage(msg.lsn, False, msg.prefix, msg.content), tx.xid)
        elif isinstance(msg, (m.InsertMessage, m.UpdateMessage, m.DeleteMessage, m.TruncateMessage,
                              m.LogicalDecodingMessage)):
            change = to_change(msg, lsn, self._get_relation)  # validates relids even when spilling
            if tx.spill is not None:
                tx.spill.append(lsn, 0, data)  # counted at commit (_resolve)
            else:
                tx.items.append(change)
                self._account(tx, len(data))
        elif isinstance(msg, m.CommitMessage) and tx.kind == "B":
            return self._commit(tx, lsn, msg)
        elif isinstance(msg, m.PrepareMessage) and tx.kind == "b":
            return self._prepare(tx, lsn, msg)
        else:
            raise DecodeError(f"{type(msg).__name__} inside a transaction begun by {tx.kind!r}", lsn=lsn,
                              message_type=chr(data[0]))
        return None

    def _feed_stream_block(self, tx: _Buffer, lsn: int, data: bytes) -> Event | None:
        t = data[0]
        if t == 69:  # 'E' Stream Stop
            parse_message(data, lsn=lsn)
            self._stream = None
            return None
        msg = parse_message(data, lsn=lsn, in_stream=True)
        if isinstance(msg, m.OriginMessage):
            tx.origin, tx.origin_lsn = msg.name, msg.origin_lsn or None
            return None
        if isinstance(msg, m.LogicalDecodingMessage) and not msg.transactional:
            return NonTransactionalMessage(LogicalMessage(msg.lsn, False, msg.prefix, msg.content), tx.xid)
        if isinstance(msg, _SCHEMA_MESSAGES):
            if isinstance(msg, m.RelationMessage):
                tx.stream_relids.add(msg.relid)
            if tx.spill is not None:
                tx.stream_side.append((tx.spill.records, msg))
            else:
                tx.streamed.append((lsn, msg.xid, msg, 0))
            return None
        if not isinstance(msg, (m.InsertMessage, m.UpdateMessage, m.DeleteMessage, m.TruncateMessage,
                                m.LogicalDecodingMessage)):
            raise DecodeError(f"{type(msg).__name__} inside a streaming block", lsn=lsn, message_type=chr(t))
        if isinstance(msg, m.TruncateMessage):
            relids = msg.relids
        elif isinstance(msg, m.LogicalDecodingMessage):
            relids = ()
        else:
            relids = (msg.relid,)
        for relid in relids:
            if relid not in tx.stream_relids and relid not in self.relations:
                raise unknown_relation(relid, lsn, chr(t))
        subxid = msg.xid
        if subxid is None:  # parse_message(in_stream=True) reads it for every streamable type
            raise DecodeError(f"{type(msg).__name__} inside a streaming block without an xid", lsn=lsn,
                              message_type=chr(t))
        if subxid in tx.aborted:
            raise DecodeError(f"change for subtransaction {subxid} after its Stream Abort", lsn=lsn,
                              message_type=chr(t))
        if tx.spill is not None:
            tx.spill.append(lsn, subxid, data)
            tx.spill_counts[subxid] = tx.spill_counts.get(subxid, 0) + 1
        else:
            tx.streamed.append((lsn, subxid, msg, len(data)))
            self._account(tx, len(data))
        return None

    def _feed_idle(self, lsn: int, xid: int, msg: m.Message) -> Event | None:
        if isinstance(msg, m.BeginMessage):
            self._tx = _Buffer(msg.xid, "B", msg)
        elif isinstance(msg, m.BeginPrepareMessage):
            self._tx = _Buffer(msg.xid, "b", msg)
        elif isinstance(msg, m.StreamStartMessage):
            tx = self._streams.get(msg.xid)
            if msg.first_segment and tx is not None:
                raise DecodeError(f"first Stream Start for xid {msg.xid} which is already streaming", lsn=lsn)
            if not msg.first_segment and tx is None:
                raise DecodeError(f"Stream Start continues xid {msg.xid} whose first segment was not seen",
                                  lsn=lsn)
            if tx is None:
                tx = self._streams[msg.xid] = _Buffer(msg.xid, "S")
            self._stream = tx
        elif isinstance(msg, (m.StreamCommitMessage, m.StreamPrepareMessage)):
            tx = self._streams.pop(msg.xid, None)
            if tx is None:
                raise DecodeError(f"{type(msg).__name__} for xid {msg.xid} that was never streamed", lsn=lsn)
            if isinstance(msg, m.StreamCommitMessage):
                return self._commit(tx, lsn, msg)
            return self._prepare(tx, lsn, msg)
        elif isinstance(msg, m.StreamAbortMessage):
            self._stream_abort(lsn, msg)
        elif isinstance(msg, m.CommitPreparedMessage):
            self._completed(msg.end_lsn)
            return PreparedOutcome(msg.xid, msg.gid, True, msg.end_lsn, msg.commit_time_us)
        elif isinstance(msg, m.RollbackPreparedMessage):
            self._completed(msg.rollback_end_lsn)
            return PreparedOutcome(msg.xid, msg.gid, False, msg.rollback_end_lsn, msg.rollback_time_us)
        elif isinstance(msg, m.LogicalDecodingMessage) and not msg.transactional:
            return NonTransactionalMessage(LogicalMessage(msg.lsn, False, msg.prefix, msg.content), xid)
        else:
            raise DecodeError(f"{type(msg).__name__} outside a transaction", lsn=lsn)
        return None

    # -- transaction completion -------------------------------------------------------------

    def _stream_abort(self, lsn: int, msg: m.StreamAbortMessage) -> None:
        tx = self._streams.get(msg.xid)
        if tx is None:
            raise DecodeError(f"Stream Abort for xid {msg.xid} that is not streaming", lsn=lsn)
        if msg.subxid == msg.xid:
            del self._streams[msg.xid]
            self._release(tx)
            return
        keep, freed = [], 0
        for item in tx.streamed:
            if item[1] == msg.subxid and not isinstance(item[2], _SCHEMA_MESSAGES):
                freed += item[3]
            else:
                keep.append(item)
        tx.streamed = keep
        tx.mem_bytes -= freed
        self._buffered -= freed
        tx.aborted.add(msg.subxid)
        tx.spill_counts.pop(msg.subxid, None)

    def _resolve(self, tx: _Buffer) -> tuple[Change, ...] | SpilledChanges:
        """The buffered changes in order, applying buffered stream schema messages to the cache."""
        if tx.kind != "S":
            prefix = tuple(tx.items)
        else:
            out = []
            for lsn, _subxid, msg, _size in tx.streamed:
                if isinstance(msg, m.RelationMessage):
                    self.relations.apply_relation(msg)
                elif isinstance(msg, m.TypeMessage):
                    tx.types.append(self.relations.apply_type(msg))
                else:
                    out.append(to_change(msg, lsn, self._get_relation))
            prefix = tuple(out)
        if tx.spill is None:
            return prefix
        timeline: list[tuple[int, RelationSchema]] = []
        if tx.kind == "S":
            tx.base = self.relations.snapshot()
            for index, schema_msg in tx.stream_side:
                if isinstance(schema_msg, m.RelationMessage):
                    timeline.append((index, self.relations.apply_relation(schema_msg)))
                else:
                    tx.types.append(self.relations.apply_type(schema_msg))
        else:
            timeline = tx.side
            # Outside streams every spilled record is a change of the top-level xid (schema messages go to
            # ``side``), so the file's record count is the count — no per-row bookkeeping while spilling.
            tx.spill_counts = {0: tx.spill.records}
        changes = SpilledChanges(prefix, tx.spill, tx.base or {}, timeline, frozenset(tx.aborted),
                                 len(prefix) + sum(tx.spill_counts.values()), _spill_decoder(tx.kind == "S"),
                                 _spill_decoder_many(tx.kind == "S"))
        tx.spill = None  # ownership moves to the SpilledChanges
        self._emitted.add(changes)
        return changes

    def _commit(self, tx: _Buffer, lsn: int, msg: m.CommitMessage | m.StreamCommitMessage) -> Transaction:
        if isinstance(msg, m.CommitMessage):
            self._tx = None
            if not isinstance(tx.start, m.BeginMessage):
                raise DecodeError("Commit of a transaction not opened by Begin", lsn=lsn, message_type="C")
            if msg.commit_lsn != tx.start.final_lsn:
                raise DecodeError(f"commit LSN {msg.commit_lsn:#x} differs from Begin's final LSN "
                                  f"{tx.start.final_lsn:#x}", lsn=lsn, message_type="C")
        changes = self._resolve(tx)
        self._release(tx)
        self._completed(msg.end_lsn)
        return Transaction(xid=tx.xid, commit_lsn=msg.commit_lsn, end_lsn=msg.end_lsn,
                           commit_time_us=msg.commit_time_us, changes=changes,
                           origin=tx.origin, origin_lsn=tx.origin_lsn, streamed=tx.kind == "S",
                           types=tuple(tx.types))

    def _prepare(self, tx: _Buffer, lsn: int, msg: m.PrepareMessage | m.StreamPrepareMessage) -> PreparedTransaction:
        if isinstance(msg, m.PrepareMessage):
            self._tx = None
            if not isinstance(tx.start, m.BeginPrepareMessage):
                raise DecodeError("Prepare of a transaction not opened by Begin Prepare", lsn=lsn, message_type="P")
            if msg.prepare_lsn != tx.start.prepare_lsn or msg.gid != tx.start.gid:
                raise DecodeError("Prepare does not match its Begin Prepare (LSN or gid)", lsn=lsn,
                                  message_type="P")
        changes = self._resolve(tx)
        self._release(tx)
        self._completed(msg.end_lsn)
        return PreparedTransaction(xid=tx.xid, gid=msg.gid, prepare_lsn=msg.prepare_lsn, end_lsn=msg.end_lsn,
                                   prepare_time_us=msg.prepare_time_us, changes=changes)

    # -- bookkeeping ------------------------------------------------------------------------

    def _account(self, tx: _Buffer, size: int) -> None:
        tx.mem_bytes += size
        self._buffered += size
        if self._buffered > self._budget and tx.spill is None:
            self._start_spill(tx)

    def _start_spill(self, tx: _Buffer) -> None:
        tx.spill = SpillFile(self._spill_dir)
        if tx.kind != "S":
            tx.base = self.relations.snapshot()

    def _release(self, tx: _Buffer) -> None:
        self._buffered -= tx.mem_bytes
        tx.mem_bytes = 0
        tx.close()

    def _completed(self, end_lsn: int) -> None:
        if self.last_commit_end_lsn is None or end_lsn > self.last_commit_end_lsn:
            self.last_commit_end_lsn = end_lsn

    def pending(self) -> tuple[int, ...]:
        """Xids of transactions begun but not completed; empty when the rows ended cleanly."""
        open_tx = (self._tx.xid,) if self._tx is not None else ()
        return open_tx + tuple(self._streams)

    def finish(self) -> tuple[int, ...]:
        """End of one SQL call's rows: drop incomplete transactions, return their xids."""
        dropped = self.pending()
        if self._tx is not None:
            self._release(self._tx)
        for tx in self._streams.values():
            self._release(tx)
        self._tx, self._stream, self._streams = None, None, {}
        return dropped

    def close(self) -> None:
        """``finish()`` and close every SpilledChanges this assembler emitted."""
        self.finish()
        for changes in list(self._emitted):
            changes.close()

    def __enter__(self) -> ChangeAssembler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
