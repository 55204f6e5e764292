"""Check staged files against their manifest before anything uses them.

A manifest records every file of a batch (or snapshot) with its size, row count, SHA-256 and commit-LSN
range (``staging.manifest.FileRecord``). A file swapped in from another batch, truncated, deleted or
rewritten, or a manifest edited by hand, is refused here with a ``StagingCorruptError`` naming the batch
and the file, before a target sees a row of it. Costs one read of each file (SHA-256 runs at about
1 GB/s) and one footer read: small next to applying the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_provider_pglogical.exceptions import StagingCorruptError, format_lsn
from airflow_provider_pglogical.staging.layout import MANIFEST, MESSAGES, RELATIONS, TRANSACTIONS, TRUNCATES
from airflow_provider_pglogical.staging.manifest import FileRecord, Manifest, hash_file
from airflow_provider_pglogical.text import first_line

COMMIT_LSN = "commit_lsn"


def batch_label(start_lsn: int, end_lsn: int, directory: str) -> str:
    """How errors name a staged batch: its LSN range and its directory's name."""
    return f"staged batch {format_lsn(start_lsn)}-{format_lsn(end_lsn)} ({directory.rsplit('/', 1)[-1]})"


@contextmanager
def naming_file(label: str, relative: str) -> Iterator[None]:
    """Turn a Parquet/IO error while reading ``relative`` into one line naming the file and its batch."""
    try:
        yield
    except (pa.ArrowException, OSError) as exc:
        reason = first_line(str(exc), type(exc).__name__)
        raise StagingCorruptError(f"{label}: {relative} cannot be read as Parquet: {reason}",
                                  batch=label, file=relative) from exc


@dataclass(frozen=True)
class Observed:
    """What one staged file was found to be where it was read (an executor, for staging the driver does not
    read itself): ``error`` is set instead when it could not be read, e.g. ``is missing``."""

    bytes: int = 0
    sha256: str = ""
    rows: int = 0
    commit_lsns: tuple[int | None, int | None] | None = None  # ``_commit_lsn_range`` of its footer
    error: str | None = None


def observe_file(fs: pafs.FileSystem, path: str) -> Observed:
    """``path`` hashed and its footer read: what ``verify_files`` compares with the file's record."""
    try:
        size, digest = hash_file(fs, path)
    except FileNotFoundError:
        return Observed(error="is missing")
    try:
        metadata = pq.ParquetFile(path, filesystem=fs).metadata
    except (pa.ArrowException, OSError) as exc:
        reason = first_line(str(exc), type(exc).__name__)
        return Observed(size, digest, error=f"cannot be read as Parquet: {reason}")
    return Observed(size, digest, metadata.num_rows, _commit_lsn_range(metadata))


def verify_batch(fs: pafs.FileSystem, directory: str, start_lsn: int, end_lsn: int, manifest: Manifest,
                 observed: Mapping[str, Observed] | None = None) -> None:
    """Every file the manifest of the batch at ``directory`` (named ``<start>-<end>``) lists is there and is
    what was written; the manifest agrees with its directory's range and with itself. ``observed``: files
    already read elsewhere (by the executors), judged from what was found instead of being read here."""
    label = batch_label(start_lsn, end_lsn, directory)

    def refuse(message: str, file: str | None = MANIFEST) -> StagingCorruptError:
        return StagingCorruptError(f"{label}: {message}", batch=label, file=file)

    if (manifest.start_lsn_int, manifest.end_lsn_int) != (start_lsn, end_lsn):
        raise refuse(f"{MANIFEST} gives the range {manifest.start_lsn}-{manifest.end_lsn}, its directory "
                     f"{format_lsn(start_lsn)}-{format_lsn(end_lsn)}")
    try:
        records = manifest.file_records
    except (KeyError, TypeError, ValueError) as exc:
        raise refuse(f"{MANIFEST} has an unreadable file record ({type(exc).__name__}: {exc})") from exc
    # file → (what the manifest counts, its count): relations.parquet is not counted
    counts: dict[str, tuple[str, int | None]] = {TRANSACTIONS: ("transactions", manifest.transactions),
                                                 MESSAGES: ("messages", manifest.messages),
                                                 RELATIONS: ("relations", None)}
    if manifest.truncates:
        counts[TRUNCATES] = ("truncates", manifest.truncates)
    for name, entry in sorted(manifest.tables.items()):
        listed = [str(f) for f in entry.get("files", ())]
        for rel in listed:
            if rel not in records:
                raise refuse(f"{rel} of {name} has no file record in its {MANIFEST}", rel)
        recorded = sum(records[rel].rows for rel in listed)
        if recorded != int(entry["rows"]):
            raise refuse(f"{MANIFEST} counts {entry['rows']} row changes of {name}, its file records {recorded}")
    for rel, (what, count) in counts.items():
        if rel not in records:
            raise refuse(f"{rel} has no file record in its {MANIFEST}", rel)
        if count is not None and records[rel].rows != count:
            raise refuse(f"{MANIFEST} counts {count} {what}, the file record of {rel} {records[rel].rows}")
    verify_files(fs, directory, label, records, start_lsn, end_lsn, observed)


def verify_files(fs: pafs.FileSystem, directory: str, label: str, records: Mapping[str, FileRecord],
                 start_lsn: int, end_lsn: int, observed: Mapping[str, Observed] | None = None) -> None:
    """Each recorded file exists with its size, hash, footer row count and commit-LSN range, and that range
    lies within ``[start_lsn, end_lsn]``. Sizes first (one listing call per file, no data read), so a
    missing or cut file is found before any hashing. Files in ``observed`` are judged from it, unread."""
    def refuse(rel: str, message: str) -> StagingCorruptError:
        return StagingCorruptError(f"{label}: {rel} {message}", batch=label, file=rel)

    for rel, record in sorted(records.items()):
        if record.min_commit_lsn is not None and record.max_commit_lsn is not None and not (
                start_lsn <= record.min_commit_lsn <= record.max_commit_lsn <= end_lsn):
            raise refuse(rel, f"is recorded with commit LSNs {format_lsn(record.min_commit_lsn)}-"
                              f"{format_lsn(record.max_commit_lsn)}, outside {format_lsn(start_lsn)}-"
                              f"{format_lsn(end_lsn)}")
    seen = dict(observed or {})
    for rel, observation in sorted(seen.items()):
        if rel in records:
            _judge(label, rel, records[rel], observation)
    records = {rel: record for rel, record in records.items() if rel not in seen}
    infos = fs.get_file_info([f"{directory}/{rel}" for rel in sorted(records)])
    for (rel, record), info in zip(sorted(records.items()), infos, strict=True):
        if info.type == pafs.FileType.NotFound:
            raise refuse(rel, "is missing")
        if info.size != record.bytes:
            raise refuse(rel, f"has {info.size} bytes, its manifest records {record.bytes}")
    for rel, record in sorted(records.items()):
        path = f"{directory}/{rel}"
        with naming_file(label, rel):
            size, digest = hash_file(fs, path)
        if size != record.bytes or digest != record.sha256:
            raise refuse(rel, f"has SHA-256 {digest[:16]}…, its manifest records {record.sha256[:16]}… "
                              "(the file was changed or replaced after staging)")
        with naming_file(label, rel):
            metadata = pq.ParquetFile(path, filesystem=fs).metadata
        if metadata.num_rows != record.rows:
            raise refuse(rel, f"holds {metadata.num_rows} rows, its manifest records {record.rows}")
        found = _commit_lsn_range(metadata)
        if found is not None and found != (record.min_commit_lsn, record.max_commit_lsn):
            raise refuse(rel, f"holds commit LSNs {_range_text(found)}, its manifest records "
                              f"{_range_text((record.min_commit_lsn, record.max_commit_lsn))}")


def _judge(label: str, rel: str, record: FileRecord, found: Observed) -> None:
    """``verify_files``' checks of one file from what was observed of it (range, size, hash, rows, LSNs)."""
    def refuse(message: str) -> StagingCorruptError:
        return StagingCorruptError(f"{label}: {rel} {message}", batch=label, file=rel)

    if found.error is not None and not found.sha256:
        raise refuse(found.error)
    if found.bytes != record.bytes:
        raise refuse(f"has {found.bytes} bytes, its manifest records {record.bytes}")
    if found.sha256 != record.sha256:
        raise refuse(f"has SHA-256 {found.sha256[:16]}…, its manifest records {record.sha256[:16]}… "
                     "(the file was changed or replaced after staging)")
    if found.error is not None:
        raise refuse(found.error)
    if found.rows != record.rows:
        raise refuse(f"holds {found.rows} rows, its manifest records {record.rows}")
    if found.commit_lsns is not None and found.commit_lsns != (record.min_commit_lsn, record.max_commit_lsn):
        raise refuse(f"holds commit LSNs {_range_text(found.commit_lsns)}, its manifest records "
                     f"{_range_text((record.min_commit_lsn, record.max_commit_lsn))}")


def _commit_lsn_range(metadata: pq.FileMetaData) -> tuple[int | None, int | None] | None:
    """The ``commit_lsn`` column's (min, max) from the footer statistics, (None, None) when it holds no
    value, or None when the file has no such column or a row group lacks statistics (nothing to compare)."""
    low: int | None = None
    high: int | None = None
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        column = next((group.column(c) for c in range(group.num_columns)
                       if group.column(c).path_in_schema == COMMIT_LSN), None)
        if column is None:
            return None
        if group.num_rows == 0:
            continue
        stats = column.statistics
        if stats is None:
            return None
        if stats.has_null_count and stats.null_count == group.num_rows:
            continue
        if not stats.has_min_max:
            return None
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    return low, high


def _range_text(lsns: tuple[int | None, int | None]) -> str:
    low, high = lsns
    return "none" if low is None or high is None else f"{format_lsn(low)}-{format_lsn(high)}"
