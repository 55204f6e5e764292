"""Where a slot's staged batches live: filesystem resolution, directory names, file paths."""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import quote, unquote

import pyarrow.fs as pafs

from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.lsn import lsn_hex
from airflow_provider_pglogical.staging.credentials import environment_filesystem, registered_filesystem

MANIFEST = "_manifest.json"
RELATION_STATE = "_relation_state.json"
TRUNCATES = "truncates.parquet"
RELATIONS = "relations.parquet"
MESSAGES = "messages.parquet"
TRANSACTIONS = "transactions.parquet"
# Spark, Hive and pyarrow.dataset skip names starting with "_" or ".", so neither a partial
# batch nor a manifest temp file is ever picked up by a glob over batches/*/tables/...
PARTIAL_PREFIX = "_partial-"
BATCH_NAME_RE = re.compile(r"([0-9A-F]{16})-([0-9A-F]{16})")


def quote_name(name: str) -> str:
    """URL-quote a schema/table/slot name for a path segment; '.' too, so ``a.b``+``c`` and
    ``a``+``b.c`` cannot collide in ``<schema>.<table>``."""
    return quote(name, safe="").replace(".", "%2E")


def unquote_name(segment: str) -> str:
    return unquote(segment)


def is_local_filesystem(fs: pafs.FileSystem | None) -> bool:
    """Whether paths of ``fs`` are local paths (None: a path given without a filesystem is local)."""
    return fs is None or isinstance(fs, pafs.LocalFileSystem)


def make_dirs(fs: pafs.FileSystem, path: str) -> None:
    """The directory ``path`` and its parents, where ``fs`` has directories. S3 and GCS have none: an object's name
    makes its prefix, which listings and ``get_file_info`` find, while pyarrow's ``create_dir`` there writes a marker
    object per level (after a bucket check, and on GCS a look-up per level) before every file written, and nothing
    is read from a marker. An Azure account keeps them: one with a hierarchical namespace has real directories, and
    its rename (``move_file``) needs the destination's parent (``RenameDestinationParentPathNotFound``), while
    pyarrow does not say which kind of account it reaches."""
    if not isinstance(fs, (pafs.S3FileSystem, pafs.GcsFileSystem)):
        fs.create_dir(path, recursive=True)


def resolve_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and root path for a URI (``s3://``, ``gs://``, ``abfs://``, ``file://``…) or a local
    path; credentials registered for the URI's root (``staging/credentials.py``) come first, then GCS and Azure
    variables of the environment, else pyarrow finds its own."""
    found = registered_filesystem(uri) or environment_filesystem(uri)
    if found is not None:
        return found
    if "://" in uri:
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(uri).rstrip("/")


def move_file(fs: pafs.FileSystem, src: str, dst: str) -> None:
    """Move one file. An object store has no rename: S3's and GCS's pyarrow ``move`` copy and delete, an Azure
    account without a hierarchical namespace (and Azurite) has no ``move`` at all, so there the file is copied and
    the original deleted, as the others do."""
    try:
        fs.move(src, dst)
    except NotImplementedError:
        fs.copy_file(src, dst)
        fs.delete_file(src)


def parse_batch_name(name: str) -> tuple[int, int] | None:
    """``(start_lsn, end_lsn)`` of a batch directory name, or None for anything else."""
    m = BATCH_NAME_RE.fullmatch(name)
    return (int(m.group(1), 16), int(m.group(2), 16)) if m else None


def table_file(schema: str, table: str, version: int) -> str:
    """Path of a table's row-change file relative to its batch directory."""
    return f"tables/{quote_name(schema)}.{quote_name(table)}/v{version}.parquet"


@dataclass(frozen=True)
class StagingLayout:
    """Paths of one slot's staging area on a pyarrow filesystem."""

    fs: pafs.FileSystem
    root: str
    slot: str
    root_uri: str = ""  # the root as the user gave it (``s3://…``): what Spark and other readers open

    @classmethod
    def from_uri(cls, uri: str, slot: str) -> StagingLayout:
        fs, root = resolve_filesystem(uri)
        return cls(fs, root, slot, uri.rstrip("/") if "://" in uri else root)

    def uri_for(self, path: str) -> str:
        """A path of this filesystem as a URI other readers (Spark) understand."""
        if not self.root_uri or self.root_uri == self.root or not path.startswith(self.root):
            return path
        return self.root_uri + path[len(self.root):]

    @property
    def is_local(self) -> bool:
        return is_local_filesystem(self.fs)

    @property
    def slot_dir(self) -> str:
        return f"{self.root}/{quote_name(self.slot)}"

    @property
    def batches_dir(self) -> str:
        return f"{self.slot_dir}/batches"

    @property
    def state_dir(self) -> str:
        return f"{self.slot_dir}/state"

    def batch_dir(self, start_lsn: int, end_lsn: int) -> str:
        return f"{self.batches_dir}/{lsn_hex(start_lsn)}-{lsn_hex(end_lsn)}"

    def partial_dir(self, start_lsn: int) -> str:
        """Where a batch starting at ``start_lsn`` is written before its end LSN is known."""
        return f"{self.batches_dir}/{PARTIAL_PREFIX}{lsn_hex(start_lsn)}"

    def exists(self, path: str) -> bool:
        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def files(self, path: str, *, recursive: bool = False) -> list[pafs.FileInfo]:
        """The files under ``path`` (none when it does not exist): one listing, no existence check before it that
        the path could stop passing before the listing runs."""
        selector = pafs.FileSelector(path, recursive=recursive, allow_not_found=True)
        return [info for info in self.fs.get_file_info(selector) if info.type == pafs.FileType.File]

    def children(self, path: str) -> list[pafs.FileInfo]:
        """The files and directories directly under ``path``.

        pyarrow's GCS filesystem lists only the objects under a prefix when not recursing, so a directory there is
        one only if it has a marker object (``create_dir``), which files written by path never get: on GCS the
        children are taken from the recursive listing, each deeper object standing for its first directory. A path
        that does not exist (any more) has none."""
        if not isinstance(self.fs, pafs.GcsFileSystem):
            return list(self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))
        out: dict[str, pafs.FileInfo] = {}
        # A directory there is gone with its last object: one a caller just saw may be gone by this listing.
        for info in self.fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True)):
            name = info.path[len(path) + 1:]
            if "/" in name:
                child = f"{path}/{name.split('/', 1)[0]}"
                out.setdefault(child, pafs.FileInfo(child, pafs.FileType.Directory))
            else:
                out[info.path] = info
        return list(out.values())

    def list_batch_dirs(self) -> list[tuple[int, int, str]]:
        """Every ``<start>-<end>`` directory (visible or not), in LSN order."""
        if not self.exists(self.batches_dir):
            return []
        out = []
        for info in self.children(self.batches_dir):
            parsed = parse_batch_name(info.base_name) if info.type == pafs.FileType.Directory else None
            if parsed:
                out.append((parsed[0], parsed[1], info.path))
        return sorted(out)

    def leftovers_for(self, start_lsn: int) -> list[str]:
        """Manifest-less directories of a batch starting at ``start_lsn``: a crashed earlier
        attempt (its partial directory, or a final directory whose manifest was never written)."""
        paths = [p for s, _e, p in self.list_batch_dirs() if s == start_lsn and not self.exists(f"{p}/{MANIFEST}")]
        if self.exists(self.partial_dir(start_lsn)):
            paths.append(self.partial_dir(start_lsn))
        return paths

    def delete_dir(self, path: str) -> None:
        """Delete the directory ``path`` and everything under it; a path already gone is deleted.

        pyarrow's GCS ``delete_dir`` deletes the objects under ``path``, then the marker object of ``path`` itself,
        which staging never writes (``make_dirs``): that last step raises ``FileNotFoundError`` after the work is
        done, and a path with no object left raises a plain ``OSError``. Either is success when nothing is left at
        ``path``; anything still there (a store refusing a delete) is the error it was."""
        try:
            self.fs.delete_dir(path)
        except OSError:
            if self.exists(path):
                raise

    def file_size(self, path: str) -> int:
        return self.fs.get_file_info(path).size or 0

    def move_tree(self, src: str, dst: str, expected: Collection[str]) -> None:
        """Move a finished partial directory holding the files ``expected`` (paths relative to ``src``) to its
        final name (before the manifest exists).

        Local filesystems rename the directory in one step. Object stores have no directory rename: the files a
        listing of ``src`` returns are moved one by one, which is safe because the batch stays invisible until
        its manifest is written after the move. A store's listing may lag its writes or come back short, so
        every expected file must be listed before anything moves: else a ``StagingError``, nothing moved or
        deleted (deleting ``src`` after a short move would delete what was not moved, and the manifest written
        next would name files the batch lacks). Listed files beyond ``expected`` move along, as a directory
        rename moves them; readers open only the files a manifest names.
        """
        if self.is_local:
            self.fs.move(src, dst)
            return
        listed = self.files(src, recursive=True)
        missing = sorted(set(expected) - {info.path[len(src) + 1:] for info in listed})
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise StagingError(
                f"{src}: the store's listing lacks {len(missing)} of the {len(expected)} file(s) written ({shown}); "
                "nothing was moved or published: run again, the next run deletes this unpublished directory "
                "and writes it anew")
        made: set[str] = set()
        for info in listed:
            target = dst + info.path[len(src):]
            parent = target.rsplit("/", 1)[0]
            if parent not in made:  # each directory once, not once per file
                make_dirs(self.fs, parent)
                made.add(parent)
            move_file(self.fs, info.path, target)
        # A store holds ``src`` after its last file moved only if a marker was left there (pyarrow's Azure leaves
        # one when it deletes a file); GCS holds nothing there, and ``delete_dir`` copes with a path gone meanwhile.
        if self.exists(src):
            self.delete_dir(src)
