"""The retention rule (which prefix of the staged log may be pruned) and the ``staging.retention`` spec setting."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.pipeline.spec import RetentionSpec, parse_spec
from airflow_provider_pglogical.staging.layout import StagingLayout
from airflow_provider_pglogical.staging.retention import (
    StagedBatch,
    forget_target,
    positions,
    prunable,
    record_position,
    recorded_names,
    target_files,
)
from airflow_provider_pglogical.staging.target_record import TargetRecord, write_record
from tests.unit.pipeline.test_spec import VALID

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def log_of(ages_s: list[int], start: int = 100) -> list[StagedBatch]:
    """Contiguous batches 10 LSNs long, staged ``ages_s`` seconds before NOW (oldest first)."""
    return [StagedBatch(start + 10 * i, start + 10 * (i + 1), 1000, NOW - timedelta(seconds=age))
            for i, age in enumerate(ages_s)]


def test_only_batches_every_target_applied_are_prunable_and_the_newest_always_stays():
    batches = log_of([50, 40, 30, 20, 10])
    assert prunable(batches, applied_through=130, keep_batches=None, keep_for_seconds=None, now=NOW) == 3
    assert prunable(batches, applied_through=129, keep_batches=None, keep_for_seconds=None, now=NOW) == 2
    assert prunable(batches, applied_through=10**9, keep_batches=None, keep_for_seconds=None, now=NOW) == 4
    assert prunable(batches, applied_through=-1, keep_batches=None, keep_for_seconds=None, now=NOW) == 0
    assert prunable([], applied_through=10**9, keep_batches=1, keep_for_seconds=None, now=NOW) == 0


def test_keep_batches_and_keep_for_each_keep_what_they_name():
    batches = log_of([50, 40, 30, 20, 10])
    assert prunable(batches, applied_through=10**9, keep_batches=3, keep_for_seconds=None, now=NOW) == 2
    assert prunable(batches, applied_through=10**9, keep_batches=None, keep_for_seconds=35, now=NOW) == 2
    assert prunable(batches, applied_through=10**9, keep_batches=4, keep_for_seconds=35, now=NOW) == 1
    assert prunable(batches, applied_through=10**9, keep_batches=1, keep_for_seconds=45, now=NOW) == 1


@given(ages=st.lists(st.integers(0, 1000), max_size=30), through=st.integers(90, 500),
       keep=st.one_of(st.none(), st.integers(1, 40)), keep_for=st.one_of(st.none(), st.integers(1, 1000)))
def test_the_pruned_batches_are_a_prefix_no_bound_keeps(ages, through, keep, keep_for):
    batches = log_of(ages)
    n = prunable(batches, applied_through=through, keep_batches=keep, keep_for_seconds=keep_for, now=NOW)
    assert 0 <= n <= max(len(batches) - 1, 0)
    for i, b in enumerate(batches[:n]):
        assert b.end_lsn <= through
        assert keep is None or i < len(batches) - keep
        assert keep_for is None or (NOW - b.created_at).total_seconds() >= keep_for
    if n < len(batches) - 1:  # the first kept batch is kept for a reason
        b = batches[n]
        assert (b.end_lsn > through or (keep is not None and n >= len(batches) - keep)
                or (keep_for is not None and (NOW - b.created_at).total_seconds() < keep_for))


def test_every_target_the_staging_area_knows_has_a_position_and_one_never_recorded_holds_everything(tmp_path):
    layout = StagingLayout.from_uri(str(tmp_path), "s")
    assert positions(layout) == {}
    write_record(str(tmp_path), "s", "postgres/a/1", TargetRecord("public", applied=True))
    write_record(str(tmp_path), "s", "postgres/b/2", TargetRecord("public", applied=True))
    record_position(layout, "postgres/a/1", 500)
    record_position(layout, "delta/s3://lake", None)
    assert positions(layout) == {"postgres/a/1": 500, "postgres/b/2": None, "delta/s3://lake": None}
    record_position(layout, "postgres/b/2", 300)
    assert positions(layout)["postgres/b/2"] == 300


def test_forgetting_a_target_removes_its_records_only_and_twice_is_harmless(tmp_path):
    layout = StagingLayout.from_uri(str(tmp_path), "s")
    write_record(str(tmp_path), "s", "postgres/a/1", TargetRecord("public", applied=True))
    record_position(layout, "postgres/a/1", 500, name="reporting")
    record_position(layout, "iceberg/cat/eu", 700, name="eu")
    record_position(layout, "delta/s3://lake", 600)  # a one-target spec's record carries no name
    assert recorded_names(layout) == {"postgres/a/1": "reporting", "iceberg/cat/eu": "eu"}
    assert len(target_files(layout, "postgres/a/1")) == 2
    assert len(forget_target(layout, "postgres/a/1")) == 2
    assert forget_target(layout, "postgres/a/1") == []
    assert positions(layout) == {"iceberg/cat/eu": 700, "delta/s3://lake": 600}


def spec_with(retention):
    doc = copy.deepcopy(VALID)
    doc["staging"]["retention"] = retention
    return parse_spec(doc)


def test_staging_retention_reads_a_count_and_a_duration():
    assert spec_with({"keep_batches": 100, "keep_for": "7d"}).staging.retention == RetentionSpec(100, 7 * 86400)
    assert spec_with({"keep_for": "90m"}).staging.retention == RetentionSpec(None, 5400)
    assert spec_with({"keep_for": "2w"}).staging.retention == RetentionSpec(None, 14 * 86400)
    assert spec_with({"keep_for": 3600}).staging.retention == RetentionSpec(None, 3600)
    assert parse_spec(copy.deepcopy(VALID)).staging.retention is None


@pytest.mark.parametrize(("retention", "message"), [
    ({}, "staging.retention: give keep_batches, keep_for or both"),
    ({"keep_batches": 0}, "staging.retention.keep_batches: must be greater than 0"),
    ({"keep_batches": "ten"}, "staging.retention.keep_batches: expected a positive integer"),
    ({"keep_for": "7y"}, "staging.retention.keep_for: expected a duration greater than 0"),
    ({"keep_for": "0h"}, "staging.retention.keep_for: expected a duration greater than 0"),
    ({"keep_for": True}, "staging.retention.keep_for: expected a duration"),
    ({"keep": 3}, "staging.retention.keep: unknown key"),
])
def test_staging_retention_errors_name_the_key(retention, message):
    with pytest.raises(SpecError, match=message.replace(".", r"\.")):
        spec_with(retention)
