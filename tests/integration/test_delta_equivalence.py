"""Delta target equivalence: the scripted workloads of test_native_equivalence through drain → stage → Spark →
Delta (local disk and a real S3 server), read back with deltalake and compared with a native subscriber."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from airflow_provider_pglogical.hooks import PgLogicalHook
from tests.conftest import make_database
from tests.integration.test_native_equivalence import (
    APPLY_TABLES,
    BATCH_ONE,
    BATCH_TWO,
    DEVIATION_SQL,
    PRE_EXISTING_SQL,
    PUBLICATIONS_SQL,
    TABLES,
    TABLES_SQL,
    table_rows,
)
from tests.pgserver import execute
from tests.subscriber import drain_all, run_script, subscribe, unsubscribe, wait_for_subscriber

NATIVE_COLUMNS = {"cols": ("id", "a", "b")}  # the column list: the subscriber's table has every column


def delta_rows(location: DeltaLocation, table: str, columns: Sequence[str] | None = None) -> list[tuple]:
    data = DeltaTable(location.table_uri(f"public.{table}"), storage_options=location.options).to_pyarrow_table()
    names = list(columns or data.column_names)
    return sorted(tuple(r[c] for c in names) for r in data.to_pylist())


def replay_changelog(location: DeltaLocation, table: str) -> list[tuple]:
    """The change feed replayed in (_commit_lsn, _tx_order) order, as the native apply worker would."""
    feed = DeltaTable(location.table_uri(f"public.{table}"), storage_options=location.options).to_pyarrow_table()
    feed = feed.sort_by([("_commit_lsn", "ascending"), ("_tx_order", "ascending")])
    columns = [c for c in feed.column_names if not c.startswith("_")]
    state: dict[object, dict] = {}
    for ch in feed.to_pylist():
        new = {c: ch[c] for c in columns}
        match = ch["_old"]["id"] if ch["_old"] is not None else new["id"]
        if ch["_op"] == "truncate":
            state.clear()
        elif ch["_op"] == "delete":
            state.pop(match, None)
        elif ch["_op"] == "update":
            if match in state:
                old = state.pop(match)
                state[new["id"]] = {c: old[c] if c in ch["_unchanged_toast"] else new[c] for c in columns}
        elif ch["_unchanged_toast"]:  # insert that keeps a value: only from a row already at the key
            if new["id"] in state:
                old = state[new["id"]]
                state[new["id"]] = {c: old[c] if c in ch["_unchanged_toast"] else new[c] for c in columns}
        else:
            state[new["id"]] = new
    return sorted(tuple(r[c] for c in columns) for r in state.values())


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_delta_mirror_matches_a_native_subscriber_and_the_changelog_rebuilds_it(pg_server, spark, tmp_path,
                                                                                request, storage):
    if storage == "s3":
        server = request.getfixturevalue("s3")
        staging, lake = f"s3://{server.bucket}/staging", f"s3://{server.bucket}/lake"
    else:
        staging, lake = str(tmp_path / "staging"), str(tmp_path / "lake")
    source, native = make_database(pg_server), make_database(pg_server)
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, TABLES_SQL + PUBLICATIONS_SQL + PRE_EXISTING_SQL)
    execute(native_dsn, TABLES_SQL)
    subscribe(source_dsn, native_dsn)
    PgLogicalHook.from_dsn(source_dsn).create_slot("ours")
    config = ApplyConfig(slot="ours", staging_root=staging, tables=APPLY_TABLES)
    mirror_loc, feed_loc = DeltaLocation(lake + "/mirror"), DeltaLocation(lake + "/feed")
    mirror = DeltaTarget(mirror_loc, "ours")
    feed = DeltaTarget(feed_loc, "ours", mode="changelog")
    try:
        run_script(source_dsn, BATCH_ONE)
        assert drain_all(source_dsn, staging) == 1
        run_script(source_dsn, BATCH_TWO + [DEVIATION_SQL])
        assert drain_all(source_dsn, staging) == 1
        assert [r.applied for r in apply_slot(spark, config, target=mirror)] == [True, True]
        assert [r.applied for r in apply_slot(spark, config, target=mirror)] == [False, False]  # re-run: no-op
        assert [r.applied for r in apply_slot(spark, config, target=feed)] == [True, True]
        assert [r.applied for r in apply_slot(spark, config, target=feed)] == [False, False]
        wait_for_subscriber(source_dsn, native_dsn)
        for table in TABLES:
            if table == "toast_rf":
                continue
            native_rows = [tuple(r[i] for i in range(len(NATIVE_COLUMNS.get(table, r)))) if table != "cols"
                           else (r[0], r[1], r[3]) for r in table_rows(native_dsn, table)]
            assert delta_rows(mirror_loc, table) == native_rows, table
            assert replay_changelog(feed_loc, table) == native_rows, table
        # Not vacuous: the transforms really happened.
        assert delta_rows(mirror_loc, "rf_key") == [(120, 5, "x"), (300, 1, "z")]
        assert delta_rows(mirror_loc, "toasty") == [(1, 2, "x" * 9000), (3, 1, "y" * 9000)]
        assert delta_rows(mirror_loc, "child") == [(50, 5, "c5")]
        # The stated deviation, as in the PostgreSQL target: the value that exists nowhere is rejected.
        assert table_rows(native_dsn, "toast_rf") == [(120, 2, "w" * 9000), (150, 1, None)]
        assert delta_rows(mirror_loc, "toast_rf") == [(120, 2, "w" * 9000)]
        assert replay_changelog(feed_loc, "toast_rf") == [(120, 2, "w" * 9000)]
        ops = DeltaTable(feed_loc.table_uri("public.parent"), storage_options=feed_loc.options).to_pyarrow_table()
        assert "truncate" in ops.column("_op").to_pylist()
        if storage == "s3":
            assert any(k.startswith("lake/mirror/public/toasty/_delta_log/") for k in server.keys("lake/"))
            assert any(k.startswith("staging/ours/batches/") for k in server.keys("staging/"))
    finally:
        unsubscribe(native_dsn)
        execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{native}" WITH (FORCE)')
        execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{source}" WITH (FORCE)')
