"""``pglogical run`` over Spark Connect (and classic Spark) with S3 staging: the native-equivalence workload (row filters, key changes,
TOAST, TRUNCATE cascades) ends as a native subscriber's tables, and the staged row changes are read by the Connect
server's executors only — the client, whose S3 key differs, reads manifests and metadata but no row-change file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pglogical.apply.sparkenv import SESSION_CONF
from airflow_provider_pglogical.exceptions import SparkStartError
from airflow_provider_pglogical.hooks import PgLogicalHook
from airflow_provider_pglogical.pipeline.connect_session import KeptSession, session_key
from airflow_provider_pglogical.pipeline.runs import new_spark_session
from scripts.harness.subscriber import run_script, wait_for_subscriber
from scripts.harness.userenv import run_as_user, venv_script
from tests.integration.test_native_equivalence import TABLES_SQL, table_rows
from tests.support.cluster import spark_connect  # noqa: F401 (fixture)
from tests.support.remote_specs import (
    BATCH_ONE,
    BATCH_TWO,
    SLOT,
    Databases,
    assert_postgres_equals_native,
    write_spec,
)
from tests.support.spark import TEST_SPARK_CONF
from tests.support.sparkconnect import DRIVER_KEY, EXECUTOR_KEY, s3_env

# Our target lacks rf_full and rf_key: the apply creates them.
OURS_SQL = "".join(s + ";" for s in TABLES_SQL.split(";") if s.strip() and "rf_full" not in s and "rf_key" not in s)


@pytest.mark.parametrize("where", ["connect", "classic"])
def test_run_matches_a_native_subscriber_reading_s3_on_the_executors_only(
        pg_server, spark_connect, tmp_path, monkeypatch, where):  # noqa: F811 (the fixture imported above)
    """Over the Connect server, and with a classic local session whose executors are given their S3 key by the
    spec's ``spark.executorEnv.*`` settings (a cluster's executors get theirs the same way, or from their hosts)."""
    dbs = Databases(pg_server, ours_sql=OURS_SQL)
    dbs.subscribe()
    PgLogicalHook.from_dsn(dbs.source).create_slot(SLOT)
    spec = write_spec(
        tmp_path / "spec.yaml", source={"dsn": dbs.uri("source")},
        staging=f"s3://{spark_connect.s3.bucket}/{tmp_path.name}/staging",
        target={"kind": "postgres", "dsn": dbs.uri("ours")},
        spark={"remote": spark_connect.url} if where == "connect" else {
            "master": "local[2]",
            "conf": {**TEST_SPARK_CONF,
                     **{f"spark.executorEnv.{k}": v for k, v in s3_env(spark_connect.s3, EXECUTOR_KEY).items()}}})
    driver_env = s3_env(spark_connect.s3, DRIVER_KEY)  # what the user exports: not the executors' key
    if where == "classic":
        # A local master lets this process read the staged files itself (``batches.readable_here``) and apply
        # covered batches without Spark (tests/integration/test_object_store_direct.py); this test's subject is the
        # executors reading S3 with the key their spec gives them, so every batch goes through Spark here.
        driver_env["PGLOGICAL_APPLY_DIRECT"] = "0"
    recorded = spark_connect.requests
    try:
        recorded.start()
        for script in (BATCH_ONE, BATCH_TWO):  # one batch (test_native_equivalence applies them as two)
            run_script(dbs.source, script)
        result = run_as_user([venv_script("pglogical"), "run", "--spec", str(spec)], driver_env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(result.stdout)
        assert report["apply"]["batches_applied"] == 1, report
        recorded.stop()
        assert_postgres_equals_native(dbs)
        # The executors read the row-change files (and hashed them); over Connect the client read none of them
        # (with a local master the driver is this process, which reads the files' footers to plan).
        assert recorded.reads(EXECUTOR_KEY, "/tables/") > 0
        if where == "connect":
            assert recorded.reads(DRIVER_KEY, "/tables/") == 0
        assert recorded.reads(DRIVER_KEY, "_manifest.json") > 0  # the client planned from the manifests
        if where == "connect":
            monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
            assert_the_session_is_kept_and_reopened(dbs, spec, driver_env, spark_connect.url, report,
                                                    tmp_path / "cache")
    finally:
        recorded.stop()
        dbs.drop()



@contextmanager
def connect_client_here() -> Iterator[None]:
    """pyspark marks the whole process a Spark Connect client (``SPARK_CONNECT_MODE_ENABLED``) when it opens a
    Connect session and never unmarks it: a local session asked for later in this test process (the suite's
    ``spark`` fixture in the next module) would then fail with ``CONNECT_URL_NOT_SET``. Undone once the Connect
    sessions opened here are stopped."""
    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        else:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = before


def assert_the_session_is_kept_and_reopened(dbs: Databases, spec: Path, driver_env: dict[str, str], url: str,
                                            report: dict[str, Any], cache: Path) -> None:
    """The run left its Connect session open on the server (the next run's Python workers are warm); a setting
    another client put on it is gone when a run reopens it; once the server closed it, a run opens a new one by
    itself, and a URL naming it says to remove the id."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    kept = report["spark"]["connect_session"]
    with connect_client_here():
        client = ConnectSession.builder.remote(f"{url}/;session_id={kept}").create()
        client.release_session_on_close = False  # type: ignore[attr-defined]
        client.conf.set("spark.sql.files.ignoreCorruptFiles", "true")  # an operator attached with the run's id
        client.stop()
        # Reopened here as a run reopens it (this process's cache holding the id): no second run needed.
        seeded = KeptSession(session_key(url, "pipeline", SESSION_CONF), cache / "pglogical" / "connect")
        seeded.path.parent.mkdir(parents=True)
        seeded.path.write_text(kept)
        reopened = new_spark_session(url, pipeline="pipeline")
        try:
            assert reopened.session_id == kept  # left open: a released session would be refused and renewed
            names = ("spark.sql.files.ignoreCorruptFiles", "spark.sql.caseSensitive", "spark.sql.session.timeZone")
            settings = {k: reopened.conf.get(k) for k in names}
            assert settings == {"spark.sql.files.ignoreCorruptFiles": "false", "spark.sql.caseSensitive": "true",
                                "spark.sql.session.timeZone": "UTC"}  # the server's own setting stays
        finally:
            reopened.release_session_on_close = True  # type: ignore[attr-defined]
            reopened.stop()  # releases it: the server closes the session for good
        with pytest.raises(SparkStartError, match=f"closed the session {kept} .*: remove session_id from the URL"):
            new_spark_session(f"{url}/;session_id={kept}", pipeline="pipeline")
    # The way out: the spec's URL names no session_id, and its next run opens a session of its own.
    run_script(dbs.source, ["UPDATE cols SET a = 'a2c' WHERE id = 2;"])
    result = run_as_user([venv_script("pglogical"), "run", "--spec", str(spec)], driver_env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    again = json.loads(result.stdout)
    assert again["apply"]["spark_started"] and again["spark"]["connect_session"] not in (None, kept), again
    wait_for_subscriber(dbs.source, dbs.native)
    rows = table_rows(dbs.ours, "cols")
    assert rows == table_rows(dbs.native, "cols") and [r[:2] for r in rows] == [(2, "a2c")]
