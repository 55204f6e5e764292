"""Run records, their store beside the staging area (local and S3), the slot-health judgement and the report page."""

from __future__ import annotations

import math
import re
import threading
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.exceptions import SlotWalRetentionError
from airflow_provider_pglogical.history.health import AT_RISK, LOST, Thresholds, judge, severity
from airflow_provider_pglogical.history.record import RunRecord, SlotFigures, parse_since, record_name
from airflow_provider_pglogical.history.recorder import RunRecorder, error_line, recording
from airflow_provider_pglogical.history.render import (
    Chart,
    Series,
    axis_range,
    chart_svg,
    charts,
    render_html,
    report_data,
)
from airflow_provider_pglogical.history.store import RunHistory

T0 = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=1)


def record(minutes: float = 0, **fields) -> RunRecord:
    at = T0 + timedelta(minutes=minutes)
    base = dict(run_id=f"r{minutes:g}", kind="decode", slot="s1", started_at=at - timedelta(seconds=5),
                finished_at=at, outcome="ok", changes=100, decode_s=2.0, batches_staged=1,
                slot_figures=SlotFigures(lag_bytes=1000, retained_bytes=5000, safe_wal_size=10**9,
                                         wal_status="reserved"))
    base.update(fields)
    return RunRecord(**base)


# -- records -----------------------------------------------------------------------------------------------------


def test_a_record_survives_its_json_form_and_ignores_fields_a_newer_writer_added():
    r = record(tables={"public.t": 3}, start_lsn="0/10", end_lsn="0/20", apply_s=1.5, error=None)
    assert RunRecord.from_json(r.to_json()) == r
    body = r.to_dict() | {"some_future_field": 1}
    assert RunRecord.from_dict(body) == r


def test_a_record_of_a_newer_format_is_refused_by_name():
    with pytest.raises(ValueError, match="newer than this reader"):
        RunRecord.from_dict(record().to_dict() | {"format": 99})


def test_record_names_sort_in_time_order():
    names = [record_name(record(m)) for m in (0, 0.001, 1, 60, 60 * 24 * 400)]
    assert names == sorted(names)


def test_throughput_is_unknown_without_decode_seconds():
    assert record(decode_s=None).changes_per_s is None
    assert record(decode_s=0.0).changes_per_s is None
    assert record(changes=100, decode_s=4.0).changes_per_s == 25.0


def test_since_takes_an_age_or_an_iso_time_and_names_the_forms_it_takes():
    assert parse_since("24h", at=T0) == T0 - timedelta(hours=24)
    assert parse_since("7d", at=T0) == T0 - timedelta(days=7)
    assert parse_since("2026-01-31T10:00") == datetime(2026, 1, 31, 10, tzinfo=UTC)
    assert parse_since("2026-01-31T10:00:00Z") == datetime(2026, 1, 31, 10, tzinfo=UTC)
    with pytest.raises(ValueError, match="an age"):
        parse_since("yesterday")


# -- store ---------------------------------------------------------------------------------------------------------


def test_records_are_read_back_oldest_first_and_since_filters_by_end_time(tmp_path):
    store = RunHistory.from_uri(str(tmp_path), "s1")
    for m in (2, 0, 1):
        store.append(record(m))
    assert [r.run_id for r in store.records()] == ["r0", "r1", "r2"]
    assert [r.run_id for r in store.records(since=T0 + timedelta(minutes=1))] == ["r1", "r2"]
    assert (tmp_path / "s1" / "history").is_dir()


def test_the_history_is_bounded_by_count_and_age_and_keeps_the_newest(tmp_path):
    store = RunHistory.from_uri(str(tmp_path), "s1", max_records=3, max_age=timedelta(days=3))
    for m in range(5):
        store.append(record(m))
    assert [r.run_id for r in store.records()] == ["r2", "r3", "r4"]
    assert store.prune(at=T0 + timedelta(days=4)) == [record_name(record(2)), record_name(record(3))]
    assert [r.run_id for r in store.records()] == ["r4"]  # older than 3 days, but the newest stays


def test_an_unreadable_record_is_skipped_and_named_while_the_others_are_read(tmp_path):
    store = RunHistory.from_uri(str(tmp_path), "s1")
    store.append(record(0))
    (tmp_path / "s1" / "history" / record_name(record(1))).write_text('{"format": 1, "kind": "dec')
    seen: list[str] = []
    assert [r.run_id for r in store.records(log=seen.append)] == ["r0"]
    assert len(seen) == 1 and "unreadable run record" in seen[0] and "JSONDecodeError" in seen[0]


def test_concurrent_readers_never_see_half_a_record(tmp_path):
    store = RunHistory.from_uri(str(tmp_path), "s1")
    big = record(0, tables={f"public.t{i}": i for i in range(2000)})
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            store.records(log=errors.append)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(40):
            store.append(RunRecord.from_dict(big.to_dict() | {"run_id": f"w{i}"}))
    finally:
        stop.set()
        reader.join()
    assert errors == []
    assert len(store.records()) == 40


def test_the_history_lives_in_the_s3_staging_area_too(s3):
    store = RunHistory.from_uri(f"s3://{s3.bucket}/staging", "s1")
    store.append(record(0))
    store.append(record(1))
    assert [r.run_id for r in store.records()] == ["r0", "r1"]
    assert s3.keys("staging/") == [f"staging/s1/history/{record_name(record(i))}" for i in (0, 1)]  # no marker


def test_a_recorder_writes_one_failed_record_and_lets_the_error_through(tmp_path):
    with pytest.raises(SlotWalRetentionError):
        with recording(str(tmp_path), "s1", "decode") as rec:
            rec.decoded([{"changes": 4, "bytes": 10, "staged": True, "tables": {"public.t": 4},
                          "start_lsn_int": 16, "end_lsn_int": 32}], 0.5)
            raise SlotWalRetentionError("replication slot 's1' can lose WAL after 5 more bytes")
    (only,) = RunHistory.from_uri(str(tmp_path), "s1").records()
    assert (only.outcome, only.changes, only.tables, only.start_lsn, only.end_lsn) == (
        "failed", 4, {"public.t": 4}, "0/10", "0/20")
    assert only.error is not None and only.error.startswith("replication slot 's1' can lose WAL")


def test_an_unwritable_history_is_logged_and_never_fails_the_run(tmp_path):
    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / "history").write_text("a file where the directory goes")
    seen: list[str] = []
    with recording(str(tmp_path), "s1", "apply", log=seen.append) as rec:
        rec.applied(batches_applied=1, rows={"public.t": {"inserted": 2}}, seconds=1.0, lsns=[(16, 32)])
    assert len(seen) == 1 and "run history of slot s1 not written" in seen[0]


def test_a_foreign_error_is_recorded_by_its_type_alone_as_its_message_may_quote_row_values():
    assert error_line(ValueError("invalid input syntax: 'secret value'")) == "ValueError"


def test_an_apply_record_counts_rows_written_without_rejected_ones(tmp_path):
    rec = RunRecorder(str(tmp_path), "s1", "apply")
    rec.applied(batches_applied=2, rows={"public.t": {"inserted": 2, "updated": 1, "rejected": 5}}, seconds=1.25,
                lsns=[(16, 32), (32, 48)])
    rec.finish()
    (only,) = RunHistory.from_uri(str(tmp_path), "s1").records()
    assert (only.tables, only.batches_applied, only.apply_s, only.start_lsn, only.end_lsn) == (
        {"public.t": 3}, 2, 1.25, "0/10", "0/30")


# -- slot health ---------------------------------------------------------------------------------------------------

LIMITS = Thresholds(min_safe_wal_bytes=1 << 30, max_lag_bytes=10 << 30)


def test_a_healthy_slot_has_no_findings():
    figures = SlotFigures(lag_bytes=5, retained_bytes=5, safe_wal_size=2 << 30, wal_status="reserved")
    assert judge("s1", figures, LIMITS) == [] and severity([]) == "ok"


@pytest.mark.parametrize("figures, check", [
    (SlotFigures(lag_bytes=5, safe_wal_size=(1 << 30) - 1, wal_status="extended"), "safe_wal_size"),
    (SlotFigures(lag_bytes=(10 << 30) + 1, safe_wal_size=2 << 30, wal_status="reserved"), "lag"),
    (SlotFigures(lag_bytes=5, retained_bytes=7, safe_wal_size=-3, wal_status="unreserved"), "wal_status"),
])
def test_a_slot_is_at_risk_while_there_is_still_time(figures, check):
    findings = judge("s1", figures, LIMITS)
    assert check in [f.check for f in findings] and severity(findings) == AT_RISK


def test_without_thresholds_only_unreserved_and_lost_count():
    assert judge("s1", SlotFigures(lag_bytes=1 << 40, safe_wal_size=0, wal_status="reserved"), Thresholds()) == []


def test_a_lost_slot_names_the_resync_way_out():
    findings = judge("s1", SlotFigures(wal_status="lost"), LIMITS)
    assert severity(findings) == LOST and "pglogical resync --spec" in findings[0].message
    assert severity(judge("s1", None, LIMITS)) == LOST


def test_a_slot_without_max_slot_wal_keep_size_has_no_safe_wal_size_to_judge():
    assert judge("s1", SlotFigures(lag_bytes=0, safe_wal_size=None, wal_status="reserved"), LIMITS) == []


# -- the report ----------------------------------------------------------------------------------------------------

NUMBERS = st.one_of(st.none(), st.integers(-(10**15), 10**15), st.floats(min_value=-1e15, max_value=1e15),
                    st.sampled_from([math.nan, math.inf, -math.inf]))
COORD = re.compile(r'<circle class="point"[^>]* cx="([^"]+)" cy="([^"]+)"')


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=1e9, max_value=4e9), NUMBERS), max_size=30),
       st.lists(st.tuples(st.floats(min_value=1e9, max_value=4e9), NUMBERS), max_size=30))
def test_every_drawn_point_is_a_finite_coordinate_inside_the_plot(first, second):
    from airflow_provider_pglogical.history.render import _finite

    chart = Chart("c", "title", "unit", (Series("a", _finite(first)), Series("b", _finite(second))))
    svg = chart_svg(chart)
    drawn = [(float(x), float(y)) for x, y in COORD.findall(svg)]
    assert "nan" not in svg.lower() and "inf" not in svg.lower()
    assert len(drawn) == len(chart.points)  # every finite value, nothing else
    for x, y in drawn:
        assert 72 - 0.1 <= x <= 640 - 16 + 0.1 and 12 - 0.1 <= y <= 220 - 36 + 0.1


@settings(max_examples=200)
@given(st.lists(st.floats(min_value=-1e15, max_value=1e15), max_size=20), st.booleans())
def test_an_axis_covers_every_value_and_has_a_length(values, from_zero):
    low, high = axis_range(values, from_zero=from_zero)
    assert math.isfinite(low) and math.isfinite(high) and high > low
    assert all(low <= v <= high for v in values)
    if from_zero:
        assert low <= 0 <= high


def test_the_page_has_one_plot_per_figure_with_its_points_and_loads_nothing_from_elsewhere():
    records = [record(0), record(15, changes=300, decode_s=3.0), record(30, kind="apply", decode_s=None, apply_s=9.5,
                                                                         changes=0, batches_applied=2),
               record(45, outcome="failed", error="replication slot 's1' is unreserved")]
    data = report_data("s1", records, current={"health": "at_risk", "lag_bytes": 12}, generated_at=T0)
    page = render_html(data, records)
    assert page.count('<svg class="chart"') == 4
    for key in ("lag", "throughput", "durations", "batches"):
        assert f'id="chart-{key}"' in page
    assert len(COORD.findall(page)) == sum(len(c.points) for c in charts(records)) > 0
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "<script" not in page
    assert data["totals"] == {"runs": 4, "failed": 1, "changes": 100 + 300 + 100, "batches_applied": 2}
    assert 'class="at_risk"' in page


def test_an_empty_history_still_renders_every_plot_saying_so():
    page = render_html(report_data("s1", [], generated_at=T0), [])
    assert page.count('<svg class="chart"') == 4 and page.count("no data in this period") == 4


def test_names_in_the_page_are_escaped():
    data = report_data("s<1>", [], current={"slot": "<b>x</b>"}, generated_at=T0)
    page = render_html(data, [])
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page and "s&lt;1&gt;" in page


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=1e9, max_value=4e9), st.floats(min_value=-1e12, max_value=1e12)),
                max_size=300), st.integers(min_value=4, max_value=120))
def test_thinning_keeps_every_point_that_fits_and_otherwise_the_ends_and_every_extreme(points, limit):
    from airflow_provider_pglogical.history.render import thin

    thinned = thin(points, limit)
    assert list(thinned) == sorted(thinned)
    if len(points) <= limit:
        assert thinned == tuple(sorted(points))  # the reference: every point
        return
    assert len(thinned) <= limit and set(thinned) <= set(points)
    ordered = sorted(points)
    assert thinned[0] == ordered[0] and thinned[-1] == ordered[-1]
    assert max(v for _, v in thinned) == max(v for _, v in points)
    assert min(v for _, v in thinned) == min(v for _, v in points)


def test_a_history_at_its_bound_draws_a_bounded_page_that_still_shows_the_peak():
    from airflow_provider_pglogical.history.render import MAX_POINTS

    many = [record(m, slot_figures=SlotFigures(lag_bytes=(50 << 30) if m == 3333 else 1 << 20, wal_status="reserved"))
            for m in range(5000)]
    svg = chart_svg(charts(many)[0])
    points = [p for p in svg.split("<circle")[1:]]
    assert len(points) <= MAX_POINTS and "51,200 MiB" in svg
