"""Crash injection in the Delta apply: stopped before or after any table's commit, the re-run ends equal to an
uninterrupted apply (nothing duplicated, nothing skipped)."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from tests.integration.test_native_equivalence import (
    APPLY_TABLES,
    TABLES,
)

# Each run is stopped at its stop, starting from what the previous stop left. A stop leaves one of two durable
# states, whatever the table: ``before_commit`` — nothing of the table's batch committed, its watermark where it
# was (the rerun merges the batch again); ``committed`` — the table's commit with its watermark made, the batch's
# later tables not (the rerun skips it by its watermark and goes on). mirror: both states in the first batch;
# changelog: both, the committed one in the second batch (TRUNCATE CASCADE, FK order; the rerun skips the first
# batch whole). Not stopped: the other boundaries of child and toasty in the first batch (inserts only), which
# left the same two states and whose reruns took the same paths. Each stop: (point, table, the batch it is in).
STOPS = {"mirror": [("before_commit", "public.child", 0), ("committed", "public.child", 0)],
         "changelog": [("before_commit", "public.toasty", 0), ("committed", "public.child", 1)]}


class Crash(Exception):
    pass


def snapshot(location: DeltaLocation, mode: str) -> dict[str, list]:
    out = {}
    for table in TABLES:
        data = DeltaTable(location.table_uri(f"public.{table}")).to_pyarrow_table()
        if mode == "changelog":
            data = data.drop_columns(["_commit_time"])
        out[table] = sorted(map(repr, data.to_pylist()))
    return out


@pytest.mark.parametrize("mode", ["mirror", "changelog"])
def test_a_crash_at_any_commit_boundary_then_a_rerun_equals_an_uninterrupted_apply(scripted_workload, spark,
                                                                                  tmp_path, mode):
    staging = scripted_workload.copy_to(str(tmp_path / "staging"))
    config = ApplyConfig(slot="ours", staging_root=staging, tables=APPLY_TABLES)
    clean = DeltaLocation(str(tmp_path / "clean"))
    ends = [report.end_lsn for report in apply_slot(spark, config, target=DeltaTarget(clean, "ours", mode=mode))]

    crashed = DeltaLocation(str(tmp_path / "crashed"))
    seen: set[tuple[str, str]] = set()
    for point, table, batch in STOPS[mode]:
        def crash(name: str, target: str, point: str = point, table: str = table) -> None:
            if (name, target) == (point, table) and (name, target) not in seen:
                seen.add((name, target))
                raise Crash(f"{name} {target}")

        with pytest.raises(Crash):
            apply_slot(spark, config, target=DeltaTarget(crashed, "ours", mode=mode, on_checkpoint=crash))
        # the stopped table's watermark: the batch's end once committed, else the previous batch's (or none)
        committed = batch if point == "committed" else batch - 1
        assert DeltaTarget(crashed, "ours").watermark(table) == (ends[committed] if committed >= 0 else None)
    apply_slot(spark, config, target=DeltaTarget(crashed, "ours", mode=mode))
    assert len(seen) == len(STOPS[mode])
    assert snapshot(crashed, mode) == snapshot(clean, mode)
    assert [r.applied for r in apply_slot(spark, config, target=DeltaTarget(crashed, "ours", mode=mode))] == [False, False]
