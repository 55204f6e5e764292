"""`pglogical run`, `status` and `maintain` with an Iceberg target whose SQL catalog lives in PostgreSQL, as a user
runs them (tests/userenv.py); the tables read back with pyiceberg."""

from __future__ import annotations

import copy
import json

import yaml

from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from airflow_provider_pglogical.exceptions import format_lsn
from scripts.harness.pgserver import execute, make_database
from tests.integration.test_cli import SCHEMA, TABLES, pglogical
from tests.support.spark import TEST_SPARK_CONF


def test_run_applies_into_iceberg_with_a_postgres_catalog_and_status_and_maintain_follow(pg_server, pg_dsn,
                                                                                         pg_dbname, tmp_path):
    execute(pg_dsn, SCHEMA)
    catalog_db = make_database(pg_server)
    catalog = {"type": "sql", "uri": pg_server.uri(catalog_db).replace("postgresql://", "postgresql+psycopg2://", 1),
               "warehouse": str(tmp_path / "warehouse")}
    doc = {
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": "cli_pub", "slot": "cli_slot", "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "iceberg", "catalog": catalog, "namespace": "lake",
                   "partition_by": {"public.orders_eu": ["region"]}},
        "tables": copy.deepcopy(TABLES),
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    first = pglogical("run", "--spec", str(spec))  # creates publication and slot
    assert first.returncode == 0, first.stderr
    execute(pg_dsn, """INSERT INTO customers VALUES (1, 'ada'), (2, 'bob');
        INSERT INTO orders VALUES (10, 1, 500, 'EU', 'big'), (11, 2, 50, 'EU', 'small'), (12, 2, 900, 'US', 'us');
        UPDATE orders SET amount = 20 WHERE id = 10; UPDATE orders SET amount = 700 WHERE id = 11;
        UPDATE customers SET name = 'ada l.' WHERE id = 1;""")
    result = pglogical("run", "--spec", str(spec))
    assert result.returncode == 0, result.stderr
    execute(pg_dsn, "INSERT INTO customers VALUES (3, 'cy')")  # a new key only: a file of its own (copy-on-write)
    assert pglogical("run", "--spec", str(spec)).returncode == 0

    target = IcebergTarget(IcebergLocation(catalog, "lake"), "cli_slot")
    orders = target.open("public.orders_eu")
    assert orders is not None and [f.name for f in orders.spec().fields] == ["region"]
    assert [(r["id"], str(r["amount"]), r["region"], r["note"]) for r in orders.scan().to_arrow().to_pylist()] == \
        [(11, "700.00", "EU", "small")]
    customers = target.open("public.customers")
    assert customers is not None
    assert [(r["id"], r["name"]) for r in customers.scan().to_arrow().sort_by("id").to_pylist()] == \
        [(1, "ada l."), (2, "bob"), (3, "cy")]
    assert sorted(target.catalog.list_tables("lake")) == [("lake", "customers"), ("lake", "orders_eu")]

    status = pglogical("status", "--spec", str(spec))
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["target"]["kind"] == "iceberg"
    assert set(report["target"]["watermarks"]) == {"public.customers", "public.orders_eu"}
    assert report["target"]["watermarks"]["public.customers"] == report["staging"]["last_end_lsn"]

    files_before = len(list(customers.scan().plan_files()))
    assert files_before > 1
    maintained = pglogical("maintain", "--spec", str(spec), "--retention-hours", "0")
    assert maintained.returncode == 0, maintained.stderr
    counts = json.loads(maintained.stdout)["tables"]["public.customers"]
    assert counts["files_removed"] == files_before and counts["files_added"] == 1 and counts["snapshots"] == 1
    customers = target.open("public.customers")
    assert customers is not None and len(list(customers.scan().plan_files())) == 1
    assert [(r["id"], r["name"]) for r in customers.scan().to_arrow().sort_by("id").to_pylist()] == \
        [(1, "ada l."), (2, "bob"), (3, "cy")]
    assert format_lsn(target.watermark("public.customers") or 0) == report["target"]["watermarks"]["public.customers"]
