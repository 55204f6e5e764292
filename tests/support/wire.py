"""Builders of pgoutput messages byte by byte, mirroring proto.c, for the decoder's unit tests."""

from __future__ import annotations

import struct

Column = tuple  # ("b", b"bytes") | ("t", b"text") | ("n",) | ("u",)


def _s(text: str) -> bytes:
    return text.encode() + b"\x00"


def _x(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack("!I", xid)


def tup(*columns: Column) -> bytes:
    out = struct.pack("!h", len(columns))
    for col in columns:
        out += col[0].encode()
        if col[0] in "bt":
            out += struct.pack("!i", len(col[1])) + col[1]
    return out


def begin(final_lsn: int, xid: int, ts: int = 1000) -> bytes:
    return b"B" + struct.pack("!QqI", final_lsn, ts, xid)


def commit(commit_lsn: int, end_lsn: int, ts: int = 1000, flags: int = 0) -> bytes:
    return b"C" + struct.pack("!bQQq", flags, commit_lsn, end_lsn, ts)


def origin(name: str, origin_lsn: int = 0) -> bytes:
    return b"O" + struct.pack("!Q", origin_lsn) + _s(name)


def relation(relid: int, name: str, columns: list[tuple[str, int, int, int]], *, namespace: str = "public",
             ident: str = "d", xid: int | None = None) -> bytes:
    out = b"R" + _x(xid) + struct.pack("!I", relid) + _s(namespace) + _s(name) + ident.encode()
    out += struct.pack("!h", len(columns))
    for flags, (col, oid, typmod) in ((c[3], c[:3]) for c in columns):
        out += struct.pack("!b", flags) + _s(col) + struct.pack("!Ii", oid, typmod)
    return out


def type_(oid: int, namespace: str, name: str, xid: int | None = None) -> bytes:
    return b"Y" + _x(xid) + struct.pack("!I", oid) + _s(namespace) + _s(name)


def insert(relid: int, new: bytes, xid: int | None = None) -> bytes:
    return b"I" + _x(xid) + struct.pack("!I", relid) + b"N" + new


def update(relid: int, new: bytes, old: bytes | None = None, tag: str = "K", xid: int | None = None) -> bytes:
    old_part = b"" if old is None else tag.encode() + old
    return b"U" + _x(xid) + struct.pack("!I", relid) + old_part + b"N" + new


def delete(relid: int, old: bytes, tag: str = "K", xid: int | None = None) -> bytes:
    return b"D" + _x(xid) + struct.pack("!I", relid) + tag.encode() + old


def truncate(relids: list[int], flags: int = 0, xid: int | None = None) -> bytes:
    return b"T" + _x(xid) + struct.pack("!ib", len(relids), flags) + b"".join(struct.pack("!I", r) for r in relids)


def message(prefix: str, content: bytes, *, transactional: bool, lsn: int = 0x500, xid: int | None = None) -> bytes:
    return (b"M" + _x(xid) + struct.pack("!bQ", int(transactional), lsn) + _s(prefix)
            + struct.pack("!i", len(content)) + content)


def stream_start(xid: int, first: bool) -> bytes:
    return b"S" + struct.pack("!Ib", xid, int(first))


def stream_stop() -> bytes:
    return b"E"


def stream_commit(xid: int, commit_lsn: int, end_lsn: int, ts: int = 1000) -> bytes:
    return b"c" + struct.pack("!IbQQq", xid, 0, commit_lsn, end_lsn, ts)


def stream_abort(xid: int, subxid: int, abort_lsn: int | None = None, ts: int = 0) -> bytes:
    out = b"A" + struct.pack("!II", xid, subxid)
    return out if abort_lsn is None else out + struct.pack("!Qq", abort_lsn, ts)


def begin_prepare(prepare_lsn: int, end_lsn: int, xid: int, gid: str, ts: int = 1000) -> bytes:
    return b"b" + struct.pack("!QQqI", prepare_lsn, end_lsn, ts, xid) + _s(gid)


def prepare(prepare_lsn: int, end_lsn: int, xid: int, gid: str, ts: int = 1000, kind: str = "P") -> bytes:
    return kind.encode() + struct.pack("!bQQqI", 0, prepare_lsn, end_lsn, ts, xid) + _s(gid)


def commit_prepared(commit_lsn: int, end_lsn: int, xid: int, gid: str, ts: int = 1000) -> bytes:
    return b"K" + struct.pack("!bQQqI", 0, commit_lsn, end_lsn, ts, xid) + _s(gid)


def rollback_prepared(prepare_end_lsn: int, rollback_end_lsn: int, xid: int, gid: str) -> bytes:
    return b"r" + struct.pack("!bQQqqI", 0, prepare_end_lsn, rollback_end_lsn, 10, 20, xid) + _s(gid)


INT4 = 23
TEXT = 25
# (name, type oid, typmod, flags)
T_COLUMNS = [("id", INT4, -1, 1), ("v", TEXT, -1, 0)]


def int4(value: int) -> tuple[str, bytes]:
    return ("b", struct.pack("!i", value))


def row(i: int, text: str = "x") -> bytes:
    return tup(int4(i), ("b", text.encode()))
