"""The batch manifest (``_manifest.json``): its fields and its atomic write, which publishes a batch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs

from airflow_provider_pglogical.exceptions import StagingError, format_lsn
from airflow_provider_pglogical.staging.layout import MANIFEST, RELATION_STATE, StagingLayout

# 2: ``files`` records every file's size, rows, SHA-256 and commit-LSN range (the apply verifies them).
FORMAT_VERSION = 2
HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileRecord:
    """What a staged file must be: its size, row count, content hash and the range of its ``commit_lsn``
    column (None when the file has none, or no non-null value)."""

    bytes: int
    rows: int
    sha256: str
    min_commit_lsn: int | None = None
    max_commit_lsn: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> FileRecord:
        return cls(bytes=int(body["bytes"]), rows=int(body["rows"]), sha256=str(body["sha256"]),
                   min_commit_lsn=None if body.get("min_commit_lsn") is None else int(body["min_commit_lsn"]),
                   max_commit_lsn=None if body.get("max_commit_lsn") is None else int(body["max_commit_lsn"]))


def hash_file(fs: pafs.FileSystem, path: str) -> tuple[int, str]:
    """``(size, SHA-256 hex digest)`` of a file, read once in 1 MiB pieces (about 1 GB/s with SHA-NI)."""
    digest = hashlib.sha256()
    size = 0
    with fs.open_input_stream(path) as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


@dataclass
class Manifest:
    """What a visible batch holds; the JSON keys are the staging-format contract."""

    slot: str
    publication: str
    start_lsn_int: int
    end_lsn_int: int
    transactions: int = 0
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    truncates: int = 0
    messages: int = 0
    bytes: int = 0
    server_version: int = 0
    proto_version: int = 0
    created_at: str = ""
    format_version: int = FORMAT_VERSION
    # relative path → FileRecord.to_dict(): every file of the batch (tables, transactions, messages, relations…)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def file_records(self) -> dict[str, FileRecord]:
        return {path: FileRecord.from_dict(body) for path, body in self.files.items()}

    @property
    def start_lsn(self) -> str:
        return format_lsn(self.start_lsn_int)

    @property
    def end_lsn(self) -> str:
        return format_lsn(self.end_lsn_int)

    @property
    def changes(self) -> int:
        return sum(int(t["rows"]) for t in self.tables.values())

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        return {"format_version": self.format_version, "slot": self.slot, "publication": self.publication,
                "start_lsn": self.start_lsn, "end_lsn": self.end_lsn,
                **{k: v for k, v in body.items() if k not in ("format_version", "slot", "publication")},
                "created_at": self.created_at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, *, where: str = "") -> Manifest:
        try:
            body = json.loads(text)
            version = int(body.get("format_version", 0))
            if version != FORMAT_VERSION:
                raise StagingError(f"manifest {where} has format_version {version}; this reader understands "
                                   f"{FORMAT_VERSION} (docs/staging-format.md)")
            known = {f for f in cls.__dataclass_fields__}
            # readers ignore unknown keys (forward compatibility within a format version)
            return cls(**{k: v for k, v in body.items() if k in known})
        except StagingError:
            raise
        except (ValueError, TypeError, KeyError) as exc:
            raise StagingError(f"unreadable manifest {where}: {exc}") from exc


def write_text_atomic(layout: StagingLayout, path: str, text: str) -> None:
    """Write ``path`` so readers see either nothing or the whole file.

    Local: write a temp sibling (``_``-prefixed, so globs skip it) and rename it over the target
    (``os.replace`` semantics). Object stores (S3, GCS, Azure): one PUT of a small object is
    atomic, and a rename would be a non-atomic copy, so the object is written directly.
    """
    data = text.encode("utf-8")
    if layout.is_local:
        directory, name = path.rsplit("/", 1)
        tmp = f"{directory}/_tmp-{name}"
        with layout.fs.open_output_stream(tmp) as out:
            out.write(data)
        layout.fs.move(tmp, path)
    else:
        with layout.fs.open_output_stream(path) as out:
            out.write(data)


def read_text(layout: StagingLayout, path: str) -> str:
    with layout.fs.open_input_stream(path) as f:
        value: str = f.read().decode("utf-8")
        return value


def write_manifest(layout: StagingLayout, batch_dir: str, manifest: Manifest) -> None:
    """Publish the batch: after this returns, readers see it (and only now)."""
    write_text_atomic(layout, f"{batch_dir}/{MANIFEST}", manifest.to_json())


def read_manifest(layout: StagingLayout, batch_dir: str) -> Manifest:
    path = f"{batch_dir}/{MANIFEST}"
    try:
        text = read_text(layout, path)
    except (FileNotFoundError, OSError) as exc:
        raise StagingError(f"batch {batch_dir} has no readable manifest: {exc}") from exc
    return Manifest.from_json(text, where=path)


def write_relation_state(layout: StagingLayout, batch_dir: str, state: Any, end_lsn: int) -> None:
    """Persist the decoder's relation cache as of ``end_lsn`` inside the batch (before its
    manifest, so a visible batch always carries the state the next batch must start from)."""
    body = {"end_lsn_int": end_lsn, "end_lsn": format_lsn(end_lsn), "relations": state}
    write_text_atomic(layout, f"{batch_dir}/{RELATION_STATE}", json.dumps(body, ensure_ascii=False))


def read_relation_state(layout: StagingLayout, path: str) -> tuple[int, Any]:
    try:
        body = json.loads(read_text(layout, path))
        return int(body["end_lsn_int"]), body["relations"]
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise StagingError(f"unreadable relation state {path}: {exc}") from exc
