"""``python_rows`` (a staged file as Python rows, UTC timestamps without pyarrow's zone conversion) equals
``Table.to_pylist`` on every table, down to each timestamp's zone (aware datetimes compare by instant, so the zone
and offset are compared on their own), and imports no pandas doing so."""

import subprocess
import sys
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.staging import StagingLayout, StagingReader
from airflow_provider_pglogical.staging.layout import TRUNCATES
from airflow_provider_pglogical.staging.manifest import Manifest
from airflow_provider_pglogical.staging.reader import BatchRef, TruncateEvent, python_rows
from airflow_provider_pglogical.staging.schema import TRUNCATES_SCHEMA

# Each unit's range less a day at each end: a zoned value's local time must stay in range too (Python's years 1–9999;
# for ``ns``, pandas' years 1677–2262, as pyarrow hands those to pandas).
DAY = 86_400_000_000
MICROS = st.integers(min_value=-62_135_596_800_000_000 + DAY, max_value=253_402_300_799_999_999 - DAY)
NANOS = st.integers(min_value=-(2**63) + DAY * 1000, max_value=2**63 - DAY * 1000)
ZONES = ["UTC", "+00:00", "Europe/Paris", "America/New_York", "+05:30", "-03:00"]
SCALE = {"s": 1_000_000, "ms": 1000, "us": 1}


def zones(value: Any) -> Any:
    """Every timestamp of a row (nested ones too) as (zone name, UTC offset): what ``==`` on datetimes ignores."""
    if isinstance(value, dict):
        return {k: zones(v) for k, v in value.items()}
    if isinstance(value, list):
        return [zones(v) for v in value]
    if hasattr(value, "utcoffset") and hasattr(value, "tzinfo"):
        return (str(value.tzinfo), value.utcoffset())
    return value


def assert_same_rows(ours: list[dict[str, Any]], reference: list[dict[str, Any]]) -> None:
    assert ours == reference
    assert zones(ours) == zones(reference)


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from(ZONES), st.sampled_from(["ns", "us", "ms", "s"]))
def test_python_rows_equal_to_pylist(data, zone, unit):
    values = NANOS if unit == "ns" else MICROS.map(lambda v: v // SCALE[unit])
    rows = data.draw(st.lists(st.tuples(st.none() | values, st.none() | values, st.none() | MICROS,
                                        st.none() | st.text(max_size=5)), max_size=8))
    table = pa.table({
        "commit_time": pa.array([r[0] for r in rows], pa.timestamp(unit, zone)),
        "local": pa.array([r[1] for r in rows], pa.timestamp(unit)),
        "nested": pa.array([None if r[2] is None else {"at": r[2]} for r in rows],
                           pa.struct([("at", pa.timestamp("us", "UTC"))])),
        "name": pa.array([r[3] for r in rows], pa.string()),
    })
    assert_same_rows(python_rows(table), table.to_pylist())


def test_python_rows_keep_a_zone_other_than_utc():
    table = pa.table({"t": pa.array([0], pa.timestamp("us", "Europe/Paris"))})
    [row] = python_rows(table)
    assert row["t"].utcoffset() == timedelta(hours=1) and str(row["t"].tzinfo) == "Europe/Paris"
    assert_same_rows([row], table.to_pylist())


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**40), MICROS, st.lists(st.text(min_size=1, max_size=4), max_size=3),
                          st.booleans(), st.booleans()), min_size=1, max_size=5))
def test_staged_truncates_read_as_to_pylist_reads_them(tmp_path_factory, events):
    """A real truncates file (the staged schema) through ``StagingReader.truncates``: the events as the
    ``to_pylist`` of the same file gives them, commit times with their zone."""
    root = tmp_path_factory.mktemp("staging")
    batch = BatchRef(0, 1, str(root / "batch"))
    (root / "batch").mkdir()
    table = pa.Table.from_pylist([
        {"commit_lsn": lsn, "end_lsn": lsn + 1, "lsn": lsn, "tx_order": i, "xid": 700 + i,
         "commit_time": pa.scalar(micros, pa.timestamp("us", "UTC")).as_py(), "relations": relations,
         "relids": list(range(len(relations))), "cascade": cascade, "restart_identity": restart}
        for i, (lsn, micros, relations, cascade, restart) in enumerate(events)], TRUNCATES_SCHEMA)
    pq.write_table(table, f"{batch.path}/{TRUNCATES}")
    reader = StagingReader(StagingLayout.from_uri(str(root), "s"))
    manifest = Manifest(slot="s", publication="p", start_lsn_int=0, end_lsn_int=1, truncates=len(events))
    reference = [TruncateEvent(r["commit_lsn"], r["tx_order"], tuple(r["relations"]), r["cascade"],
                               r["restart_identity"], r["lsn"], r["xid"], r["commit_time"])
                 for r in pq.ParquetFile(f"{batch.path}/{TRUNCATES}").read().to_pylist()]
    ours = reader.truncates(batch, manifest)
    assert ours == reference
    assert [zones(e.commit_time) for e in ours] == [zones(e.commit_time) for e in reference]


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
