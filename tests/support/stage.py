"""Test helper: write staged batches (docs/staging-format.md) with pyarrow, no decoder needed."""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_provider_pglogical.staging import schema as S
from airflow_provider_pglogical.staging.layout import MESSAGES, TRANSACTIONS
from airflow_provider_pglogical.staging.manifest import FORMAT_VERSION, FileRecord, hash_file

COMMIT_TIME = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Col:
    name: str
    arrow: pa.DataType
    type_name: str
    identity: bool = False
    # attmissingval text of a column added with a DEFAULT (``{7}``): what rows staged before the ADD COLUMN read.
    missing: str | None = None


@dataclass(frozen=True)
class Rel:
    schema: str
    table: str
    columns: tuple[Col, ...]
    replica_identity: str = "d"
    relid: int = 16384
    # Schema version: several ``Rel`` of one name in a batch are its versions (``v<N>.parquet``), in LSN order.
    version: int = 1

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    def struct(self) -> pa.StructType:
        return pa.struct([pa.field(c.name, c.arrow) for c in self.columns])


# The relations of the apply's unit tests: a primary key, the same table under REPLICA IDENTITY FULL, a two-column key.
ITEMS = Rel("public", "items", (Col("id", pa.int64(), "bigint", True), Col("grp", pa.int64(), "bigint"),
                                Col("note", pa.string(), "text")))
ITEMS_FULL = Rel("public", "items", ITEMS.columns, replica_identity="f")
PAIRS = Rel("public", "pairs", (Col("a", pa.int64(), "bigint", True), Col("b", pa.string(), "text", True),
                                Col("v", pa.int64(), "bigint")))


@dataclass
class Chg:
    """One row change; ``old_key_only`` marks a 'K' image, ``toast`` lists 'u' columns of new."""

    op: str
    commit_lsn: int
    tx_order: int
    new: dict | None = None
    old: dict | None = None
    old_key_only: bool = False
    toast: tuple[str, ...] = ()


@dataclass
class Trunc:
    commit_lsn: int
    tx_order: int
    relations: tuple[str, ...]
    cascade: bool = False
    restart_identity: bool = False


@dataclass
class BatchSpec:
    start: int
    end: int
    changes: dict[Rel, list[Chg]] = field(default_factory=dict)
    truncates: list[Trunc] = field(default_factory=list)
    # Changes per row group of each table's file (None: one row group), as a drain's files of a larger batch hold.
    row_group_size: int | None = None


def write_batch(root: str | os.PathLike, slot: str, spec: BatchSpec) -> Path:
    bdir = Path(root) / quote(slot, safe="") / "batches" / f"{spec.start:016X}-{spec.end:016X}"
    (bdir / "tables").mkdir(parents=True, exist_ok=True)
    manifest_tables: dict[str, dict] = {}
    rels = list(spec.changes)
    names = list(dict.fromkeys(r.name for r in rels))
    for rel, changes in spec.changes.items():
        st = rel.struct()
        changes = sorted(changes, key=lambda c: (c.commit_lsn, c.tx_order))
        table = pa.table({
            "commit_lsn": pa.array([c.commit_lsn for c in changes], pa.int64()),
            "end_lsn": pa.array([c.commit_lsn + 8 for c in changes], pa.int64()),
            "lsn": pa.array([c.commit_lsn - 100 + c.tx_order for c in changes], pa.int64()),
            "tx_order": pa.array([c.tx_order for c in changes], pa.int64()),
            "xid": pa.array([700 + c.commit_lsn % 1000 for c in changes], pa.int64()),
            "commit_time": pa.array([COMMIT_TIME] * len(changes), pa.timestamp("us", tz="UTC")),
            "op": pa.array([c.op for c in changes], pa.string()),
            "schema_version": pa.array([rel.version] * len(changes), pa.int32()),
            "old": pa.array([c.old for c in changes], st),
            "old_key_only": pa.array([c.old_key_only for c in changes], pa.bool_()),
            "new": pa.array([c.new for c in changes], st),
            "new_unchanged_toast": pa.array([list(c.toast) for c in changes], pa.list_(pa.string())),
        })
        rel_path = f"tables/{quote(rel.name, safe='.')}/v{rel.version}.parquet"
        (bdir / rel_path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, bdir / rel_path, row_group_size=spec.row_group_size)
        entry = manifest_tables.setdefault(rel.name, {"rows": 0, "files": []})
        entry["rows"] += len(changes)
        entry["files"].append(rel_path)
    for t in spec.truncates:
        for name in t.relations:
            if not any(r.name == name for r in rels):
                raise ValueError(f"declare {name} in changes (an empty list is fine)")
    if spec.truncates:
        pq.write_table(pa.table({
            "commit_lsn": pa.array([t.commit_lsn for t in spec.truncates], pa.int64()),
            "end_lsn": pa.array([t.commit_lsn + 8 for t in spec.truncates], pa.int64()),
            "lsn": pa.array([t.commit_lsn - 50 for t in spec.truncates], pa.int64()),
            "tx_order": pa.array([t.tx_order for t in spec.truncates], pa.int64()),
            "xid": pa.array([1] * len(spec.truncates), pa.int64()),
            "commit_time": pa.array([COMMIT_TIME] * len(spec.truncates), pa.timestamp("us", tz="UTC")),
            "relations": pa.array([list(t.relations) for t in spec.truncates], pa.list_(pa.string())),
            "relids": pa.array([[0] * len(t.relations) for t in spec.truncates], pa.list_(pa.int64())),
            "cascade": pa.array([t.cascade for t in spec.truncates], pa.bool_()),
            "restart_identity": pa.array([t.restart_identity for t in spec.truncates], pa.bool_()),
        }), bdir / "truncates.parquet")
    col_type = pa.struct([("name", pa.string()), ("type_oid", pa.int64()), ("type_modifier", pa.int32()),
                          ("is_identity", pa.bool_()), ("type_name", pa.string()), ("missing", pa.string())])
    pq.write_table(pa.table({
        "relid": pa.array([r.relid + names.index(r.name) for r in rels], pa.int64()),
        "schema": [r.schema for r in rels],
        "table": [r.table for r in rels],
        "schema_version": pa.array([r.version for r in rels], pa.int32()),
        "replica_identity": [r.replica_identity for r in rels],
        "columns": pa.array([[{"name": c.name, "type_oid": 0, "type_modifier": -1,
                               "is_identity": c.identity or r.replica_identity == "f", "type_name": c.type_name,
                               "missing": c.missing}
                              for c in r.columns] for r in rels], pa.list_(col_type)),
        "first_lsn": pa.array([spec.start + r.version - 1 for r in rels], pa.int64()),
    }), bdir / "relations.parquet")
    commits = sorted({c.commit_lsn for cs in spec.changes.values() for c in cs}
                     | {t.commit_lsn for t in spec.truncates})
    pq.write_table(pa.table({
        "xid": pa.array([700 + lsn % 1000 for lsn in commits], pa.int64()),
        "commit_lsn": pa.array(commits, pa.int64()),
        "end_lsn": pa.array([lsn + 8 for lsn in commits], pa.int64()),
        "commit_time": pa.array([COMMIT_TIME] * len(commits), pa.timestamp("us", tz="UTC")),
        "origin": pa.array([None] * len(commits), pa.string()),
        "origin_lsn": pa.array([None] * len(commits), pa.int64()),
        "changes": pa.array([0] * len(commits), pa.int64()),
        "streamed": pa.array([False] * len(commits), pa.bool_()),
    }, schema=S.TRANSACTIONS_SCHEMA), bdir / TRANSACTIONS)
    pq.write_table(S.MESSAGES_SCHEMA.empty_table(), bdir / MESSAGES)
    manifest = {"format_version": FORMAT_VERSION, "slot": slot, "publication": "pub", "start_lsn_int": spec.start,
                "end_lsn_int": spec.end, "tables": manifest_tables, "truncates": len(spec.truncates),
                "messages": 0, "transactions": len(commits), "files": file_records(bdir)}
    (bdir / "_manifest.json.tmp").write_text(json.dumps(manifest))
    os.replace(bdir / "_manifest.json.tmp", bdir / "_manifest.json")
    return bdir


def file_records(bdir: Path) -> dict[str, dict]:
    """The manifest's ``files``: every Parquet file under ``bdir`` as the writer records it."""
    out = {}
    for path in sorted(bdir.rglob("*.parquet")):
        table = pq.read_table(path)
        lsns = [v for v in table.column("commit_lsn").to_pylist() if v is not None] \
            if "commit_lsn" in table.column_names else []
        size, digest = hash_file(pafs.LocalFileSystem(), str(path))
        out[path.relative_to(bdir).as_posix()] = FileRecord(size, table.num_rows, digest, min(lsns, default=None),
                                                            max(lsns, default=None)).to_dict()
    return out
