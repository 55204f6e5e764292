"""Read a slot's staging area: visible batches in LSN order, manifests, relation-cache state."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.exceptions import StagingError, format_lsn
from airflow_provider_pglogical.relation_shape import RelationShape
from airflow_provider_pglogical.staging.layout import (
    MANIFEST,
    RELATION_STATE,
    RELATIONS,
    TRUNCATES,
    StagingLayout,
    make_dirs,
)
from airflow_provider_pglogical.staging.manifest import (
    Manifest,
    read_manifest,
    read_relation_state,
    write_text_atomic,
)
from airflow_provider_pglogical.staging.verify import Observed, batch_label, naming_file, verify_batch

STATE_FILE = "relations.json"
NOTES_COLUMNS = ("old_value_notes", "new_value_notes")  # exactness notes; empty maps when a file lacks them


@dataclass(frozen=True)
class RelationColumn:
    name: str
    type_name: str | None
    is_identity: bool
    # attmissingval text ("{7}") of a column added with a DEFAULT: what older rows read on the source.
    missing: str | None = None


@dataclass(frozen=True)
class RelationInfo(RelationShape):
    """The latest staged shape of one source relation within a batch."""

    schema: str
    table: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]
    # A leaf partition: its ancestors (parent first) and partition constraint as staged; () / None otherwise.
    partition_ancestors: tuple[str, ...] = ()
    partition_constraint: str | None = None
    # The source table's primary key columns when staged (snapshots and batches staged by this version):
    # () for a table without one, None when not known (older staging).
    primary_key: tuple[str, ...] | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RelationInfo:
        """A relation as staged: a ``relations.parquet`` row, or a snapshot manifest's ``relation``."""
        return cls(schema=row["schema"], table=row["table"], replica_identity=row["replica_identity"],
                   columns=tuple(RelationColumn(c["name"], c.get("type_name"), bool(c["is_identity"]), c.get("missing"))
                                 for c in row["columns"]),
                   partition_ancestors=tuple(row.get("partition_ancestors") or ()),
                   partition_constraint=row.get("partition_constraint"),
                   primary_key=None if row.get("primary_key") is None else tuple(row["primary_key"]))

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True)
class TruncateEvent:
    """One staged TRUNCATE at (commit_lsn, tx_order); ``lsn``, ``xid`` and ``commit_time`` are its
    record's own position for targets that show truncates as changes (a change feed)."""

    commit_lsn: int
    tx_order: int
    relations: tuple[str, ...]
    cascade: bool
    restart_identity: bool
    lsn: int | None = None
    xid: int | None = None
    commit_time: datetime | None = None


@dataclass(frozen=True)
class BatchRef:
    """A visible batch: its LSN range and directory."""

    start_lsn: int
    end_lsn: int
    path: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]

    @property
    def label(self) -> str:
        """How errors name the batch: LSN range and directory."""
        return batch_label(self.start_lsn, self.end_lsn, self.path)


def python_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table.to_pylist()``, but UTC timestamps (commit times) come out without pyarrow's zone conversion, which
    imports pandas (a second of a run that only reads a batch's small files): read as naive UTC, then marked UTC."""
    utc = [i for i, f in enumerate(table.schema) if pa.types.is_timestamp(f.type) and f.type.tz in ("UTC", "+00:00")]
    for i in utc:
        field = table.schema.field(i)
        table = table.set_column(i, field.name, table.column(i).cast(pa.timestamp(field.type.unit)))
    rows: list[dict[str, Any]] = table.to_pylist()
    names = [table.schema.field(i).name for i in utc]
    for row in rows if names else ():
        for name in names:
            if row[name] is not None:
                row[name] = row[name].replace(tzinfo=UTC)
    return rows


class StagingReader:
    """Lists and reads the batches of one slot; only batches with a manifest exist."""

    def __init__(self, layout: StagingLayout) -> None:
        self.layout = layout

    @classmethod
    def from_uri(cls, uri: str, slot: str) -> StagingReader:
        return cls(StagingLayout.from_uri(uri, slot))

    def batches(self, *, check: bool = True) -> list[BatchRef]:
        """Visible batches in LSN order; with ``check``, raise StagingError on a gap or overlap.

        The first batch may start anywhere (older batches may have been pruned after apply);
        after it, each batch must start exactly where the previous one ended.
        """
        refs = [BatchRef(s, e, p) for s, e, p in self.layout.list_batch_dirs()
                if self.layout.exists(f"{p}/{MANIFEST}")]
        if check:
            for prev, cur in zip(refs, refs[1:], strict=False):
                if cur.start_lsn != prev.end_lsn:
                    kind = "overlap" if cur.start_lsn < prev.end_lsn else "gap"
                    raise StagingError(
                        f"staging for slot {self.layout.slot!r} has a {kind}: batch {prev.name} ends at "
                        f"{format_lsn(prev.end_lsn)} but the next batch {cur.name} starts at {format_lsn(cur.start_lsn)}")
        return refs

    def find(self, start_lsn: int) -> BatchRef | None:
        """The visible batch starting at ``start_lsn``, if any."""
        return next((b for b in self.batches(check=False) if b.start_lsn == start_lsn), None)

    def latest(self) -> BatchRef | None:
        refs = self.batches()
        return refs[-1] if refs else None

    def manifest(self, batch: BatchRef) -> Manifest:
        return read_manifest(self.layout, batch.path)

    def verify(self, batch: BatchRef, manifest: Manifest | None = None,
               observed: Mapping[str, Observed] | None = None) -> None:
        """Refuse (``StagingCorruptError`` naming batch and file) a batch whose files are not what its
        manifest records: missing, another size, hash, row count or commit-LSN range (``staging/verify.py``).
        ``observed``: files the executors read and hashed, judged from that instead of read here."""
        verify_batch(self.layout.fs, batch.path, batch.start_lsn, batch.end_lsn, manifest or self.manifest(batch),
                     observed)

    # -- relation-cache state --------------------------------------------------------------

    def relation_state(self, upto_lsn: int | None = None) -> Any | None:
        """The decoder's relation cache as of the last visible batch ending at or before
        ``upto_lsn`` (default: the latest), or the slot-level copy, or None before any batch."""
        for batch in reversed(self.batches(check=False)):
            if upto_lsn is not None and batch.end_lsn > upto_lsn:
                continue
            path = f"{batch.path}/{RELATION_STATE}"
            if self.layout.exists(path):
                return read_relation_state(self.layout, path)[1]
        copy = f"{self.layout.state_dir}/{STATE_FILE}"
        if self.layout.exists(copy):
            end, state = read_relation_state(self.layout, copy)
            if upto_lsn is None or end <= upto_lsn:
                return state
        return None

    def save_state_copy(self, state: Any, end_lsn: int) -> None:
        """Keep a slot-level copy so numbering survives pruning of every batch."""
        make_dirs(self.layout.fs, self.layout.state_dir)
        body = {"end_lsn_int": end_lsn, "end_lsn": format_lsn(end_lsn), "relations": state}
        write_text_atomic(self.layout, f"{self.layout.state_dir}/{STATE_FILE}", json.dumps(body, ensure_ascii=False))

    # -- data ------------------------------------------------------------------------------

    def read_file(self, batch: BatchRef, relative: str) -> pa.Table:
        """One staged file; a read error names the file and the batch (``StagingCorruptError``).

        Read as one Parquet file, not through ``pq.read_table``: its dataset machinery imports pandas (about a
        second), which a run reading any staged file (small files, a table's row changes) never needs otherwise.
        ``pre_buffer`` as ``pq.read_table`` has it (``ParquetFile``'s default before pyarrow 26 is off): on an object
        store the column chunks come in coalesced ranged reads, not one request per chunk."""
        with naming_file(batch.label, relative), pq.ParquetFile(f"{batch.path}/{relative}", filesystem=self.layout.fs,
                                                                pre_buffer=True) as parquet:
            return parquet.read()

    def read_schema(self, batch: BatchRef, relative: str) -> pa.Schema:
        """A staged file's Arrow schema (its footer only)."""
        return pq.read_schema(f"{batch.path}/{relative}", filesystem=self.layout.fs)

    def footer(self, batch: BatchRef, relative: str) -> tuple[pa.Schema, int]:
        """A staged file's Arrow schema and row-group count (its footer only)."""
        found = pq.ParquetFile(f"{batch.path}/{relative}", filesystem=self.layout.fs)
        return found.schema_arrow, found.metadata.num_row_groups

    def _read_small(self, batch: BatchRef, name: str) -> list[dict[str, Any]] | None:
        path = f"{batch.path}/{name}"
        if not self.layout.exists(path):
            return None
        return python_rows(self.read_file(batch, name))

    def relation_versions(self, batch: BatchRef) -> dict[str, list[tuple[int, RelationInfo]]]:
        """Every schema version per ``schema.table`` seen in the batch, as (first LSN, shape), oldest first."""
        versions: dict[str, list[tuple[int, int, RelationInfo]]] = {}
        for row in self._read_small(batch, RELATIONS) or []:
            info = RelationInfo.from_row(row)
            versions.setdefault(info.qualified_name, []).append(
                (int(row["first_lsn"]), int(row["schema_version"]), info))
        # A relid dropped and recreated restarts at version 1: the first LSN orders them.
        return {name: [(lsn, info) for lsn, _, info in sorted(vs, key=lambda v: (v[0], v[1]))]
                for name, vs in versions.items()}

    def relations(self, batch: BatchRef) -> dict[str, RelationInfo]:
        """Latest schema version per ``schema.table`` seen in the batch."""
        return {name: vs[-1][1] for name, vs in self.relation_versions(batch).items()}

    def truncates(self, batch: BatchRef, manifest: Manifest | None = None) -> list[TruncateEvent]:
        """The batch's TRUNCATE events in commit order (none without reading when the manifest counts none)."""
        if not (manifest or self.manifest(batch)).truncates:
            return []
        return [TruncateEvent(int(r["commit_lsn"]), int(r["tx_order"]), tuple(r["relations"]),
                              bool(r["cascade"]), bool(r["restart_identity"]), r.get("lsn"), r.get("xid"),
                              r.get("commit_time"))
                for r in self._read_small(batch, TRUNCATES) or []]

    def has_value_notes(self, batch: BatchRef, files: Sequence[str]) -> bool:
        """Whether any staged image in ``files`` (a table's files of ``batch``) carries an exactness note.

        Read from the two small notes columns only: almost every batch has none, and then a reader
        can skip carrying notes through altogether.
        """
        for rel in files:
            with naming_file(batch.label, rel):
                parquet = pq.ParquetFile(f"{batch.path}/{rel}", filesystem=self.layout.fs)
                present = [c for c in NOTES_COLUMNS if c in parquet.schema_arrow.names]
                if present and any(len(chunk.keys) for column in parquet.read(columns=present).columns
                                   for chunk in column.chunks):
                    return True
        return False

    def has_unchanged_toast(self, batch: BatchRef, files: Sequence[str]) -> bool:
        """Whether any staged change in ``files`` (a table's files of ``batch``) lists an unchanged-TOAST column.

        Read from that list column only: a table-batch without one needs no TOAST refill from old images.
        """
        import pyarrow.compute as pc  # only the apply asks

        for rel in files:
            with naming_file(batch.label, rel):
                column = pq.read_table(f"{batch.path}/{rel}", filesystem=self.layout.fs,
                                       columns=["new_unchanged_toast"]).column(0)
                if len(column) and (pc.max(pc.list_value_length(column)).as_py() or 0) > 0:
                    return True
        return False

    def keys_never_repeat(self, batch: BatchRef, files: Sequence[str], key: Sequence[str], *,
                          full_identity: bool = False) -> bool:
        """Whether no value of ``key`` occurs in two staged changes in ``files`` (a table's files of ``batch``).

        Then compaction has nothing to net (``apply/transforms.single_event_net`` gives its result
        without a shuffle). Read from ``op`` and the key fields of both images only (Arrow, a fraction
        of a second per million changes). A change counts each distinct key it names once (an UPDATE
        that moves a row names two). Which images exist follows from ``op`` (INSERT/UPDATE have a new
        image, DELETE an old one; an UPDATE has an old one when its old key is there — its identity
        columns are NOT NULL — or always under REPLICA IDENTITY FULL, ``full_identity``).
        Conservative: a null key field in an image (an unchanged-TOAST key, a nullable column of a
        FULL identity), a key type Arrow cannot group or groups otherwise than PostgreSQL compares
        (floats), or anything unexpected answers False, and the batch is compacted as always.
        Actions, row filters and truncates only drop or re-label changes, never add keys, so the
        answer holds after them.
        """
        import pyarrow.compute as pc  # only the apply asks

        names = [f"k{i}" for i in range(len(key))]
        parts: list[pa.Table] = []
        try:
            for rel in files:
                path = f"{batch.path}/{rel}"
                schema = pq.ParquetFile(path, filesystem=self.layout.fs).schema_arrow
                images = [schema.field(image).type for image in ("old", "new")]
                if any(k not in image.names for image in images for k in key):
                    return False
                # Arrow groups floats by their bits; PostgreSQL's = holds for -0.0 and 0.0 (Spark normalises both).
                if any(pa.types.is_floating(image.field(k).type) for image in images for k in key):
                    return False
                t = pq.read_table(path, filesystem=self.layout.fs,
                                  columns=["op", *[f"{image}.{k}" for image in ("old", "new") for k in key]])
                op = t.column(0)
                old_cols, new_cols = t.columns[1:1 + len(key)], t.columns[1 + len(key):]
                is_update = pc.equal(op, "U")
                has_new = pc.or_(pc.equal(op, "I"), is_update)
                has_old = pc.or_(pc.equal(op, "D"),
                                 is_update if full_identity else pc.and_(is_update, pc.is_valid(old_cols[0])))
                for cols, present in ((old_cols, has_old), (new_cols, has_new)):
                    for c in cols:
                        if pc.any(pc.and_(present, pc.is_null(c))).as_py():
                            return False
                same = has_old
                for o, n in zip(old_cols, new_cols, strict=True):
                    same = pc.and_(same, pc.fill_null(pc.equal(o, n), False))
                parts.append(pa.table(old_cols, names=names).filter(has_old))
                parts.append(pa.table(new_cols, names=names).filter(pc.and_(has_new, pc.invert(same))))
            keys = pa.concat_tables(parts) if parts else None
            if keys is None or keys.num_rows == 0:
                return True
            return bool(keys.group_by(names).aggregate([]).num_rows == keys.num_rows)
        except (pa.ArrowException, KeyError, ValueError):
            return False

    def uri(self, batch: BatchRef) -> str:
        """The batch directory as a URI for Spark (``s3://…`` stays ``s3://…``)."""
        return self.layout.uri_for(batch.path)

    def read_table_changes(self, batch: BatchRef, qualified_name: str) -> list[pa.Table]:
        """The row-change files of one table in a batch, one Arrow table per schema version."""
        entry = self.manifest(batch).tables.get(qualified_name)
        if entry is None:
            return []
        return [self.read_file(batch, f) for f in entry["files"]]
