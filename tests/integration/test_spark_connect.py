"""``pglogical run`` over Spark Connect (and classic Spark) with S3 staging: the native-equivalence workload (row filters, key changes,
TOAST, TRUNCATE cascades) ends as a native subscriber's tables, and the staged row changes are read by the Connect
server's executors only — the client, whose S3 key differs, reads manifests and metadata but no row-change file."""

from __future__ import annotations

import json

import pytest
import yaml

from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import run_script, subscribe, unsubscribe, wait_for_subscriber
from scripts.harness.userenv import run_as_user, venv_script
from tests.integration.test_native_equivalence import (
    BATCH_ONE,
    BATCH_TWO,
    PRE_EXISTING_SQL,
    PUBLICATIONS_SQL,
    TABLES,
    TABLES_SQL,
    table_rows,
)
from tests.support.spark import TEST_SPARK_CONF
from tests.support.sparkconnect import DRIVER_KEY, EXECUTOR_KEY, s3_env, spark_connect  # noqa: F401 (fixture)

# test_native_equivalence's APPLY_TABLES as a spec's tables.
SPEC_TABLES = {
    "public.rf_full": {"row_filter": "grp >= 5"},
    "public.rf_key": {"row_filter": "id > 100"},
    "public.rf_null": {"row_filter": "flag"},
    "public.cols": {"columns": ["id", "a", "b"]},
    "public.toasty": {},
    "public.toast_rf": {"row_filter": "id > 100", "unchanged_toast": "reject_and_continue"},
    "public.parent": {},
    "public.child": {},
    "public.seqd": {},
}


@pytest.mark.parametrize("where", ["connect", "classic"])
def test_run_matches_a_native_subscriber_reading_s3_on_the_executors_only(
        pg_server, spark_connect, tmp_path, where):  # noqa: F811 (the fixture imported above)
    """Over the Connect server, and with a classic local session whose executors are given their S3 key by the
    spec's ``spark.executorEnv.*`` settings (a cluster's executors get theirs the same way, or from their hosts)."""
    source, native, ours = make_database(pg_server), make_database(pg_server), make_database(pg_server)
    source_dsn, native_dsn, ours_dsn = pg_server.dsn(source), pg_server.dsn(native), pg_server.dsn(ours)
    execute(source_dsn, TABLES_SQL + PUBLICATIONS_SQL + PRE_EXISTING_SQL)
    execute(native_dsn, TABLES_SQL)
    execute(ours_dsn, "".join(s + ";" for s in TABLES_SQL.split(";") if s.strip() and "rf_full" not in s
                              and "rf_key" not in s))
    subscribe(source_dsn, native_dsn)
    PgLogicalHook.from_dsn(source_dsn).create_slot("ours")
    staging = f"s3://{spark_connect.s3.bucket}/{tmp_path.name}/staging"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "source": {"dsn": pg_server.uri(source), "publication": "pub_all", "slot": "ours"},
        "staging": {"uri": staging},
        "target": {"kind": "postgres", "dsn": pg_server.uri(ours)},
        "tables": SPEC_TABLES,
        "spark": {"remote": spark_connect.url} if where == "connect" else {
            "master": "local[2]",
            "conf": {**TEST_SPARK_CONF,
                     **{f"spark.executorEnv.{k}": v for k, v in s3_env(spark_connect.s3, EXECUTOR_KEY).items()}}},
    }))
    driver_env = s3_env(spark_connect.s3, DRIVER_KEY)  # what the user exports: not the executors' key
    recorded = spark_connect.requests
    try:
        recorded.start()
        for script in (BATCH_ONE, BATCH_TWO):
            run_script(source_dsn, script)
            result = run_as_user([venv_script("pglogical"), "run", "--spec", str(spec)], driver_env, timeout=600)
            assert result.returncode == 0, result.stderr[-3000:]
            report = json.loads(result.stdout)
            assert report["apply"]["batches_applied"] == 1, report
        recorded.stop()
        wait_for_subscriber(source_dsn, native_dsn)
        for table in TABLES:
            if table == "toast_rf":  # test_native_equivalence's stated deviation is not part of this workload
                assert table_rows(ours_dsn, table) == [(120, 2, "w" * 9000)]
                continue
            assert table_rows(ours_dsn, table) == table_rows(native_dsn, table), table
        assert table_rows(native_dsn, "rf_full") == [(2, 6, "b"), (4, 9, "d2")]  # the transforms happened
        assert table_rows(native_dsn, "child") == [(50, 5, "c5")]
        seq = "SELECT last_value, is_called FROM seqd_id_seq"
        assert query(ours_dsn, seq) == query(native_dsn, seq)
        # The executors read every row-change file (and hashed it); the client read none of them.
        assert recorded.reads(EXECUTOR_KEY, "/tables/") > 0
        assert recorded.reads(DRIVER_KEY, "/tables/") == 0
        assert recorded.reads(DRIVER_KEY, "_manifest.json") > 0  # the client planned from the manifests
    finally:
        recorded.stop()
        unsubscribe(native_dsn)
        for db in (native, source, ours):
            execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
