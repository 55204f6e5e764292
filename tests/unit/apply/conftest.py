"""Fixtures for the pure apply transforms: staged batches written by the test helper, read back as frames."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_pglogical.apply.batches import list_batches, read_changes
from tests.support.stage import BatchSpec, Col, Rel, write_batch

ITEMS = Rel("public", "items", (Col("id", pa.int64(), "bigint", True), Col("grp", pa.int64(), "bigint"),
                                Col("note", pa.string(), "text")))
ITEMS_FULL = Rel("public", "items", ITEMS.columns, replica_identity="f")
PAIRS = Rel("public", "pairs", (Col("a", pa.int64(), "bigint", True), Col("b", pa.string(), "text", True),
                                Col("v", pa.int64(), "bigint")))


@pytest.fixture
def changes_frame(spark, tmp_path):
    """Build the working frame of one table from a list of changes."""
    counter = iter(range(1000))

    def build(rel: Rel, changes: list):
        root = tmp_path / f"s{next(counter)}"
        write_batch(root, "slot", BatchSpec(0x1000, 0x2000, {rel: changes}))
        (batch,) = list_batches(str(root), "slot")
        return read_changes(spark, batch, rel.name)

    return build
