"""Where snapshot batches live in the staging area, their manifests, sync requests and progress.

```
<staging root>/<slot>/snapshots/
  _requests/<schema>.<table>.json         a table waits for a snapshot (initial, added, resync)
  _progress/<schema>.<table>.json         rows/bytes copied so far by the running snapshot
  <schema>.<table>/
    _partial-<lsn>/                       a snapshot being written (ignored by readers)
    <lsn>/                                16 upper-case hex digits: the table's sync LSN
      chunks/c<NNNNN>.parquet             row-change schema, every row an INSERT at <lsn>
      chunks/p<NNNN>-c<NNNNN>.parquet     a routed partitioned table: part (leaf) NNNN's chunks
      _manifest.json                      written LAST, atomically
```

Names are quoted like batch names (``staging.layout.quote_name``). See docs/staging-format.md.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs

from airflow_provider_pglogical.exceptions import StagingCorruptError, StagingError, format_lsn
from airflow_provider_pglogical.lsn import lsn_hex
from airflow_provider_pglogical.staging.layout import (
    MANIFEST,
    PARTIAL_PREFIX,
    StagingLayout,
    make_dirs,
    quote_name,
    unquote_name,
)
from airflow_provider_pglogical.staging.manifest import FileRecord, read_text, write_text_atomic
from airflow_provider_pglogical.staging.verify import verify_files

SNAPSHOT_FORMAT_VERSION = 1
# Version 2: a routed partitioned table's snapshot, staged whole under the table with one part per leaf
# (``SnapshotManifest.parts``); a version-1 reader would load its leaves' files as one relation.
ROUTED_FORMAT_VERSION = 2
REQUESTS = "_requests"
PROGRESS = "_progress"


def table_segment(table: str) -> str:
    schema, _, name = table.partition(".")
    return f"{quote_name(schema)}.{quote_name(name)}"


def segment_table(segment: str) -> str:
    schema, _, name = segment.partition(".")
    return f"{unquote_name(schema)}.{unquote_name(name)}"


@dataclass
class SnapshotManifest:
    """A published snapshot of one table at its sync LSN (``_manifest.json``)."""

    slot: str
    publication: str
    table: str  # schema.table on the source, unquoted
    lsn_int: int  # consistent point: the snapshot holds exactly the transactions committed before it
    reason: str  # initial | added | resync
    request_id: str
    relation: dict[str, Any]  # relid, schema, table, replica_identity, columns [{name, type_oid, ...}]
    row_filter: str | None = None  # as evaluated on the source (publication filter AND spec filter)
    rows: int = 0
    bytes: int = 0
    chunks: int = 0
    files: list[str] = field(default_factory=list)
    server_version: int = 0
    seconds: float = 0.0
    created_at: str = ""
    kind: str = "snapshot"
    format_version: int = SNAPSHOT_FORMAT_VERSION
    # A partitioned table whose leaves are routed to its target (``leaves: route_to_root``): one part per
    # leaf read — {table, relation, row_filter, rows, bytes, files} — all at ``lsn``. ``relation`` above is
    # then the root's (the target's columns and key), ``files`` every part's files, ``row_filter`` the spec's.
    parts: list[dict[str, Any]] = field(default_factory=list)
    # chunk file → FileRecord.to_dict() (size, rows, SHA-256, commit-LSN range): what the apply verifies
    file_records: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.parts:
            self.format_version = ROUTED_FORMAT_VERSION

    @property
    def lsn(self) -> str:
        return format_lsn(self.lsn_int)

    def to_json(self) -> str:
        body = asdict(self)
        body["lsn"] = self.lsn
        body["created_at"] = self.created_at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return json.dumps(body, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, *, where: str = "") -> SnapshotManifest:
        try:
            body = json.loads(text)
            version = int(body.get("format_version", 0))
            if version not in (SNAPSHOT_FORMAT_VERSION, ROUTED_FORMAT_VERSION) or body.get("kind") != "snapshot" \
                    or (version == ROUTED_FORMAT_VERSION) != bool(body.get("parts")):
                raise StagingError(f"snapshot manifest {where} has an unknown kind or format_version")
            known = set(cls.__dataclass_fields__)
            return cls(**{k: v for k, v in body.items() if k in known})
        except StagingError:
            raise
        except (ValueError, TypeError, KeyError) as exc:
            raise StagingError(f"unreadable snapshot manifest {where}: {exc}") from exc


@dataclass(frozen=True)
class SnapshotRef:
    table: str
    lsn: int
    path: str


def snapshot_label(ref: SnapshotRef) -> str:
    """How errors name a staged snapshot: its table, sync LSN and directory."""
    return f"staged snapshot of {ref.table} at {format_lsn(ref.lsn)} ({ref.path.rsplit('/', 1)[-1]})"


@dataclass(frozen=True)
class SnapshotLayout:
    """Paths of one slot's snapshot area (on the staging filesystem)."""

    staging: StagingLayout

    @classmethod
    def from_uri(cls, uri: str, slot: str) -> SnapshotLayout:
        return cls(StagingLayout.from_uri(uri, slot))

    @property
    def fs(self) -> pafs.FileSystem:
        return self.staging.fs

    @property
    def root(self) -> str:
        return f"{self.staging.slot_dir}/snapshots"

    def table_dir(self, table: str) -> str:
        return f"{self.root}/{table_segment(table)}"

    def snapshot_dir(self, table: str, lsn: int) -> str:
        return f"{self.table_dir(table)}/{lsn_hex(lsn)}"

    def partial_dir(self, table: str, lsn: int) -> str:
        return f"{self.table_dir(table)}/{PARTIAL_PREFIX}{lsn_hex(lsn)}"

    def _list(self, path: str) -> list[pafs.FileInfo]:
        if not self.staging.exists(path):
            return []
        return self.staging.children(path)

    # -- published snapshots ---------------------------------------------------------------

    def snapshots(self, table: str) -> list[SnapshotRef]:
        """Published snapshots of ``table`` (with a manifest), oldest LSN first."""
        out = []
        for info in self._list(self.table_dir(table)):
            name = info.base_name
            if info.type == pafs.FileType.Directory and len(name) == 16 and not name.startswith("_"):
                if self.staging.exists(f"{info.path}/{MANIFEST}"):
                    out.append(SnapshotRef(table, int(name, 16), info.path))
        return sorted(out, key=lambda r: r.lsn)

    def latest(self, table: str) -> SnapshotRef | None:
        refs = self.snapshots(table)
        return refs[-1] if refs else None

    def tables(self) -> list[str]:
        """Every table with a snapshot directory or a request."""
        names = {segment_table(i.base_name) for i in self._list(self.root)
                 if i.type == pafs.FileType.Directory and not i.base_name.startswith("_")}
        names |= set(self.requests())
        return sorted(names)

    def manifest(self, ref: SnapshotRef) -> SnapshotManifest:
        path = f"{ref.path}/{MANIFEST}"
        return SnapshotManifest.from_json(read_text(self.staging, path), where=path)

    def verify(self, ref: SnapshotRef, manifest: SnapshotManifest) -> None:
        """Refuse (``StagingCorruptError`` naming snapshot and file) a snapshot whose chunk files are not what its
        manifest records, or that records nothing to check them by (staged before file records existed)."""
        label = snapshot_label(ref)
        way_out = f"stage it again: pglogical resync --table {ref.table}"
        try:
            records = {rel: FileRecord.from_dict(body) for rel, body in manifest.file_records.items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise StagingCorruptError(f"{label}: {MANIFEST} has an unreadable file record ({type(exc).__name__}: "
                                      f"{exc}); {way_out}", batch=label, file=MANIFEST) from exc
        if not records and manifest.files:
            raise StagingCorruptError(f"{label}: {MANIFEST} records no file sizes or hashes (staged by an older "
                                      f"release); {way_out}", batch=label, file=MANIFEST)
        for rel in manifest.files:
            if rel not in records:
                raise StagingCorruptError(f"{label}: {rel} has no file record in its {MANIFEST}; {way_out}",
                                          batch=label, file=rel)
        recorded = sum(records[rel].rows for rel in manifest.files)
        if recorded != manifest.rows:
            raise StagingCorruptError(f"{label}: {MANIFEST} counts {manifest.rows} rows, its file records {recorded}; "
                                      f"{way_out}", batch=label, file=MANIFEST)
        try:
            verify_files(self.fs, ref.path, label, records, ref.lsn, ref.lsn)
        except StagingCorruptError as exc:
            raise StagingCorruptError(f"{exc}; {way_out}", batch=exc.batch, file=exc.file) from exc

    def publish(self, directory: str, manifest: SnapshotManifest) -> None:
        write_text_atomic(self.staging, f"{directory}/{MANIFEST}", manifest.to_json())

    def leftovers(self, table: str) -> list[str]:
        """Unpublished directories of ``table``: partial ones and final ones without a manifest."""
        out = []
        for info in self._list(self.table_dir(table)):
            if info.type != pafs.FileType.Directory:
                continue
            if info.base_name.startswith(PARTIAL_PREFIX) or not self.staging.exists(f"{info.path}/{MANIFEST}"):
                out.append(info.path)
        return out

    # -- requests and progress -------------------------------------------------------------

    def _request_path(self, table: str) -> str:
        return f"{self.root}/{REQUESTS}/{table_segment(table)}.json"

    def _progress_path(self, table: str) -> str:
        return f"{self.root}/{PROGRESS}/{table_segment(table)}.json"

    def request(self, table: str, reason: str) -> dict[str, Any]:
        """Record that ``table`` needs a snapshot; until it is published the apply holds its changes."""
        existing = self.requests().get(table)
        if existing is not None:
            return existing
        body = {"table": table, "reason": reason, "request_id": f"{time.time_ns():x}",
                "requested_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        make_dirs(self.fs, f"{self.root}/{REQUESTS}")
        write_text_atomic(self.staging, self._request_path(table), json.dumps(body) + "\n")
        return body

    def requests(self) -> dict[str, dict[str, Any]]:
        """The open snapshot requests by table. A request closed between the listing and its read (a snapshot
        publishing its tables while a loader of another set plans, ``pglogical run``) is left out, as a listing a
        moment later leaves it out."""
        out = {}
        for info in self._list(f"{self.root}/{REQUESTS}"):
            if info.type == pafs.FileType.File and info.base_name.endswith(".json") and not info.base_name.startswith("_"):
                try:
                    body = json.loads(read_text(self.staging, info.path))
                except FileNotFoundError:
                    continue
                out[body["table"]] = body
        return out

    def close_request(self, table: str) -> None:
        for path in (self._request_path(table), self._progress_path(table)):
            if self.staging.exists(path):
                self.fs.delete_file(path)

    def write_progress(self, table: str, body: dict[str, Any]) -> None:
        make_dirs(self.fs, f"{self.root}/{PROGRESS}")
        write_text_atomic(self.staging, self._progress_path(table), json.dumps(body) + "\n")

    def progress(self, table: str) -> dict[str, Any] | None:
        path = self._progress_path(table)
        if not self.staging.exists(path):
            return None
        try:
            progress: dict[str, Any] = json.loads(read_text(self.staging, path))
            return progress
        except (ValueError, OSError):
            return None

    def sync_states(self, tables: list[str]) -> dict[str, dict[str, Any]]:
        """Per table: ``pending`` (requested, not copying), ``copying`` (with progress), ``staged``
        at LSN, or ``none`` (never snapshotted: the table only carries changes)."""
        requests = self.requests()
        out: dict[str, dict[str, Any]] = {}
        for table in tables:
            latest = self.latest(table)
            state: dict[str, Any]
            if table in requests:
                progress = self.progress(table)
                state = {"state": "copying" if progress else "pending", "reason": requests[table]["reason"]}
                if progress:
                    state["progress"] = progress
            elif latest is not None:
                state = {"state": "staged", "lsn": format_lsn(latest.lsn)}
            else:
                state = {"state": "none"}
            if latest is not None:
                state["latest_snapshot_lsn"] = format_lsn(latest.lsn)
            out[table] = state
        return out
