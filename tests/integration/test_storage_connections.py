"""`pglogical run` reaching S3 staging and a Delta target on S3 through Airflow AWS connections alone.

The command runs as a user runs it (tests/userenv.py): no ``AWS_*`` variable anywhere, the connections given as
``AIRFLOW_CONN_*``; ``staging.conn_id`` and ``target.conn_id`` are resolved by the Amazon provider's
``AwsBaseHook`` in the command's own process. The S3 server is moto's (tests/s3server.py).
"""

from __future__ import annotations

import json

import yaml
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from scripts.harness.pgserver import execute, query
from scripts.harness.userenv import default_home, user_env
from tests.integration.test_cli import pglogical
from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, s3_server
from tests.support.spark import TEST_SPARK_CONF


def aws_connection(endpoint: str) -> str:
    return json.dumps({"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                       "extra": {"region_name": REGION, "endpoint_url": endpoint}})


def test_run_stages_to_s3_and_applies_into_delta_on_s3_with_only_airflow_aws_connections(pg_server, pg_dsn,
                                                                                         pg_dbname, tmp_path):
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, name text)")
    with s3_server() as s3:
        lake = f"s3://{s3.bucket}/lake"
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump({
            "source": {"dsn": pg_server.uri(pg_dbname), "publication": "items_pub", "slot": "items_slot",
                       "create": True},
            "staging": {"uri": f"s3://{s3.bucket}/staging", "conn_id": "staging_s3"},
            "target": {"kind": "delta", "uri": lake, "conn_id": "lake_s3"},
            "tables": {"public.items": {}}, "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)}}))
        env = {"AIRFLOW_CONN_STAGING_S3": aws_connection(s3.endpoint), "AIRFLOW_CONN_LAKE_S3": aws_connection(s3.endpoint)}
        assert not any(name.startswith("AWS_") for name in user_env(default_home(), env))  # what the command gets
        first = pglogical("run", "--spec", str(spec), extra=env)  # publication and slot
        assert first.returncode == 0, first.stderr[-3000:]
        execute(pg_dsn, "INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 20) g; "
                        "UPDATE items SET name = 'renamed' WHERE id = 3; DELETE FROM items WHERE id > 15")
        second = pglogical("run", "--spec", str(spec), extra=env)
        assert second.returncode == 0, second.stderr[-3000:]
        assert SECRET_KEY not in second.stdout + second.stderr
        assert any(k.endswith("/_manifest.json") for k in s3.keys("staging/items_slot/batches/"))
        options = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
                   "AWS_ENDPOINT_URL": s3.endpoint, "AWS_ALLOW_HTTP": "true"}
        table = DeltaTable(DeltaLocation(lake).table_uri("public.items"), storage_options=options)
        got = sorted((r["id"], r["name"]) for r in table.to_pyarrow_table().to_pylist())
        assert got == query(pg_dsn, "SELECT id, name FROM items ORDER BY id") and len(got) == 15

        without = pglogical("status", "--spec", str(spec))  # no connection: the staging root is out of reach
        assert without.returncode != 0 and "staging_s3" in without.stderr


def test_an_initial_snapshot_read_by_two_reader_processes_reaches_s3_staging_through_the_connection(
        pg_server, pg_dsn, pg_dbname, tmp_path):
    """The reader processes have no registry of their own: the staging credentials reach them in their
    environment. (Only the staging is checked: applying a snapshot staged on S3 reads it with Spark's own
    reader, which has no s3 filesystem here.)"""
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, name text); CREATE TABLE tags (id int PRIMARY KEY);"
                    "INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 10) g;"
                    "INSERT INTO tags SELECT generate_series(1, 7)")
    with s3_server() as s3:
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump({
            "source": {"dsn": pg_server.uri(pg_dbname), "publication": "snap_pub", "slot": "snap_slot",
                       "create": True},
            "staging": {"uri": f"s3://{s3.bucket}/staging", "conn_id": "staging_s3"},
            "target": {"kind": "delta", "uri": f"s3://{s3.bucket}/lake", "conn_id": "lake_s3"},
            "tables": {"public.items": {}, "public.tags": {}},
            "snapshot": {"initial": True, "parallelism": 2}}))  # two tables: two reader processes
        env = {"AIRFLOW_CONN_STAGING_S3": aws_connection(s3.endpoint)}
        decoded = pglogical("decode", "--spec", str(spec), extra=env)  # slot, exported snapshot, both tables staged
        assert decoded.returncode == 0, decoded.stderr[-3000:]
        chunks = [k for k in s3.keys("staging/snap_slot/") if k.endswith(".parquet") and "/chunks/" in k]
        assert {k.split("/")[3] for k in chunks} >= {"public.items", "public.tags"}, chunks
