"""Read staged batches (docs/staging-format.md): manifests and small metadata on the driver, row changes as DataFrames."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING
from urllib.parse import quote

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_provider_pglogical.exceptions import StagingError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FORMAT_VERSION = 1
# Every staged metadata column gets this prefix in the working frame so a source column named
# e.g. "op" can never collide with it.
META = "_pgl_"
CHANGE_META_COLUMNS = ("commit_lsn", "end_lsn", "lsn", "tx_order", "xid", "commit_time", "op",
                       "schema_version", "old", "old_key_only", "new", "new_unchanged_toast")
NOTES_COLUMNS = ("old_value_notes", "new_value_notes")  # exactness notes; empty maps when a file lacks them


@dataclass(frozen=True)
class RelationColumn:
    name: str
    type_name: str | None
    is_identity: bool


@dataclass(frozen=True)
class RelationInfo:
    """The latest staged shape of one source relation within a batch."""

    schema: str
    table: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def identity_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.is_identity)


@dataclass(frozen=True)
class TruncateEvent:
    commit_lsn: int
    tx_order: int
    relations: tuple[str, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True)
class Batch:
    """One committed batch directory (its ``_manifest.json`` exists)."""

    uri: str  # directory, as given to Spark
    path: str  # directory, as seen by the pyarrow filesystem
    start_lsn: int
    end_lsn: int
    table_files: dict[str, tuple[str, ...]]  # "schema.table" -> relative parquet paths
    truncates: int


def _filesystem(root: str) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, path inside it, URI prefix Spark understands) for a staging root."""
    if "://" in root:
        fs, path = pafs.FileSystem.from_uri(root)
        return fs, path.rstrip("/"), root.rstrip("/")
    return pafs.LocalFileSystem(), root.rstrip("/"), root.rstrip("/")


def list_batches(staging_root: str, slot: str) -> list[Batch]:
    """Committed batches of ``slot`` in LSN order; directories without a manifest are ignored."""
    fs, root_path, root_uri = _filesystem(staging_root)
    slot_dir = posixpath.join(quote(slot, safe=""), "batches")
    infos = fs.get_file_info(pafs.FileSelector(posixpath.join(root_path, slot_dir), allow_not_found=True))
    batches: list[Batch] = []
    # "_partial-<start>" and other "_" names are batches still being written: never read them.
    dirs = [i for i in infos if i.type == pafs.FileType.Directory and not i.base_name.startswith("_")]
    for info in sorted(dirs, key=lambda i: i.base_name):
        manifest_path = posixpath.join(info.path, "_manifest.json")
        if fs.get_file_info(manifest_path).type != pafs.FileType.File:
            continue  # still being written, or abandoned: not a batch yet
        with fs.open_input_stream(manifest_path) as f:
            manifest = json.loads(f.read())
        if manifest.get("format_version") != FORMAT_VERSION:
            raise StagingError(f"batch {info.base_name}: unsupported staging format_version "
                               f"{manifest.get('format_version')!r}")
        tables = {name: tuple(t.get("files", ())) for name, t in (manifest.get("tables") or {}).items()}
        batches.append(Batch(
            uri=posixpath.join(root_uri, slot_dir, info.base_name),
            path=info.path,
            start_lsn=int(manifest["start_lsn_int"]),
            end_lsn=int(manifest["end_lsn_int"]),
            table_files=tables,
            truncates=int(manifest.get("truncates") or 0),
        ))
    for prev, nxt in zip(batches, batches[1:], strict=False):
        if nxt.start_lsn < prev.end_lsn:
            raise StagingError(f"slot {slot}: batches overlap at LSN {nxt.start_lsn}")
    return batches


def _read_small(batch: Batch, name: str) -> list[dict] | None:
    fs, _, _ = _filesystem(batch.uri)
    path = posixpath.join(batch.path, name)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    return pq.read_table(path, filesystem=fs).to_pylist()


def read_relation_versions(batch: Batch) -> dict[str, list[tuple[int, RelationInfo]]]:
    """Every schema version per ``schema.table`` seen in the batch, as (first LSN, shape), oldest first."""
    versions: dict[str, list[tuple[int, int, RelationInfo]]] = {}
    for row in _read_small(batch, "relations.parquet") or []:
        info = RelationInfo(
            schema=row["schema"], table=row["table"], replica_identity=row["replica_identity"],
            columns=tuple(RelationColumn(c["name"], c.get("type_name"), bool(c["is_identity"]))
                          for c in row["columns"]))
        versions.setdefault(info.qualified_name, []).append((int(row["first_lsn"]), int(row["schema_version"]), info))
    # A relid dropped and recreated restarts at version 1: the first LSN orders them.
    return {name: [(lsn, info) for lsn, _, info in sorted(vs, key=lambda v: (v[0], v[1]))]
            for name, vs in versions.items()}


def read_relations(batch: Batch) -> dict[str, RelationInfo]:
    """Latest schema version per ``schema.table`` seen in the batch."""
    return {name: vs[-1][1] for name, vs in read_relation_versions(batch).items()}


def read_truncates(batch: Batch) -> list[TruncateEvent]:
    rows = _read_small(batch, "truncates.parquet") if batch.truncates else None
    return [TruncateEvent(int(r["commit_lsn"]), int(r["tx_order"]), tuple(r["relations"]),
                          bool(r["cascade"]), bool(r["restart_identity"])) for r in rows or []]


def has_value_notes(batch: Batch, table: str) -> bool:
    """Whether any staged image of ``table`` in ``batch`` carries an exactness note.

    Read driver-side from the two small notes columns only: almost every batch has none, and
    then the Spark plan skips carrying notes through (``apply/notes.py``) altogether.
    """
    fs = pafs.FileSystem.from_uri(batch.uri)[0] if "://" in batch.uri else pafs.LocalFileSystem()
    for rel in batch.table_files.get(table, ()):
        parquet = pq.ParquetFile(posixpath.join(batch.path, rel), filesystem=fs)
        present = [c for c in NOTES_COLUMNS if c in parquet.schema_arrow.names]
        if present and any(len(chunk.keys) for column in parquet.read(columns=present).columns
                           for chunk in column.chunks):
            return True
    return False


def read_changes(spark: SparkSession, batch: Batch, table: str) -> DataFrame:
    """The table's row changes of every schema version, meta columns prefixed with ``_pgl_``.

    Versions are unioned by name (missing struct fields become null), so the frame always has
    the union of the columns of all versions. The exactness notes come along (``apply/notes.py``).
    """
    frames = [spark.read.parquet(posixpath.join(batch.uri, rel)) for rel in batch.table_files.get(table, ())]
    if not frames:
        raise StagingError(f"batch {batch.start_lsn}-{batch.end_lsn} has no files for {table}")
    df = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
    from pyspark.sql import functions as F

    notes = [(df[c] if c in df.columns else F.create_map().cast("map<string,string>")).alias(META + c)
             for c in NOTES_COLUMNS]
    return df.select(*[df[c].alias(META + c) for c in CHANGE_META_COLUMNS], *notes)
