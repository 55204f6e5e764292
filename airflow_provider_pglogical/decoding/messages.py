"""pgoutput wire messages as frozen records, and ``parse_message`` for one message's bytes."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_pglogical.decoding.model import ColumnDef, TupleData
from airflow_provider_pglogical.decoding.reader import UINT32, Reader, read_tuple
from airflow_provider_pglogical.exceptions import DecodeError

# Relation column flag (proto.c logicalrep_write_attrs): the column is part of the replica identity.
COLUMN_FLAG_KEY = 1
# Truncate flags (logicalproto.h TRUNCATE_CASCADE / TRUNCATE_RESTART_SEQS).
TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2
# Logical decoding message flag: emitted with transactional = true.
MESSAGE_TRANSACTIONAL = 1
# Stream Abort body after the type byte: xid + subxid, or + abort_lsn + abort_time (streaming=parallel).
_STREAM_ABORT_SHORT = 8
_STREAM_ABORT_LONG = 24


@dataclass(frozen=True, slots=True)
class BeginMessage:
    final_lsn: int  # start LSN of the commit record
    commit_time_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class CommitMessage:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class OriginMessage:
    origin_lsn: int  # 0 (InvalidXLogRecPtr) after a Stream Start
    name: str


@dataclass(frozen=True, slots=True)
class RelationMessage:
    xid: int | None  # present only inside a streaming block
    relid: int
    namespace: str  # as sent: "" means pg_catalog (resolved by RelationCache)
    name: str
    replica_identity: str
    columns: tuple[ColumnDef, ...]


@dataclass(frozen=True, slots=True)
class TypeMessage:
    xid: int | None
    oid: int
    namespace: str  # of the base type, "" = pg_catalog
    name: str


@dataclass(frozen=True, slots=True)
class InsertMessage:
    xid: int | None
    relid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class UpdateMessage:
    xid: int | None
    relid: int
    old: TupleData | None  # 'K' or 'O' image, absent when no identity column changed
    old_key_only: bool  # True for a 'K' image
    new: TupleData


@dataclass(frozen=True, slots=True)
class DeleteMessage:
    xid: int | None
    relid: int
    old: TupleData
    old_key_only: bool


@dataclass(frozen=True, slots=True)
class TruncateMessage:
    xid: int | None
    relids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class LogicalDecodingMessage:
    """The 'M' message (pg_logical_emit_message)."""

    xid: int | None
    transactional: bool
    lsn: int  # end LSN of the message's WAL record
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStartMessage:
    xid: int  # top-level transaction
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStopMessage:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommitMessage:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class StreamAbortMessage:
    xid: int  # top-level transaction
    subxid: int  # equals xid when the whole transaction aborted
    abort_lsn: int | None = None  # only with streaming=parallel (protocol 4); may be 0
    abort_time_us: int | None = None


@dataclass(frozen=True, slots=True)
class BeginPrepareMessage:
    prepare_lsn: int
    end_lsn: int
    prepare_time_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class PrepareMessage:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepareMessage:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPreparedMessage:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPreparedMessage:
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time_us: int
    rollback_time_us: int
    xid: int
    gid: str


Message = (
    BeginMessage | CommitMessage | OriginMessage | RelationMessage | TypeMessage | InsertMessage |
    UpdateMessage | DeleteMessage | TruncateMessage | LogicalDecodingMessage | StreamStartMessage |
    StreamStopMessage | StreamCommitMessage | StreamAbortMessage | BeginPrepareMessage |
    PrepareMessage | StreamPrepareMessage | CommitPreparedMessage | RollbackPreparedMessage
)

# Message types that carry the [xid] Int32 inside a streaming block.
STREAMABLE_TYPES = frozenset(b"RYIUDTM")

_u32 = UINT32.unpack_from
_CHR = tuple(chr(i) for i in range(256))


def parse_row(data: bytes, lsn: int | None, in_stream: bool) -> tuple[int | None, int, TupleData | None, bool,
                                                                       TupleData | None]:
    """Body of an Insert/Update/Delete as ``(xid, relid, old, old_key_only, new)`` without a record.

    Used directly by the assembler's hot path; ``parse_message`` wraps it in a record.
    """
    mtype = _CHR[data[0]]
    end = len(data)
    pos = 1
    xid = None
    if in_stream:
        if end < 5:
            raise DecodeError("truncated message: [xid] needs 4 bytes", lsn=lsn, offset=pos, message_type=mtype)
        xid = _u32(data, 1)[0]
        pos = 5
    if end < pos + 5:  # relid + the first submessage tag
        raise DecodeError("truncated message: relid and tuple tag need 5 bytes", lsn=lsn, offset=pos,
                          message_type=mtype)
    relid = _u32(data, pos)[0]
    tag = data[pos + 4]
    pos += 5
    old = None
    key_only = False
    new = None
    if tag == 75 or tag == 79:  # 'K' key image, 'O' old full row
        if mtype == "I":
            raise DecodeError(f"insert with {_CHR[tag]!r} tuple (expected 'N')", lsn=lsn, offset=pos - 1,
                              message_type=mtype)
        key_only = tag == 75
        old, pos = read_tuple(data, pos, lsn, mtype)
        if mtype == "U":
            if pos >= end:
                raise DecodeError("truncated message: update lacks the 'N' tuple", lsn=lsn, offset=pos,
                                  message_type=mtype)
            tag = data[pos]
            pos += 1
    elif mtype == "D":
        raise DecodeError(f"delete with tuple tag {_CHR[tag]!r} (expected 'K' or 'O')", lsn=lsn, offset=pos - 1,
                          message_type=mtype)
    if mtype != "D":
        if tag != 78:  # 'N'
            raise DecodeError(f"tuple tag {_CHR[tag]!r} where 'N' was expected", lsn=lsn, offset=pos - 1,
                              message_type=mtype)
        new, pos = read_tuple(data, pos, lsn, mtype)
    if pos != end:
        raise DecodeError(f"{end - pos} trailing bytes after message", lsn=lsn, offset=pos, message_type=mtype)
    return xid, relid, old, key_only, new


def _relation(r: Reader, xid: int | None) -> RelationMessage:
    relid = r.uint32()
    namespace = r.string()
    name = r.string()
    replident = r.byte1()
    natts = r.int16()
    if natts < 0:
        raise r.error(f"negative column count {natts}")
    columns = []
    for _ in range(natts):
        flags = r.int8()
        columns.append(ColumnDef(name=r.string(), type_oid=r.uint32(), type_modifier=r.int32(),
                                 is_identity=bool(flags & COLUMN_FLAG_KEY)))
    return RelationMessage(xid, relid, namespace, name, replident, tuple(columns))


def _truncate(r: Reader, xid: int | None) -> TruncateMessage:
    nrelids = r.int32()
    flags = r.int8()
    # Check the length before allocating: a corrupt count must not allocate billions of slots.
    if nrelids < 0 or nrelids * 4 != r.remaining:
        raise r.error(f"truncate lists {nrelids} relations but {r.remaining} bytes follow")
    relids = tuple(r.uint32() for _ in range(nrelids))
    return TruncateMessage(xid, relids, bool(flags & TRUNCATE_CASCADE), bool(flags & TRUNCATE_RESTART_IDENTITY))


def _logical_message(r: Reader, xid: int | None) -> LogicalDecodingMessage:
    flags = r.int8()
    lsn = r.uint64()
    prefix = r.string()
    content = r.bytes(r.int32())
    return LogicalDecodingMessage(xid, bool(flags & MESSAGE_TRANSACTIONAL), lsn, prefix, content)


def _stream_abort(r: Reader) -> StreamAbortMessage:
    # The abort_lsn/abort_time pair exists only with streaming=parallel; the message does not say
    # which, so the body length decides (8 or 24 bytes).
    if r.remaining not in (_STREAM_ABORT_SHORT, _STREAM_ABORT_LONG):
        raise r.error(f"stream abort body of {r.remaining} bytes (expected 8 or 24)")
    xid, subxid = r.uint32(), r.uint32()
    if r.remaining:
        return StreamAbortMessage(xid, subxid, r.uint64(), r.int64())
    return StreamAbortMessage(xid, subxid)


def _prepare_fields(r: Reader) -> tuple[int, int, int, int, int, str]:
    return r.int8(), r.uint64(), r.uint64(), r.int64(), r.uint32(), r.string()


def parse_message(data: bytes | bytearray | memoryview, *, lsn: int | None = None, in_stream: bool = False) -> Message:
    """Decode one pgoutput message (one row's ``data`` of ``pg_logical_slot_*_binary_changes``).

    ``in_stream`` says whether the message sits between Stream Start and Stream Stop, where
    R/Y/I/U/D/T/M carry a leading [xid]. ``lsn`` only labels errors. Raises ``DecodeError`` on
    truncation, trailing bytes, unknown types or malformed fields; never reads past the end.
    """
    if type(data) is not bytes:
        data = bytes(data)
    if not data:
        raise DecodeError("empty message", lsn=lsn, offset=0)
    t = data[0]
    mtype = _CHR[t]
    if t in (73, 85, 68):  # 'I', 'U', 'D'
        xid, relid, old, key_only, new = parse_row(data, lsn, in_stream)
        # parse_row raises unless I/U carry their new tuple and D its old one; the checks only tell the types.
        if t == 73 and new is not None:
            return InsertMessage(xid, relid, new)
        if t == 85 and new is not None:
            return UpdateMessage(xid, relid, old, key_only, new)
        if t == 68 and old is not None:
            return DeleteMessage(xid, relid, old, key_only)
        raise DecodeError("row message without its tuple", lsn=lsn, offset=1, message_type=mtype)
    r = Reader(data, 1, lsn=lsn, message_type=mtype)
    xid = r.uint32() if in_stream and t in STREAMABLE_TYPES else None
    msg: Message
    if mtype == "B":
        msg = BeginMessage(r.uint64(), r.int64(), r.uint32())
    elif mtype == "C":
        msg = CommitMessage(r.int8(), r.uint64(), r.uint64(), r.int64())
    elif mtype == "O":
        msg = OriginMessage(r.uint64(), r.string())
    elif mtype == "R":
        msg = _relation(r, xid)
    elif mtype == "Y":
        msg = TypeMessage(xid, r.uint32(), r.string(), r.string())
    elif mtype == "T":
        msg = _truncate(r, xid)
    elif mtype == "M":
        msg = _logical_message(r, xid)
    elif mtype == "S":
        msg = StreamStartMessage(r.uint32(), r.int8() == 1)
    elif mtype == "E":
        msg = StreamStopMessage()
    elif mtype == "c":
        msg = StreamCommitMessage(r.uint32(), r.int8(), r.uint64(), r.uint64(), r.int64())
    elif mtype == "A":
        msg = _stream_abort(r)
    elif mtype == "b":
        msg = BeginPrepareMessage(r.uint64(), r.uint64(), r.int64(), r.uint32(), r.string())
    elif mtype == "P":
        msg = PrepareMessage(*_prepare_fields(r))
    elif mtype == "p":
        msg = StreamPrepareMessage(*_prepare_fields(r))
    elif mtype == "K":
        msg = CommitPreparedMessage(*_prepare_fields(r))
    elif mtype == "r":
        msg = RollbackPreparedMessage(r.int8(), r.uint64(), r.uint64(), r.int64(), r.int64(), r.uint32(), r.string())
    else:
        raise DecodeError(f"unknown message type {mtype!r}", lsn=lsn, offset=0, message_type=mtype)
    r.expect_end()
    return msg
