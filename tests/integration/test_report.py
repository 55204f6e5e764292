"""`pglogical report` on a real pipeline's history, and the page it writes opened in a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from scripts.harness.pgserver import drop_database, execute, make_database
from scripts.harness.userenv import run_as_user, venv_script
from tests.support.spark import TEST_SPARK_CONF

CONSOLE = re.compile(r":CONSOLE[:(]")  # Chromium's log line of every console message, errors and uncaught ones
POINT = re.compile(r'<circle class="point"')


def chromium() -> str:
    """The browser the tests drive (Debian's ``chromium``, installed by ``make bootstrap``)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed: `make bootstrap` installs it (apt-get install chromium)")
    return found


def open_in_browser(page: Path) -> tuple[str, list[str]]:
    """The DOM Chromium built from ``page`` (headless, scripts on) and the console lines it logged meanwhile."""
    result = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--enable-logging=stderr", "--v=0", "--virtual-time-budget=2000",
                             f"--user-data-dir={page.parent / 'chromium-profile'}", "--dump-dom", page.as_uri()],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, [line for line in result.stderr.splitlines() if CONSOLE.search(line)]


def test_the_browser_check_catches_console_errors_and_uncaught_exceptions(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><p>x</p><script>console.error("broken-page");'
                    'throw new Error("uncaught-in-page");</script></body></html>')
    dom, console = open_in_browser(page)
    assert "<p>x</p>" in dom
    assert any("broken-page" in line for line in console) and any("uncaught-in-page" in line for line in console)


@pytest.fixture
def pipeline(pg_server, pg_dsn, pg_dbname, tmp_path):
    target = make_database(pg_server)
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)")
    doc = {"source": {"dsn": pg_server.uri(pg_dbname), "publication": "report_pub", "slot": "report_slot",
                      "create": True, "min_safe_wal_bytes": "1MB"},
           "staging": {"uri": str(tmp_path / "staging")},
           "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
           "tables": {"public.items": {}}, "spark": {"master": "local[1]", "conf": dict(TEST_SPARK_CONF)}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        yield {"spec": str(path), "source": pg_dsn, "tmp": tmp_path}
    finally:
        drop_database(pg_server, target)


def pglogical(*args: str) -> subprocess.CompletedProcess[str]:
    return run_as_user([venv_script("pglogical"), *args], timeout=600)


def test_a_report_of_real_runs_plots_them_and_renders_in_a_browser_without_console_errors(pipeline):
    first = pglogical("decode", "--spec", pipeline["spec"])  # creates the slot; nothing to stage yet
    assert first.returncode == 0, first.stderr[-2000:]
    execute(pipeline["source"], "INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 500) g")
    ran = pglogical("run", "--spec", pipeline["spec"])
    assert ran.returncode == 0, ran.stderr[-3000:]
    execute(pipeline["source"], "UPDATE items SET name = name || '!' WHERE id <= 200")
    decoded = pglogical("decode", "--spec", pipeline["spec"])
    assert decoded.returncode == 0, decoded.stderr[-2000:]
    applied = pglogical("apply", "--spec", pipeline["spec"])
    assert applied.returncode == 0, applied.stderr[-3000:]

    page = pipeline["tmp"] / "report.html"
    result = pglogical("report", "--spec", pipeline["spec"], "--html", str(page), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout)
    runs = data["runs"]
    assert [(r["kind"], r["outcome"]) for r in runs] == [("decode", "ok"), ("run", "ok"), ("decode", "ok"),
                                                         ("apply", "ok")]
    assert [r["changes"] for r in runs[:3]] == [0, 500, 200]
    assert runs[1]["batches_applied"] == 1 and runs[3]["batches_applied"] == 1
    assert runs[1]["tables"] == {"public.items": 500} and runs[3]["tables"] == {"public.items": 200}
    assert runs[3]["start_lsn"] == runs[2]["start_lsn"] and runs[3]["end_lsn"] == runs[2]["end_lsn"]
    assert all(r["slot_figures"]["wal_status"] == "reserved" for r in runs if r["kind"] != "apply")
    assert runs[1]["decode_s"] > 0 and runs[1]["apply_s"] > 0 and runs[3]["apply_s"] > 0
    assert data["current"]["health"] == "ok" and data["current"]["wal_status"] == "reserved"
    assert "--since" not in result.stderr

    dom, console = open_in_browser(page)
    assert console == []
    charts = re.findall(r'<svg class="chart" id="chart-(\w+)"', dom)
    assert charts == ["lag", "throughput", "durations", "batches"]
    by_chart = dict(zip(charts, re.split(r'<svg class="chart"', dom)[1:], strict=True))
    # lag and WAL retained of the 3 runs that read the slot (no safe_wal_size: max_slot_wal_keep_size is -1 here)
    assert len(POINT.findall(by_chart["lag"])) == 2 * 3
    assert len(POINT.findall(by_chart["throughput"])) == 3
    assert len(POINT.findall(by_chart["durations"])) == 3 + 2  # 3 decodes, 2 applies
    assert "no data in this period" not in dom

    recent = pglogical("report", "--spec", pipeline["spec"], "--since", "2099-01-01T00:00", "--json")
    assert recent.returncode == 0 and json.loads(recent.stdout)["runs"] == []
