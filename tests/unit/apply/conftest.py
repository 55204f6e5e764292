"""Fixtures for the pure apply transforms: staged batches written by the test helper, read back as frames."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.apply.batches import list_batches, read_changes
from tests.support.stage import ITEMS, ITEMS_FULL, PAIRS, BatchSpec, Rel, write_batch

# The relations live in tests/support/stage.py (shared strategies use them); re-exported for the tests here.
__all__ = ["ITEMS", "ITEMS_FULL", "PAIRS", "changes_frame"]


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
