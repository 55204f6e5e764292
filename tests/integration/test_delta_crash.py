"""Crash injection in the Delta apply: stopped before or after any table's commit, the re-run ends equal to an
uninterrupted apply (nothing duplicated, nothing skipped)."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import CHECKPOINTS, DeltaTarget
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute
from scripts.harness.subscriber import drain_all, run_script
from tests.integration.test_native_equivalence import (
    APPLY_TABLES,
    BATCH_ONE,
    BATCH_TWO,
    PRE_EXISTING_SQL,
    PUBLICATIONS_SQL,
    TABLES,
    TABLES_SQL,
)


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
def test_a_crash_at_any_commit_boundary_then_a_rerun_equals_an_uninterrupted_apply(pg_dbname, pg_server, spark,
                                                                                  tmp_path, mode):
    dsn = pg_server.dsn(pg_dbname)
    execute(dsn, TABLES_SQL + PUBLICATIONS_SQL + PRE_EXISTING_SQL)
    PgLogicalHook.from_dsn(dsn).create_slot("ours")
    staging = str(tmp_path / "staging")
    run_script(dsn, BATCH_ONE)
    drain_all(dsn, staging)
    run_script(dsn, BATCH_TWO)
    drain_all(dsn, staging)
    config = ApplyConfig(slot="ours", staging_root=staging, tables=APPLY_TABLES)
    clean = DeltaLocation(str(tmp_path / "clean"))
    apply_slot(spark, config, target=DeltaTarget(clean, "ours", mode=mode))

    crashed = DeltaLocation(str(tmp_path / "crashed"))
    # In the second batch (TRUNCATE CASCADE, FK order, TOAST): stop at each boundary of two tables in turn.
    stops = [(point, table) for table in ("public.child", "public.toasty") for point in CHECKPOINTS]
    seen: set[tuple[str, str]] = set()
    for point, table in stops:
        def crash(name: str, target: str, point: str = point, table: str = table) -> None:
            if (name, target) == (point, table) and (name, target) not in seen:
                seen.add((name, target))
                raise Crash(f"{name} {target}")

        with pytest.raises(Crash):
            apply_slot(spark, config, target=DeltaTarget(crashed, "ours", mode=mode, on_checkpoint=crash))
    apply_slot(spark, config, target=DeltaTarget(crashed, "ours", mode=mode))
    assert len(seen) == len(stops)
    assert snapshot(crashed, mode) == snapshot(clean, mode)
    assert [r.applied for r in apply_slot(spark, config, target=DeltaTarget(crashed, "ours", mode=mode))] == [False, False]
