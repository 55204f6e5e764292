"""An S3 staging root reached through an Airflow AWS connection (``staging.conn_id``) in a real ``airflow dags test``.

The S3 server is moto's (tests/s3server.py); the Airflow process has no ``AWS_*`` variable at all: the decode task
reaches the bucket only through ``AIRFLOW_CONN_STAGING_S3`` (resolved by the Amazon provider's ``AwsBaseHook``),
and the apply's spark-submit process only through the variables the apply operator gives it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from scripts.harness.pgserver import drop_database, execute, make_database
from scripts.harness.pgserver import query as rows
from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, s3_server
from tests.support.staging_dags import ITEMS, dag_env, run_dag_after_workload, source_items

TEST_DAGS = Path(__file__).parent / "dags"
DAG_ID = "pglogical_test_s3_staging"


def test_a_pipeline_dag_stages_to_s3_and_applies_from_it_with_only_an_airflow_aws_connection(
        pg_server, airflow, tmp_path):
    src, dw = make_database(pg_server), make_database(pg_server)
    try:
        with s3_server() as s3:
            spec = tmp_path / "spec.yaml"
            spec.write_text(yaml.safe_dump({
                "source": {"conn_id": "pgl_source", "publication": "items_pub", "slot": "s3_slot", "create": True},
                "staging": {"uri": f"s3://{s3.bucket}/staging", "conn_id": "staging_s3"},
                "target": {"kind": "postgres", "conn_id": "pgl_target"},
                "tables": {"public.items": {}}}))
            env = dag_env(pg_server, src, dw, spec, "staging_s3", {
                "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                "extra": {"region_name": REGION, "endpoint_url": s3.endpoint}}, TEST_DAGS)
            assert not any(k.startswith("AWS_") for k in {**airflow.env, **env})
            execute(pg_server.dsn(dw), ITEMS)
            output = run_dag_after_workload(airflow, DAG_ID, env, pg_server.dsn(src), spec)
            assert SECRET_KEY not in output
            staged = s3.keys("staging/s3_slot/batches/")
            assert any(k.endswith("/_manifest.json") for k in staged), staged
            assert rows(pg_server.dsn(dw), "SELECT * FROM items ORDER BY id") == source_items(pg_server.dsn(src))
    finally:
        drop_database(pg_server, dw)
        drop_database(pg_server, src)
