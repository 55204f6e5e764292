"""A pipeline DAG of a Delta-target spec that reaches Spark by spark-submit (``spark.conn_id``) in a real
``airflow dags test``: the apply task submits ``spark_apps/apply_spec.py --spec`` on the spark connection
(``local[2]`` here, as the developers' guide sets ``spark_default``) instead of starting Spark in the worker, and the
Delta tables end as a native subscriber's."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.history.store import RunHistory
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.subscriber import run_script
from tests.support.remote_specs import BATCH_ONE, BATCH_TWO, SLOT, Databases, assert_delta_equals_native, write_spec

TEST_DAGS = Path(__file__).parent / "dags"
DAG_ID = "pglogical_test_lake_submit"


def test_a_delta_target_dag_with_a_spark_connection_applies_through_spark_submit(pg_server, airflow, tmp_path):
    dbs = Databases(pg_server)
    try:
        dbs.subscribe()
        PgLogicalHook.from_dsn(dbs.source).create_slot(SLOT)
        lake, staging = DeltaLocation(str(tmp_path / "lake")), str(tmp_path / "staging")
        spec = write_spec(tmp_path / "spec.yaml", source={"conn_id": "pgl_source"}, staging=staging,
                          target={"kind": "delta", "uri": lake.uri}, spark={"conn_id": "spark_default"})
        for script in (BATCH_ONE, BATCH_TWO):
            run_script(dbs.source, script)
        env = {"AIRFLOW_CONN_PGL_SOURCE": dbs.uri("source"), "PGLOGICAL_TEST_LAKE_SUBMIT_SPEC": str(spec),
               "AIRFLOW__CORE__DAGS_FOLDER": str(TEST_DAGS)}
        result = airflow.run("dags", "test", DAG_ID, env=env, timeout=1500)
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "state=success" in output, output[-6000:]
        assert "apply_spec.py" in output and "--spec" in output, output[-6000:]  # spark-submit's command line
        assert_delta_equals_native(dbs, lake)
        # The apply's record in the run history says which process applied: the submitted app, not the worker.
        applies = [r for r in RunHistory.from_uri(staging, SLOT).records() if r.kind == "apply"]
        assert [r.tool for r in applies] == ["spark-submit"], applies
        assert applies[0].batches_applied == 1, applies
    finally:
        dbs.drop()
