"""`pglogical run` and `status` with a Delta target on a real S3 server, as a user runs them: a subprocess whose
environment holds the credentials (never its argv), the tables read back with deltalake and DuckDB."""

from __future__ import annotations

import copy
import datetime as dt
import json
from decimal import Decimal

import duckdb
import yaml
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from scripts.harness.pgserver import execute
from tests.integration.test_cli import SCHEMA, TABLES, pglogical
from tests.support.spark import TEST_SPARK_CONF


def test_run_applies_into_delta_on_s3_and_status_shows_the_delta_watermarks(pg_server, pg_dsn, pg_dbname, tmp_path,
                                                                            s3):
    execute(pg_dsn, SCHEMA)
    lake = f"s3://{s3.bucket}/lake"
    doc = {
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": "cli_pub", "slot": "cli_slot", "create": True},
        "staging": {"uri": f"s3://{s3.bucket}/staging"},
        "target": {"kind": "delta", "uri": lake, "partition_by": {"public.orders_eu": ["region"]}},
        "tables": copy.deepcopy(TABLES),  # tests change their spec in place
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    env = s3.env()  # the credentials the user exports, nothing else (scripts/harness/userenv.py)
    first = pglogical("run", "--spec", str(spec), extra=env)  # creates publication and slot
    assert first.returncode == 0, first.stderr
    execute(pg_dsn, """INSERT INTO customers VALUES (1, 'ada'), (2, 'bob');
        INSERT INTO orders VALUES (10, 1, 500, 'EU', 'big'), (11, 2, 50, 'EU', 'small'), (12, 2, 900, 'US', 'us');
        UPDATE orders SET amount = 20 WHERE id = 10; UPDATE orders SET amount = 700 WHERE id = 11;
        UPDATE customers SET name = 'ada l.' WHERE id = 1;""")
    result = pglogical("run", "--spec", str(spec), extra=env)
    assert result.returncode == 0, result.stderr
    assert s3.env()["AWS_SECRET_ACCESS_KEY"] not in result.stdout + result.stderr
    location = DeltaLocation(lake)
    orders = DeltaTable(location.table_uri("public.orders_eu")).to_pyarrow_table().to_pylist()
    assert [(r["id"], str(r["amount"]), r["region"], r["note"]) for r in orders] == [(11, "700.00", "EU", "small")]
    customers = DeltaTable(location.table_uri("public.customers")).to_pyarrow_table().sort_by("id").to_pylist()
    assert [(r["id"], r["name"]) for r in customers] == [(1, "ada l."), (2, "bob")]
    assert DeltaTable(location.table_uri("public.orders_eu")).metadata().partition_columns == ["region"]

    status = pglogical("status", "--spec", str(spec), extra=env)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["target"]["kind"] == "delta"
    assert set(report["target"]["watermarks"]) == {"public.customers", "public.orders_eu"}
    assert report["target"]["watermarks"]["public.orders_eu"] == report["staging"]["last_end_lsn"]



def test_run_with_s3_staging_writes_pg_lsn_and_timestamps_as_local_staging_does(pg_server, pg_dsn, pg_dbname,
                                                                               tmp_path, s3):
    """pg_lsn (staged uint64) and timestamp without time zone, staged on S3: Delta decimal(20,0) and timestamp_ntz,
    as from local staging (docs/types.md), instead of a stopped run or a zoned timestamp."""
    execute(pg_dsn, "CREATE TABLE marks (id int PRIMARY KEY, at pg_lsn, seen timestamp, m money)")
    lake = f"s3://{s3.bucket}/lake"
    doc = {
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": "marks_pub", "slot": "marks_slot", "create": True},
        "staging": {"uri": f"s3://{s3.bucket}/staging"},
        "target": {"kind": "delta", "uri": lake},
        "tables": {"public.marks": {}},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    env = s3.env()
    first = pglogical("run", "--spec", str(spec), extra=env)
    assert first.returncode == 0, first.stderr
    execute(pg_dsn, """INSERT INTO marks VALUES (1, 'FFFFFFFF/FFFFFFFF', '9999-12-31 23:59:59.999999', NULL),
        (2, '0/0', '0001-01-01 00:00:00', '92233720368547758.07'), (3, NULL, NULL, '-92233720368547758.08')""")
    result = pglogical("run", "--spec", str(spec), extra=env)
    assert result.returncode == 0, result.stderr
    table = DeltaTable(DeltaLocation(lake).table_uri("public.marks"))
    types = {f.name: f.type.type for f in table.schema().fields}
    assert (types["at"], types["seen"], types["m"]) == ("decimal(20,0)", "timestamp_ntz", "decimal(19,2)")
    rows = table.to_pyarrow_table().sort_by("id").to_pylist()
    assert [(r["at"], r["seen"], r["m"]) for r in rows] == [
        (Decimal(2**64 - 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), None),
        (Decimal(0), dt.datetime(1, 1, 1), Decimal("92233720368547758.07")),
        (None, None, Decimal("-92233720368547758.08"))]


def test_maintain_compacts_a_delta_target_keeping_rows_and_watermarks(tmp_path):
    from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
    from tests.unit.apply.delta.test_delta_target import apply, rows_of

    location = DeltaLocation(str(tmp_path / "lake"))
    target = DeltaTarget(location, "s")
    for i in range(5):  # five batches: five small files
        apply(target, i * 10, i * 10 + 10, [("I", [], None, i, i, f"r{i}")])
    before = rows_of(location)
    doc = {"source": {"dsn": "postgresql://unused@127.0.0.1:1/x", "publication": "p", "slot": "s"},
           "staging": {"uri": str(tmp_path / "staging")},
           "target": {"kind": "delta", "uri": location.uri}, "tables": {"public.t": {}}}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    result = pglogical("maintain", "--spec", str(spec), "--retention-hours", "0")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["tables"]["public.t"]
    assert report["files_removed"] == 5 and report["files_added"] == 1 and report["files_vacuumed"] == 5
    assert rows_of(location) == before and target.watermark("public.t") == 50
    files = DeltaTable(location.table_uri("public.t")).file_uris()
    assert len(files) == 1
    # Another reader: DuckDB over the snapshot's files (its delta extension is not installable offline).
    assert duckdb.connect().execute("SELECT count(*) FROM read_parquet(?)", [files]).fetchone() == (5,)
