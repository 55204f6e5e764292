"""The apply task's batch reports over its two routes (in the worker, then spark-submit): one per batch."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.exceptions import ApplyError
from airflow_provider_pglogical.operators.apply import merged_reports


def report(start: int, applied: bool, rows: int = 0) -> dict[str, Any]:
    return {"start_lsn": start, "end_lsn": start + 16, "applied": applied,
            "rows": {"public.t": {"inserted": rows}} if applied else {}, "seconds": {}, "ordered": False}


def test_a_batch_the_worker_applied_keeps_the_workers_report_when_the_submitted_app_lists_it_again():
    here = [report(0, True, 3)]
    submitted = [report(0, False), report(16, True, 5)]
    assert merged_reports(here, submitted) == [report(0, True, 3), report(16, True, 5)]


def test_either_route_alone_is_reported_as_it_is():
    only = [report(0, False), report(16, True, 2)]
    assert merged_reports(only, []) == only
    assert merged_reports([], only) == only


def test_a_batch_both_routes_report_applied_is_an_error_not_a_pick():
    with pytest.raises(ApplyError, match="0/0-0/10 was reported applied both in the worker and by the"):
        merged_reports([report(0, True, 3)], [report(0, True, 3)])


@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=12), st.integers(0, 12))
def test_one_report_per_batch_applied_by_at_most_one_route_in_lsn_order(outcomes, cut):
    # The worker applies a prefix of the batches and reports them; the submitted app lists every batch again and
    # applies only the ones past the worker's last (the model of a run that switched routes at batch ``cut``).
    cut = min(cut, len(outcomes))
    batches = [16 * i for i in range(len(outcomes))]
    here = [report(b, applied) for b, (applied, _) in zip(batches[:cut], outcomes[:cut], strict=True)]
    submitted = [report(b, i >= cut and later) for i, (b, (_, later)) in enumerate(zip(batches, outcomes, strict=True))]
    merged = merged_reports(here, submitted)
    assert [r["start_lsn"] for r in merged] == batches
    expected = [outcomes[i][0] if i < cut else outcomes[i][1] for i in range(len(batches))]
    assert [r["applied"] for r in merged] == expected
