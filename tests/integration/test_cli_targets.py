"""Several targets from one slot, as a user runs them (`pglogical run`, `apply --target`, `status`): a PostgreSQL
reporting database and an Iceberg lake with their own table selections and row filters, each equal to a native
subscriber of a publication with that target's filters; a target that cannot be written leaves the other applying and
catches up exactly once after the way out."""

from __future__ import annotations

import json

import yaml

from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from scripts.harness.pgserver import drop_database, execute, make_database, query
from scripts.harness.subscriber import subscribe, unsubscribe, wait_for_subscriber
from tests.integration.test_cli import SCHEMA, pglogical
from tests.support.spark import TEST_SPARK_CONF

REPORTING_FILTER = "amount > 100"
LAKE_FILTER = "region = 'EU'"
# The native side: one publication per target, with that target's tables, filters and column lists.
NATIVE_PUBLICATIONS = f"""
CREATE PUBLICATION pub_reporting FOR TABLE orders (id, amount, region, note) WHERE ({REPORTING_FILTER}), customers;
CREATE PUBLICATION pub_lake FOR TABLE orders WHERE ({LAKE_FILTER});
"""
REPORTING_SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id int PRIMARY KEY, amount numeric(12,2) NOT NULL, region text NOT NULL, note text);
"""
LAKE_SCHEMA = """
CREATE TABLE orders (id int PRIMARY KEY, customer_id int, amount numeric(12,2) NOT NULL, region text NOT NULL,
                     note text);
"""
# Rows moving into and out of each filter (native: an UPDATE leaving a filter is a DELETE there, one entering an
# INSERT), a delete, and a row only one target's filter takes.
WORKLOAD = [
    """INSERT INTO customers VALUES (1, 'ada'), (2, 'bob');
       INSERT INTO orders VALUES (10, 1, 500, 'EU', 'big eu'), (11, 2, 50, 'EU', 'small eu'),
                                 (12, 2, 900, 'US', 'big us'), (13, 1, 20, 'US', 'small us')""",
    """UPDATE orders SET amount = 30 WHERE id = 10; UPDATE orders SET amount = 700 WHERE id = 11;
       UPDATE orders SET region = 'EU' WHERE id = 12; UPDATE customers SET name = 'ada l.' WHERE id = 1""",
    "DELETE FROM orders WHERE id = 13; INSERT INTO orders VALUES (14, 2, 150, 'US', 'mid us')",
]
LATER = [
    """UPDATE orders SET region = 'US' WHERE id = 10; UPDATE orders SET note = 'renamed' WHERE id = 14;
       INSERT INTO customers VALUES (3, 'cy'); INSERT INTO orders VALUES (15, 3, 999, 'EU', 'late')""",
    "DELETE FROM orders WHERE id = 11; UPDATE orders SET amount = amount + 1 WHERE id IN (12, 15)",
]


def reporting_rows(dsn: str) -> dict[str, list[tuple]]:
    return {"orders": query(dsn, "SELECT id, amount::text, region, note FROM orders ORDER BY id"),
            "customers": query(dsn, "SELECT id, name FROM customers ORDER BY id")}


def lake_rows(target: IcebergTarget) -> list[tuple]:
    table = target.open("public.orders")
    assert table is not None
    return sorted((r["id"], r["customer_id"], str(r["amount"]), r["region"], r["note"])
                  for r in table.scan().to_arrow().to_pylist())


def native_lake_rows(dsn: str) -> list[tuple]:
    return [tuple(r) for r in query(dsn, "SELECT id, customer_id, amount::text, region, note FROM orders ORDER BY id")]


def test_two_targets_from_one_slot_equal_native_subscribers_and_a_failing_one_catches_up(pg_server, pg_dsn,
                                                                                          pg_dbname, tmp_path):
    execute(pg_dsn, SCHEMA, NATIVE_PUBLICATIONS)
    reporting, catalog_db, native_reporting, native_lake = (make_database(pg_server) for _ in range(4))
    try:
        execute(pg_server.dsn(native_reporting), REPORTING_SCHEMA)
        execute(pg_server.dsn(native_lake), LAKE_SCHEMA)
        subscribe(pg_dsn, pg_server.dsn(native_reporting), "pub_reporting", "sub_reporting")
        subscribe(pg_dsn, pg_server.dsn(native_lake), "pub_lake", "sub_lake")
        catalog = {"type": "sql", "uri": pg_server.uri(catalog_db).replace("postgresql://", "postgresql+psycopg2://", 1),
                   "warehouse": str(tmp_path / "warehouse")}
        doc = {
            "source": {"dsn": pg_server.uri(pg_dbname), "publication": "fan_pub", "slot": "fan_slot", "create": True},
            "staging": {"uri": str(tmp_path / "staging"), "retention": {"keep_batches": 1}},
            "targets": {
                "reporting": {"kind": "postgres", "dsn": pg_server.uri(reporting),
                              "tables": {"public.orders": {"row_filter": REPORTING_FILTER,
                                                           "columns": ["id", "amount", "region", "note"]},
                                         "public.customers": {}}},
                "lake": {"kind": "iceberg", "catalog": catalog, "namespace": "lake",
                         "tables": {"public.orders": {"row_filter": LAKE_FILTER}}},
            },
            "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
        }
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        first = pglogical("run", "--spec", str(spec))  # one publication (the union) and one slot for both targets
        assert first.returncode == 0, first.stderr
        assert query(pg_dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'fan%'") == [(1,)]
        for sql in WORKLOAD:
            execute(pg_dsn, sql)
        run = pglogical("run", "--spec", str(spec))
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout)
        assert set(result["targets"]) == {"reporting", "lake"}
        assert result["decode"]["changes"] > 0

        wait_for_subscriber(pg_dsn, pg_server.dsn(native_reporting), "sub_reporting")
        wait_for_subscriber(pg_dsn, pg_server.dsn(native_lake), "sub_lake")
        lake = IcebergTarget(IcebergLocation(catalog, "lake"), "fan_slot")
        assert reporting_rows(pg_server.dsn(reporting)) == reporting_rows(pg_server.dsn(native_reporting))
        assert lake_rows(lake) == native_lake_rows(pg_server.dsn(native_lake))
        assert lake.open("public.customers") is None  # not in the lake's selection

        # The reporting database refuses writes: the lake applies on, the command fails naming reporting only.
        execute(pg_server.dsn(), f'ALTER DATABASE "{reporting}" SET default_transaction_read_only = on')
        for sql in LATER:  # two runs, two staged batches the reporting database does not take
            execute(pg_dsn, sql)
            failed = pglogical("run", "--spec", str(spec))
            assert failed.returncode == 1
            errors = [line for line in failed.stderr.splitlines() if ": error: " in line]
            assert len(errors) == 1 and errors[0].startswith("pglogical run: error: target reporting: "), failed.stderr
            assert "read-only transaction" in errors[0]
            partial = json.loads(failed.stdout)
            assert "error" in partial["targets"]["reporting"] and partial["targets"]["lake"]["batches_applied"] == 1
            wait_for_subscriber(pg_dsn, pg_server.dsn(native_lake), "sub_lake")
            assert lake_rows(lake) == native_lake_rows(pg_server.dsn(native_lake))

        status = pglogical("status", "--spec", str(spec))
        report = json.loads(status.stdout)
        targets = report["targets"]
        assert targets["reporting"]["kind"] == "postgres" and targets["lake"]["kind"] == "iceberg"
        assert targets["reporting"]["pending_batches"] == 2 and targets["reporting"]["lag_bytes"] > 0
        assert targets["lake"]["pending_batches"] == 0 and targets["lake"]["lag_bytes"] == 0
        assert targets["lake"]["watermarks"]["public.orders"] == report["staging"]["last_end_lsn"]
        # Retention keeps what reporting has not applied, though keep_batches is 1 and the lake is done with it.
        assert report["staging"]["batch_count"] >= 2

        # The way out: make the database writable again, then apply that target (or simply run again).
        execute(pg_server.dsn(), f'ALTER DATABASE "{reporting}" RESET default_transaction_read_only')
        caught_up = pglogical("apply", "--spec", str(spec), "--target", "reporting")
        assert caught_up.returncode == 0, caught_up.stderr
        assert list(json.loads(caught_up.stdout)["targets"]) == ["reporting"]
        wait_for_subscriber(pg_dsn, pg_server.dsn(native_reporting), "sub_reporting")
        assert reporting_rows(pg_server.dsn(reporting)) == reporting_rows(pg_server.dsn(native_reporting))
        again = pglogical("run", "--spec", str(spec))  # nothing applied twice
        assert again.returncode == 0, again.stderr
        assert all(t["batches_applied"] == 0 for t in json.loads(again.stdout)["targets"].values())
        assert reporting_rows(pg_server.dsn(reporting)) == reporting_rows(pg_server.dsn(native_reporting))
        assert lake_rows(lake) == native_lake_rows(pg_server.dsn(native_lake))
        done = json.loads(pglogical("status", "--spec", str(spec)).stdout)
        assert {t["lag_bytes"] for t in done["targets"].values()} == {0} and done["problems"] == []
        assert done["staging"]["batch_count"] == 1  # both done with the log: retention pruned it

        unknown = pglogical("apply", "--spec", str(spec), "--target", "nope")
        assert unknown.returncode == 1
        assert "--target nope: no such target; the spec's targets: reporting, lake" in unknown.stderr
    finally:
        for name, db in (("sub_reporting", native_reporting), ("sub_lake", native_lake)):
            try:
                unsubscribe(pg_server.dsn(db), name)
            except Exception:  # noqa: BLE001, S110 - the subscription may not have been created
                pass
            execute(pg_dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name = %s", params=(name,))
        for db in (reporting, catalog_db, native_reporting, native_lake):
            drop_database(pg_server, db)
