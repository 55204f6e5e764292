"""``python_rows`` (a batch's small files as Python rows, UTC timestamps without pyarrow's zone conversion) equals
``Table.to_pylist`` on every table, and imports no pandas doing so."""

import subprocess
import sys
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.staging.reader import python_rows

MICROS = st.integers(min_value=-62_135_596_800_000_000, max_value=253_402_300_799_999_999)  # years 1–9999


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.none() | MICROS, st.none() | MICROS, st.none() | st.text(max_size=5)), max_size=8),
       st.sampled_from(["UTC", "+00:00"]), st.sampled_from(["us", "ms", "s"]))
def test_python_rows_equal_to_pylist(rows, zone, unit):
    scale = {"us": 1, "ms": 1000, "s": 1_000_000}[unit]
    table = pa.table({
        "commit_time": pa.array([r[0] // scale if r[0] is not None else None for r in rows], pa.timestamp(unit, zone)),
        "local": pa.array([r[1] // scale if r[1] is not None else None for r in rows], pa.timestamp(unit)),
        "name": pa.array([r[2] for r in rows], pa.string()),
    })
    ours, reference = python_rows(table), table.to_pylist()
    assert ours == reference
    assert [r["commit_time"].utcoffset() if r["commit_time"] else None for r in ours] == \
        [r["commit_time"].utcoffset() if r["commit_time"] else None for r in reference]


def test_python_rows_keep_a_zone_other_than_utc():
    table = pa.table({"t": pa.array([0], pa.timestamp("us", "Europe/Paris"))})
    assert python_rows(table) == table.to_pylist() == [{"t": datetime(1970, 1, 1, tzinfo=UTC)}]


def test_reading_commit_times_imports_no_pandas(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"commit_time": pa.array([0, None], pa.timestamp("us", "UTC"))}), path)
    script = (
        "import sys, pyarrow.parquet as pq\n"
        "from airflow_provider_pglogical.staging.reader import python_rows\n"
        f"rows = python_rows(pq.ParquetFile({str(path)!r}).read())\n"
        "print(rows[0]['commit_time'].isoformat(), rows[1]['commit_time'], 'pandas' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["1970-01-01T00:00:00+00:00", "None", "False"]
