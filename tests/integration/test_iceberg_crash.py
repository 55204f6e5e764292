"""Crash injection in the Iceberg apply: a child process killed with SIGKILL (no cleanup) after a table's data files
are written and before its catalog commit, or right after the commit; the re-run ends equal to an uninterrupted
apply (nothing twice, nothing skipped), and a killed commit leaves nothing visible."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from tests.conftest import REPO_ROOT
from tests.integration.test_native_equivalence import (
    APPLY_TABLES,
    TABLES,
)
from tests.support.iceberg_apply_child import KILLED

# Each child run is killed at its stop, starting from what the previous kill left (a child starts a JVM only for a
# table-batch the direct path does not cover, as ``pglogical run`` does: the change feed's, not the mirror's). A kill leaves one of two durable states, whatever the table: ``before_commit`` —
# the table's data files written, no snapshot references them, its watermark where it was (the rerun writes and
# commits the batch again); ``committed`` — the table's snapshot and watermark committed, the batch's later tables
# not (the rerun skips it by its watermark and goes on). mirror: both states in the first batch (the orphaned
# files are checked); changelog: both, the committed one in the second batch (the rerun skips the first whole).
# Not killed: mirror's two boundaries of toasty in the first batch, which left the same two states (inserts only,
# as for child) and whose reruns took the same paths. The final rerun runs in this process: only a kill needs a
# child. Each stop: (kill point, the batch it is reached in).
STOPS = {"mirror": [("before_commit@public.child", 0), ("committed@public.child", 0)],
         "changelog": [("before_commit@public.toasty", 0), ("committed@public.child", 1)]}


def rows(target: IcebergTarget, mode: str) -> dict[str, list[str]]:
    out = {}
    for table in TABLES:
        tbl = target.open(f"public.{table}")
        data = tbl.scan().to_arrow() if tbl is not None else None
        if data is not None and mode == "changelog":
            data = data.drop_columns(["_commit_time"])
        out[table] = [] if data is None else sorted(map(repr, data.to_pylist()))
    return out


def run_child(**args: object) -> int:
    proc = subprocess.run([sys.executable, "-m", "tests.support.iceberg_apply_child", json.dumps(args)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, KILLED), proc.stderr[-3000:]
    return proc.returncode


@pytest.mark.parametrize("mode", ["mirror", "changelog"])
def test_a_kill_at_any_commit_boundary_then_a_rerun_equals_an_uninterrupted_apply(scripted_workload, spark,
                                                                                  tmp_path, mode):
    staging = scripted_workload.copy_to(str(tmp_path / "staging"))
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": str(tmp_path / "warehouse")}
    config = ApplyConfig(slot="ours", staging_root=staging, tables=APPLY_TABLES)
    clean = IcebergTarget(IcebergLocation(catalog, "clean"), "ours", mode=mode)
    ends = [report.end_lsn for report in apply_slot(spark, config, target=clean)]

    crashed = IcebergTarget(IcebergLocation(catalog, "crashed"), "ours", mode=mode)
    tables = {name: {k: v for k, v in asdict(cfg).items() if v is not None} for name, cfg in APPLY_TABLES.items()}
    child = {"catalog": catalog, "namespace": "crashed", "slot": "ours", "staging_uri": staging, "mode": mode,
             "tables": tables}
    for i, (stop, batch) in enumerate(STOPS[mode]):
        assert run_child(**child, kill_at=stop) == KILLED, stop
        point, _, killed = stop.partition("@")
        # the killed table's watermark: the batch's end once committed, else the previous batch's (or none)
        committed = batch if point == "committed" else batch - 1
        assert crashed.watermark(killed) == (ends[committed] if committed >= 0 else None), stop
        if i == 0 and stop == "before_commit@public.child":
            # Killed after its data files were written: they are on disk, yet no snapshot references them.
            written = list(Path(tmp_path / "warehouse").glob("crashed/child/data/*.parquet"))
            assert written and crashed.watermark("public.child") is None
            table = crashed.open("public.child")
            assert table is None or table.scan().to_arrow().num_rows == 0
    apply_slot(spark, config, target=IcebergTarget(IcebergLocation(catalog, "crashed"), "ours", mode=mode))
    assert rows(crashed, mode) == rows(clean, mode)
    assert crashed.watermarks("ours", {f"public.{t}" for t in TABLES}) == \
        clean.watermarks("ours", {f"public.{t}" for t in TABLES})
    assert [r.applied for r in apply_slot(spark, config, target=crashed)] == [False, False]
