"""The Delta apply where the spec's Spark runs: ``pglogical run`` as a Spark Connect client (S3 staging read by the
server's executors only), and the spec app submitted with spark-submit to ``local[2]`` — both end as a native
subscriber's tables (test_delta_equivalence's workload), delta-rs committing from the client / driver process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from airflow_provider_pglogical.apply.sparkenv import spark_submit_env
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.subscriber import run_script
from scripts.harness.userenv import run_as_user, venv_script
from tests.support.cluster import spark_connect  # noqa: F401 (fixture)
from tests.support.remote_specs import BATCH_ONE, BATCH_TWO, SLOT, Databases, assert_delta_equals_native, write_spec
from tests.support.spark import TEST_JVM_OPTIONS
from tests.support.sparkconnect import DRIVER_KEY, EXECUTOR_KEY, s3_env

APP = str(Path(__file__).resolve().parents[2] / "spark_apps" / "apply_spec.py")


@pytest.mark.parametrize("where", ["connect", "submit"])
def test_the_delta_apply_runs_where_the_spec_says_spark_runs(pg_server, tmp_path, request, where):
    dbs = Databases(pg_server)
    dbs.subscribe()
    PgLogicalHook.from_dsn(dbs.source).create_slot(SLOT)
    lake = DeltaLocation(str(tmp_path / "lake"))
    connect = request.getfixturevalue("spark_connect") if where == "connect" else None  # (the cluster's)
    if connect is not None:
        staging, spark, env = (f"s3://{connect.s3.bucket}/{tmp_path.name}/staging", {"remote": connect.url},
                               s3_env(connect.s3, DRIVER_KEY))
    else:
        staging, spark, env = str(tmp_path / "staging"), {"master": "local[2]"}, spark_submit_env("local[2]", sys.executable)
    spec = write_spec(tmp_path / "spec.yaml", source={"dsn": dbs.uri("source")}, staging=staging,
                      target={"kind": "delta", "uri": lake.uri}, spark=spark)
    recorded = connect.requests if connect is not None else None
    try:
        if recorded is not None:
            recorded.start()
        for script in (BATCH_ONE, BATCH_TWO):  # one batch (test_native_equivalence applies them as two)
            run_script(dbs.source, script)
        if connect is not None:
            result = run_as_user([venv_script("pglogical"), "run", "--spec", str(spec)], env, timeout=600)
            assert result.returncode == 0, result.stderr[-3000:]
            applied = json.loads(result.stdout)["apply"]
        else:
            decoded = run_as_user([venv_script("pglogical"), "decode", "--spec", str(spec)], env, timeout=600)
            assert decoded.returncode == 0, decoded.stderr[-3000:]
            result = run_as_user([venv_script("spark-submit"), "--master", "local[2]", "--conf",
                                  "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
                                  "--conf", f"spark.driver.extraJavaOptions={TEST_JVM_OPTIONS}",
                                  APP, "--spec", str(spec)], env, timeout=600)
            assert result.returncode == 0, result.stderr[-3000:]
            applied = json.loads(result.stdout.strip().splitlines()[-1])
        assert applied["batches_applied"] == 1, applied
        if recorded is not None:
            recorded.stop()
        assert_delta_equals_native(dbs, lake)
        if recorded is not None:  # the server's executors read every row-change file, the client none of them
            assert recorded.reads(EXECUTOR_KEY, "/tables/") > 0
            assert recorded.reads(DRIVER_KEY, "/tables/") == 0
    finally:
        if recorded is not None:
            recorded.stop()
        dbs.drop()
