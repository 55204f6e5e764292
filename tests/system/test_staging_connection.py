"""An S3 staging root reached through an Airflow AWS connection (``staging.conn_id``) in a real ``airflow dags test``.

The S3 server is moto's (tests/s3server.py); the Airflow process has no ``AWS_*`` variable at all: the decode task
reaches the bucket only through ``AIRFLOW_CONN_STAGING_S3`` (resolved by the Amazon provider's ``AwsBaseHook``),
and the apply's spark-submit process only through the variables the apply operator gives it.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from scripts.harness.pgserver import drop_database, execute, make_database
from scripts.harness.pgserver import query as rows
from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, s3_server

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
            env = {"AIRFLOW_CONN_PGL_SOURCE": pg_server.uri(src), "AIRFLOW_CONN_PGL_TARGET": pg_server.uri(dw),
                   "AIRFLOW_CONN_STAGING_S3": json.dumps({
                       "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                       "extra": {"region_name": REGION, "endpoint_url": s3.endpoint}}),
                   "PGLOGICAL_TEST_SPEC": str(spec), "AIRFLOW__CORE__DAGS_FOLDER": str(TEST_DAGS)}
            assert not any(k.startswith("AWS_") for k in {**airflow.env, **env})
            execute(pg_server.dsn(src), "CREATE TABLE items (id int PRIMARY KEY, name text)")
            execute(pg_server.dsn(dw), "CREATE TABLE items (id int PRIMARY KEY, name text)")
            first = airflow.run("dags", "test", DAG_ID, env=env, timeout=1200)  # publication and slot
            assert first.returncode == 0 and "state=success" in first.stdout + first.stderr, \
                (first.stdout + first.stderr)[-6000:]
            execute(pg_server.dsn(src), "INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 50) g; "
                                        "UPDATE items SET name = 'renamed' WHERE id <= 5; DELETE FROM items WHERE id > 45")
            second = airflow.run("dags", "test", DAG_ID, env=env, timeout=1200)
            output = second.stdout + second.stderr
            assert second.returncode == 0 and "state=success" in output, output[-6000:]
            assert SECRET_KEY not in output
            staged = s3.keys("staging/s3_slot/batches/")
            assert any(k.endswith("/_manifest.json") for k in staged), staged
            assert rows(pg_server.dsn(dw), "SELECT * FROM items ORDER BY id") == \
                rows(pg_server.dsn(src), "SELECT * FROM items ORDER BY id")
            assert len(rows(pg_server.dsn(dw), "SELECT * FROM items")) == 45
    finally:
        drop_database(pg_server, dw)
        drop_database(pg_server, src)
