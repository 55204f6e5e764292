"""Versioned relid → RelationSchema cache (outlives one SQL call), and resolving changes against it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from airflow_provider_pglogical.decoding import messages as m
from airflow_provider_pglogical.decoding.messages import RelationMessage, TypeMessage
from airflow_provider_pglogical.decoding.model import (
    Change,
    ColumnDef,
    LogicalMessage,
    RelationSchema,
    RowChange,
    RowImage,
    TruncateChange,
    TypeInfo,
)
from airflow_provider_pglogical.decoding.reader import UINT32
from airflow_provider_pglogical.decoding.wiretuple import WireTuple, tuple_end
from airflow_provider_pglogical.exceptions import DecodeError, UnknownRelationError

# pgoutput sends "" for objects in pg_catalog (proto.c logicalrep_write_namespace).
CATALOG_NAMESPACE = "pg_catalog"
STATE_FORMAT = 1


def _namespace(wire: str) -> str:
    return wire or CATALOG_NAMESPACE


class RelationCache:
    """The current schema of every relation seen, with a version that only changes on real change.

    pgoutput re-sends Relation messages at the start of every SQL call and after any cache
    invalidation, so most arrivals are identical to what we hold: those keep the version. Any
    difference in namespace, name, replica identity or the column list (names, type OIDs,
    typmods, identity flags) creates version + 1. The state round-trips through plain dicts
    (``to_state``/``from_state``) so the next run continues the numbering.
    """

    __slots__ = ("_relations", "_types")

    def __init__(self) -> None:
        self._relations: dict[int, RelationSchema] = {}
        self._types: dict[int, TypeInfo] = {}

    def apply_relation(self, msg: RelationMessage) -> RelationSchema:
        """Record a Relation message; return the schema now current for its relid."""
        current = self._relations.get(msg.relid)
        namespace = _namespace(msg.namespace)
        if (current is not None and current.namespace == namespace and current.name == msg.name
                and current.replica_identity == msg.replica_identity and current.columns == msg.columns):
            return current
        schema = RelationSchema(relid=msg.relid, namespace=namespace, name=msg.name,
                                replica_identity=msg.replica_identity, columns=msg.columns,
                                version=1 if current is None else current.version + 1)
        self._relations[msg.relid] = schema
        return schema

    def apply_type(self, msg: TypeMessage) -> TypeInfo:
        info = TypeInfo(oid=msg.oid, namespace=_namespace(msg.namespace), name=msg.name)
        self._types[msg.oid] = info
        return info

    def get(self, relid: int) -> RelationSchema | None:
        return self._relations.get(relid)

    def getter(self) -> Callable[[int], RelationSchema | None]:
        """``get`` without the method call: the live mapping's own ``dict.get`` (for the hot path)."""
        return self._relations.get

    def live(self) -> dict[int, RelationSchema]:
        """The live relid → schema dict itself (read-only use: the compiled hot path looks relids up in it)."""
        return self._relations

    def __contains__(self, relid: object) -> bool:
        return relid in self._relations

    def __len__(self) -> int:
        return len(self._relations)

    def __iter__(self) -> Iterator[RelationSchema]:
        return iter(list(self._relations.values()))

    def type_info(self, oid: int) -> TypeInfo | None:
        return self._types.get(oid)

    @property
    def types(self) -> Mapping[int, TypeInfo]:
        return dict(self._types)

    def snapshot(self) -> dict[int, RelationSchema]:
        """A copy of relid → current schema (schemas are immutable, so a shallow copy suffices)."""
        return dict(self._relations)

    def to_state(self) -> dict[str, Any]:
        """JSON-compatible state: relations (with versions) and types."""
        return {
            "format": STATE_FORMAT,
            "relations": [
                {"relid": s.relid, "namespace": s.namespace, "name": s.name,
                 "replica_identity": s.replica_identity, "version": s.version,
                 "columns": [[c.name, c.type_oid, c.type_modifier, c.is_identity] for c in s.columns]}
                for s in self._relations.values()
            ],
            "types": [[t.oid, t.namespace, t.name] for t in self._types.values()],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RelationCache:
        """Rebuild a cache saved by ``to_state``; raises ``ValueError`` on an unknown format."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unsupported relation cache state format {state.get('format')!r}")
        cache = cls()
        for rel in state["relations"]:
            columns = tuple(ColumnDef(name=str(name), type_oid=int(oid), type_modifier=int(typmod),
                                      is_identity=bool(key)) for name, oid, typmod, key in rel["columns"])
            schema = RelationSchema(relid=int(rel["relid"]), namespace=str(rel["namespace"]), name=str(rel["name"]),
                                    replica_identity=str(rel["replica_identity"]), columns=columns,
                                    version=int(rel["version"]))
            cache._relations[schema.relid] = schema
        for oid, namespace, name in state["types"]:
            cache._types[int(oid)] = TypeInfo(oid=int(oid), namespace=str(namespace), name=str(name))
        return cache


_tuple_new = tuple.__new__


def row_change(op: str, relation: RelationSchema, lsn: int, old: RowImage | None,
               new: RowImage | None, old_key_only: bool) -> RowChange:
    """``RowChange(...)`` built the fast way (the decoder makes one per row)."""
    return _tuple_new(RowChange, (op, relation, lsn, old, new, old_key_only))


ROW_OPS = {73: "I", 85: "U", 68: "D"}  # message type byte → RowChange.op
_u32 = UINT32.unpack_from


def _row_shape(data: bytes, base: int) -> tuple[int, int, int] | None:
    """(message type, tuple tag, end of the old tuple or 0) of a DML message whose tuples stay unsplit; else None.

    'I'/'U' + relid + 'N' (one new tuple), 'D' + relid + 'K'/'O' (one old tuple), each running to the end; or
    'U' + relid + 'K'/'O' + old tuple + 'N' + new tuple, when the old tuple frames (``tuple_end``) and a new
    one follows. Anything else (malformed included) is None: the eager path raises the precise error.
    """
    if len(data) <= base + 5:
        return None
    t, tag = data[0], data[base + 4]
    if tag == 78 and (t == 73 or t == 85):  # 'N' right after the relid: no old image
        return t, tag, 0
    if tag == 75 or tag == 79:  # 'K' key image, 'O' full old row
        if t == 68:
            return t, tag, 0
        if t == 85:
            end = tuple_end(data, base + 5)
            if end is not None and end + 1 < len(data) and data[end] == 78:
                return t, tag, end
    return None


def unsplit_row_change(data: bytes, lsn: int, relation: Callable[[int], RelationSchema | None],
                       base: int = 1) -> RowChange | None:
    """The RowChange of a DML message with its tuples left unsplit (``WireTuple``); else None.

    The shapes of ``_row_shape``; ``base`` is where the relid starts (1, or 5 after a streamed [xid]).
    Anything malformed returns None for the eager path.
    """
    shape = _row_shape(data, base)
    if shape is None:
        return None
    t, tag, old_end = shape
    if old_end:  # Update with an old image: old tuple up to the 'N' tag, the new one after it
        old, new = WireTuple(data, base + 5, lsn, old_end), WireTuple(data, old_end + 1, lsn)
    elif t == 68:
        old, new = WireTuple(data, base + 5, lsn), None
    else:
        old, new = None, WireTuple(data, base + 5, lsn)
    rel = relation(_u32(data, base)[0])
    if rel is None:
        raise unknown_relation(_u32(data, base)[0], lsn, chr(t))
    return _tuple_new(RowChange, (ROW_OPS[t], rel, lsn, old, new, tag == 75))


def is_unsplit_row(data: bytes, lsn: int, relation: Callable[[int], RelationSchema | None]) -> bool:
    """Whether ``unsplit_row_change(data, lsn, relation)`` would return a change (same checks, same error for an
    unknown relation) — without building it: a spilling transaction only needs to know, per row."""
    shape = _row_shape(data, 1)
    if shape is None:
        return False
    if relation(_u32(data, 1)[0]) is None:
        raise unknown_relation(_u32(data, 1)[0], lsn, chr(shape[0]))
    return True


def unknown_relation(relid: int, lsn: int, mtype: str) -> UnknownRelationError:
    return UnknownRelationError(f"change for relation OID {relid} without a prior Relation message",
                                lsn=lsn, message_type=mtype)


def to_change(msg: m.Message, lsn: int, relation: Callable[[int], RelationSchema | None]) -> Change:
    """A decoded DML/Truncate/transactional-Message wire record → its model ``Change``."""
    if isinstance(msg, (m.InsertMessage, m.UpdateMessage, m.DeleteMessage)):
        rel = relation(msg.relid)
        if rel is None:
            raise unknown_relation(msg.relid, lsn, type(msg).__name__[0])
        if isinstance(msg, m.InsertMessage):
            return row_change("I", rel, lsn, None, msg.new, False)
        if isinstance(msg, m.UpdateMessage):
            return row_change("U", rel, lsn, msg.old, msg.new, msg.old_key_only)
        return row_change("D", rel, lsn, msg.old, None, msg.old_key_only)
    if isinstance(msg, m.TruncateMessage):
        rels = []
        for relid in msg.relids:
            rel = relation(relid)
            if rel is None:
                raise unknown_relation(relid, lsn, "T")
            rels.append(rel)
        return TruncateChange(lsn, tuple(rels), msg.cascade, msg.restart_identity)
    if isinstance(msg, m.LogicalDecodingMessage) and msg.transactional:
        return LogicalMessage(msg.lsn, True, msg.prefix, msg.content)
    raise DecodeError(f"{type(msg).__name__} is not a change", lsn=lsn)
