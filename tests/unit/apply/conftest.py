"""Fixtures for the pure apply transforms: staged batches written by the test helper, read back as frames."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.apply.batches import list_batches, read_changes
from tests.support.sparkconf import session_conf
from tests.support.stage import ITEMS, ITEMS_FULL, PAIRS, BatchSpec, Rel, write_batch

# The relations live in tests/support/stage.py (shared strategies use them); re-exported for the tests here.
__all__ = ["ITEMS", "ITEMS_FULL", "PAIRS", "changes_frame"]


# The frames of these tests are a few rows each, so a query's fixed costs are what a test pays for: with adaptive
# execution off, a shuffle is planned once, not re-planned stage by stage. Two shuffle partitions (the session has
# four) still split a batch's rows across partitions by key hash, so a result that depended on the rows' order
# inside one partition could still show. (The net frames of 20 random batches of test_kernels.py, twice each way,
# alternating, with one partition: 25.7 → 23.5 CPU-seconds of the JVM.)
#
# Whole-stage code generation compiles a class per stage of every query, which a few rows never pay back: without it
# (expressions are still compiled one by one, results identical) test_transform_paths.py took 51.4 and 54.6 where
# it took 56.5 and 57.2 CPU-seconds, each way twice, alternating: the CPU of the pytest process and of the JVM it
# starts (reproduced by ``perf stat -e task-clock -- .venv/bin/pytest -q tests/unit/apply/test_transform_paths.py``).
# These modules test the package's transforms, which the integration tests run again with Spark's defaults. A module
# whose Spark is the reference for random input that no integration test runs (the row filters' ``F.expr``, the
# production's ``filters._match``) puts Spark's default back with a ``SPARK_CONF`` of its own, set over these.
SMALL_FRAMES_CONF = {"spark.sql.shuffle.partitions": "2", "spark.sql.adaptive.enabled": "false",
                     "spark.sql.codegen.wholeStage": "false"}


@pytest.fixture(scope="module")
def spark(spark, request):
    """The session's ``spark``, with SMALL_FRAMES_CONF and the module's own ``SPARK_CONF`` over it for the module
    (its own settings restored after)."""
    with session_conf(spark, {**SMALL_FRAMES_CONF, **getattr(request.module, "SPARK_CONF", {})}):
        yield spark


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
