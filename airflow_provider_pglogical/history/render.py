"""The run history as a report: JSON-friendly data and one self-contained HTML page of inline SVG plots (pure).

The page loads nothing (no scripts, fonts or styles from elsewhere): it opens from a file, an e-mail or the
Airflow UI alike. Each plot is an ``<svg class="chart">`` whose data points are ``<circle class="point">``
elements with a ``<title>`` (hover shows time and value); non-finite values are left out, never drawn. A line
of more than :data:`MAX_POINTS` points is thinned (:func:`thin`), keeping every stretch's low and high.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_provider_pglogical.history.record import RunRecord

WIDTH, HEIGHT = 640, 220
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 72, 16, 12, 36
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
MiB = 1024 * 1024
# A line draws at most this many points: at the history's bound (5,000 runs) every point would make a 5 MB page
# with more circles than the plot has pixels across.
MAX_POINTS = 400


@dataclass(frozen=True)
class Series:
    """One line of a chart: (epoch seconds, value) points."""

    label: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Chart:
    """One plot: its id (the element's ``id``), title, y-axis unit and lines."""

    key: str
    title: str
    unit: str
    series: tuple[Series, ...]

    @property
    def points(self) -> list[tuple[float, float]]:
        return [p for s in self.series for p in s.points]


def thin(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> tuple[tuple[float, float], ...]:
    """At most ``limit`` (>= 4) of the points, in time order: all of them when they fit; otherwise the first, the
    last, and the lowest and highest of each of ``limit // 2 - 1`` consecutive runs of points, so no peak (a lag
    spike) and no trough (a ``safe_wal_size`` dip) is dropped."""
    ordered = sorted(points)
    if len(ordered) <= limit:
        return tuple(ordered)
    buckets = limit // 2 - 1
    keep = {0, len(ordered) - 1}
    for b in range(buckets):
        chunk = range(b * len(ordered) // buckets, (b + 1) * len(ordered) // buckets)
        keep.add(min(chunk, key=lambda i: ordered[i][1]))
        keep.add(max(chunk, key=lambda i: ordered[i][1]))
    return tuple(ordered[i] for i in sorted(keep))


def _finite(points: Sequence[tuple[float, float | int | None]]) -> tuple[tuple[float, float], ...]:
    return tuple((float(t), float(v)) for t, v in points
                 if v is not None and math.isfinite(t) and math.isfinite(float(v)))


def charts(records: Sequence[RunRecord]) -> list[Chart]:
    """The report's plots from the records (oldest first): lag and WAL, throughput, durations, batch sizes."""
    def at(r: RunRecord) -> float:
        return r.finished_at.timestamp()

    def line(label: str, values: Sequence[tuple[float, float | int | None]]) -> Series:
        return Series(label, _finite(values))

    def mib(v: int | None) -> float | None:
        return None if v is None else v / MiB

    slot = [r for r in records if r.slot_figures.wal_status is not None or r.slot_figures.lag_bytes is not None]
    decodes = [r for r in records if r.decode_s is not None]
    applies = [r for r in records if r.apply_s is not None]
    return [
        Chart("lag", "Slot lag and WAL retained", "MiB", (
            line("lag", [(at(r), mib(r.slot_figures.lag_bytes)) for r in slot]),
            line("WAL retained", [(at(r), mib(r.slot_figures.retained_bytes)) for r in slot]),
            line("safe_wal_size", [(at(r), mib(r.slot_figures.safe_wal_size)) for r in slot]))),
        Chart("throughput", "Drain throughput", "changes/s", (
            line("changes/s", [(at(r), r.changes_per_s) for r in decodes]),)),
        Chart("durations", "Decode and apply durations", "s", (
            line("decode", [(at(r), r.decode_s) for r in decodes]),
            line("apply", [(at(r), r.apply_s) for r in applies]))),
        Chart("batches", "Staged per run", "changes", (
            line("changes", [(at(r), r.changes) for r in decodes]),
            line("batches", [(at(r), r.batches_staged) for r in decodes]))),
    ]


def axis_range(values: Sequence[float], *, from_zero: bool = False) -> tuple[float, float]:
    """(low, high) covering every value with ``high > low``; ``from_zero`` includes 0 (quantities)."""
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    if from_zero:
        low, high = min(low, 0.0), max(high, 0.0)
    if high - low <= abs(high) * 1e-9 or high == low:
        pad = max(abs(high) * 0.1, 1.0)
        low, high = low - (0.0 if from_zero and low == 0 else pad), high + pad
    return low, high


def _fmt(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def chart_svg(chart: Chart) -> str:
    """The chart as an inline ``<svg>``: axes with their ranges labelled, one polyline and circles per series."""
    points = chart.points
    x0, x1 = axis_range([t for t, _ in points])
    y0, y1 = axis_range([v for _, v in points], from_zero=True)
    plot_w, plot_h = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def sx(t: float) -> float:
        return MARGIN_LEFT + (t - x0) / (x1 - x0) * plot_w

    def sy(v: float) -> float:
        return MARGIN_TOP + plot_h - (v - y0) / (y1 - y0) * plot_h

    esc = html.escape
    bottom, right = MARGIN_TOP + plot_h, MARGIN_LEFT + plot_w
    parts = [f'<svg class="chart" id="chart-{esc(chart.key)}" xmlns="http://www.w3.org/2000/svg" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
             f'aria-label="{esc(chart.title)}" data-x-min="{x0}" data-x-max="{x1}" data-y-min="{y0}" data-y-max="{y1}">',
             f'<line class="axis" x1="{MARGIN_LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#444"/>',
             f'<line class="axis" x1="{MARGIN_LEFT}" y1="{MARGIN_TOP}" x2="{MARGIN_LEFT}" y2="{bottom}" stroke="#444"/>',
             f'<text x="{MARGIN_LEFT - 6}" y="{bottom}" text-anchor="end" font-size="11">{esc(_fmt(y0))}</text>',
             f'<text x="{MARGIN_LEFT - 6}" y="{MARGIN_TOP + 10}" text-anchor="end" font-size="11">{esc(_fmt(y1))}</text>',
             f'<text x="8" y="{MARGIN_TOP + plot_h / 2:.1f}" font-size="11">{esc(chart.unit)}</text>']
    if points:
        parts.append(f'<text x="{MARGIN_LEFT}" y="{HEIGHT - 8}" font-size="11">{esc(_time(x0))}</text>')
        parts.append(f'<text x="{right}" y="{HEIGHT - 8}" text-anchor="end" font-size="11">{esc(_time(x1))}</text>')
    else:
        parts.append(f'<text class="empty" x="{MARGIN_LEFT + plot_w / 2:.1f}" y="{MARGIN_TOP + plot_h / 2:.1f}" '
                     'text-anchor="middle" font-size="13" fill="#888">no data in this period</text>')
    for i, series in enumerate(chart.series):
        colour = COLOURS[i % len(COLOURS)]
        coords = [(sx(t), sy(v), t, v) for t, v in thin(series.points)]
        if len(coords) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in coords)
            parts.append(f'<polyline class="line" fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')
        for x, y, t, v in coords:
            parts.append(f'<circle class="point" data-series="{esc(series.label)}" cx="{x:.1f}" cy="{y:.1f}" r="2.5" '
                         f'fill="{colour}"><title>{esc(series.label)} {esc(_fmt(v))} {esc(chart.unit)} at '
                         f'{esc(_time(t))} UTC</title></circle>')
        parts.append(f'<text x="{right - 4}" y="{MARGIN_TOP + 12 + 13 * i}" text-anchor="end" font-size="11" '
                     f'fill="{colour}">{esc(series.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def report_data(slot: str, records: Sequence[RunRecord], *, current: Mapping[str, Any] | None = None,
                since: datetime | None = None, generated_at: datetime | None = None) -> dict[str, Any]:
    """The report as JSON-friendly data (``pglogical report --json``): the runs and the current state."""
    ok = [r for r in records if r.outcome == "ok"]
    return {
        "slot": slot,
        "generated_at": (generated_at or datetime.now(UTC)).isoformat(),
        "since": since.isoformat() if since else None,
        "runs": [r.to_dict() for r in records],
        "totals": {"runs": len(records), "failed": len(records) - len(ok),
                   "changes": sum(r.changes for r in records if r.kind != "apply"),
                   "batches_applied": sum(r.batches_applied for r in records)},
        "current": dict(current or {}),
    }


STYLE = ("body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.4em}"
         "h2{font-size:1.05em;margin:1.2em 0 .3em}table{border-collapse:collapse;font-size:.9em}"
         "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}.ok{color:#1a7f37}"
         ".at_risk{color:#b35900;font-weight:bold}.lost,.failed{color:#c00;font-weight:bold}"
         ".charts{display:flex;flex-wrap:wrap;gap:1em}")


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return html.escape(str(value))


def render_html(data: Mapping[str, Any], records: Sequence[RunRecord]) -> str:
    """The whole page: the current-state table, the plots and the last runs."""
    esc = html.escape
    slot = str(data["slot"])
    current = data.get("current") or {}
    state = str(current.get("health", ""))
    rows = "".join(f'<tr><th>{esc(str(k))}</th><td class="{esc(state) if k == "health" else ""}">{_cell(v)}</td></tr>'
                   for k, v in current.items())
    plots = "".join(f'<figure><figcaption>{esc(c.title)}</figcaption>{chart_svg(c)}</figure>' for c in charts(records))
    recent = "".join(
        f'<tr><td>{esc(r.finished_at.strftime("%Y-%m-%d %H:%M:%S"))}</td><td>{esc(r.kind)}</td><td>{esc(r.tool)}</td>'
        f'<td class="{esc(r.outcome)}">{esc(r.outcome)}</td><td>{_cell(r.changes)}</td><td>{_cell(r.batches_applied)}</td>'
        f'<td>{_cell(r.slot_figures.lag_bytes)}</td><td>{_cell(r.start_lsn)}..{_cell(r.end_lsn)}</td>'
        f'<td>{_cell(r.error)}</td></tr>' for r in list(records)[::-1][:50])
    since = f" since {esc(str(data['since']))}" if data.get("since") else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<title>pglogical report: {esc(slot)}</title><style>{STYLE}</style></head><body>'
        f'<h1>pglogical pipeline report: slot {esc(slot)}</h1>'
        f'<p>{len(records)} run(s){since}; generated {esc(str(data["generated_at"]))}.</p>'
        f'<h2>Current state</h2><table id="current">{rows or "<tr><td>unknown</td></tr>"}</table>'
        f'<h2>Over time</h2><div class="charts">{plots}</div>'
        '<h2>Last runs</h2><table id="runs"><tr><th>ended (UTC)</th><th>kind</th><th>by</th><th>outcome</th>'
        f'<th>changes</th><th>batches applied</th><th>lag bytes</th><th>LSN range</th><th>error</th></tr>{recent}</table>'
        '</body></html>')
