"""The Delta apply where the spec's Spark runs: ``pglogical run`` as a Spark Connect client (S3 staging read by the
server's executors only), and the spec app submitted with spark-submit to ``local[2]`` — both end as a native
subscriber's tables (test_delta_equivalence's workload), delta-rs committing from the client / driver process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from airflow_provider_pglogical.apply.sparkenv import spark_submit_env
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database
from scripts.harness.subscriber import run_script, subscribe, unsubscribe, wait_for_subscriber
from scripts.harness.userenv import run_as_user, venv_script
from tests.integration.test_delta_equivalence import delta_rows
from tests.integration.test_native_equivalence import (
    BATCH_ONE,
    BATCH_TWO,
    PRE_EXISTING_SQL,
    PUBLICATIONS_SQL,
    TABLES,
    TABLES_SQL,
    table_rows,
)
from tests.integration.test_spark_connect import SPEC_TABLES
from tests.support.sparkconnect import DRIVER_KEY, EXECUTOR_KEY, s3_env, spark_connect  # noqa: F401 (fixture)

APP = str(Path(__file__).resolve().parents[2] / "spark_apps" / "apply_spec.py")


def native_view(native_dsn: str, table: str) -> list[tuple]:
    """The subscriber's rows as the Delta mirror holds them (``cols`` has a column list: id, a, b)."""
    rows = table_rows(native_dsn, table)
    return [(r[0], r[1], r[3]) for r in rows] if table == "cols" else rows


@pytest.mark.parametrize("where", ["connect", "submit"])
def test_the_delta_apply_runs_where_the_spec_says_spark_runs(pg_server, tmp_path, request, where):
    source, native = make_database(pg_server), make_database(pg_server)
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, TABLES_SQL + PUBLICATIONS_SQL + PRE_EXISTING_SQL)
    execute(native_dsn, TABLES_SQL)
    subscribe(source_dsn, native_dsn)
    PgLogicalHook.from_dsn(source_dsn).create_slot("ours")
    lake = DeltaLocation(str(tmp_path / "lake"))
    connect = request.getfixturevalue("spark_connect") if where == "connect" else None  # started for this only
    if connect is not None:
        staging, spark, env = (f"s3://{connect.s3.bucket}/{tmp_path.name}/staging", {"remote": connect.url},
                               s3_env(connect.s3, DRIVER_KEY))
    else:
        staging, spark, env = str(tmp_path / "staging"), {"master": "local[2]"}, spark_submit_env("local[2]", sys.executable)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "source": {"dsn": pg_server.uri(source), "publication": "pub_all", "slot": "ours"},
        "staging": {"uri": staging}, "target": {"kind": "delta", "uri": lake.uri}, "tables": SPEC_TABLES,
        "spark": spark}))
    recorded = connect.requests if connect is not None else None
    try:
        if recorded is not None:
            recorded.start()
        for script in (BATCH_ONE, BATCH_TWO):
            run_script(source_dsn, script)
            if connect is not None:
                result = run_as_user([venv_script("pglogical"), "run", "--spec", str(spec)], env, timeout=600)
                assert result.returncode == 0, result.stderr[-3000:]
                applied = json.loads(result.stdout)["apply"]
            else:
                decoded = run_as_user([venv_script("pglogical"), "decode", "--spec", str(spec)], env, timeout=600)
                assert decoded.returncode == 0, decoded.stderr[-3000:]
                result = run_as_user([venv_script("spark-submit"), "--master", "local[2]", "--conf",
                                      "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
                                      APP, "--spec", str(spec)], env, timeout=600)
                assert result.returncode == 0, result.stderr[-3000:]
                applied = json.loads(result.stdout.strip().splitlines()[-1])
            assert applied["batches_applied"] == 1, applied
        if recorded is not None:
            recorded.stop()
        wait_for_subscriber(source_dsn, native_dsn)
        for table in TABLES:
            if table == "toast_rf":  # test_native_equivalence's stated deviation
                assert delta_rows(lake, table) == [(120, 2, "w" * 9000)]
                continue
            assert delta_rows(lake, table) == native_view(native_dsn, table), table
        assert delta_rows(lake, "child") == [(50, 5, "c5")]  # not vacuous: the transforms happened
        if recorded is not None:  # the server's executors read every row-change file, the client none of them
            assert recorded.reads(EXECUTOR_KEY, "/tables/") > 0
            assert recorded.reads(DRIVER_KEY, "/tables/") == 0
    finally:
        if recorded is not None:
            recorded.stop()
        unsubscribe(native_dsn)
        for db in (native, source):
            execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
