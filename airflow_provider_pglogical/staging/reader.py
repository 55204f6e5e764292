"""Read a slot's staging area: visible batches in LSN order, manifests, relation-cache state."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.exceptions import StagingError, format_lsn
from airflow_provider_pglogical.staging.layout import MANIFEST, RELATION_STATE, StagingLayout
from airflow_provider_pglogical.staging.manifest import (
    Manifest,
    read_manifest,
    read_relation_state,
    write_text_atomic,
)

STATE_FILE = "relations.json"


@dataclass(frozen=True)
class BatchRef:
    """A visible batch: its LSN range and directory."""

    start_lsn: int
    end_lsn: int
    path: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]


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
        self.layout.fs.create_dir(self.layout.state_dir, recursive=True)
        body = {"end_lsn_int": end_lsn, "end_lsn": format_lsn(end_lsn), "relations": state}
        write_text_atomic(self.layout, f"{self.layout.state_dir}/{STATE_FILE}", json.dumps(body, ensure_ascii=False))

    # -- data ------------------------------------------------------------------------------

    def read_file(self, batch: BatchRef, relative: str) -> pa.Table:
        return pq.read_table(f"{batch.path}/{relative}", filesystem=self.layout.fs)

    def read_table_changes(self, batch: BatchRef, qualified_name: str) -> list[pa.Table]:
        """The row-change files of one table in a batch, one Arrow table per schema version."""
        entry = self.manifest(batch).tables.get(qualified_name)
        if entry is None:
            return []
        return [self.read_file(batch, f) for f in entry["files"]]
