"""``pglogical drop --target NAME`` through the real CLI: one target of two retired (a PostgreSQL database beside an
Iceberg lake), the slot, publication, staging and the other target untouched; retention stops waiting for the retired
one, and the lake still equals a native subscriber. A target already removed from the spec is retired by the name its
staging records carry."""

from __future__ import annotations

import json

import psycopg2
import yaml

from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from airflow_provider_pglogical.staging.layout import StagingLayout
from airflow_provider_pglogical.staging.retention import positions, recorded_names
from scripts.harness.pgserver import drop_database, execute, make_database, query
from scripts.harness.subscriber import subscribe, unsubscribe, wait_for_subscriber
from tests.integration.test_cli import SCHEMA
from tests.integration.test_cli_targets import (
    LAKE_FILTER,
    LAKE_SCHEMA,
    LATER,
    REPORTING_FILTER,
    WORKLOAD,
    lake_rows,
    native_lake_rows,
    reporting_rows,
)
from tests.support.cli import create_replication, error_line, pglogical, run_ok
from tests.support.spark import TEST_SPARK_CONF

SLOT = "retire_slot"


def progress_rows(dsn: str) -> int:
    """The slot's rows in the reporting database's progress table."""
    return int(query(dsn, "SELECT count(*) FROM public.pglogical_progress WHERE slot = %s", (SLOT,))[0][0])


def test_retiring_one_of_two_targets_lets_retention_prune_what_the_other_applied(pg_server, pg_dsn, pg_dbname,
                                                                                  tmp_path):
    execute(pg_dsn, SCHEMA, f"CREATE PUBLICATION pub_lake FOR TABLE orders WHERE ({LAKE_FILTER})")
    reporting, catalog_db, native_lake = (make_database(pg_server) for _ in range(3))
    try:
        execute(pg_server.dsn(native_lake), LAKE_SCHEMA)
        subscribe(pg_dsn, pg_server.dsn(native_lake), "pub_lake", "sub_retire_lake")
        catalog = {"type": "sql", "uri": pg_server.uri(catalog_db).replace("postgresql://", "postgresql+psycopg2://", 1),
                   "warehouse": str(tmp_path / "warehouse")}
        lake_target = {"kind": "iceberg", "catalog": catalog, "namespace": "lake",
                       "tables": {"public.orders": {"row_filter": LAKE_FILTER}}}
        doc = {
            "source": {"dsn": pg_server.uri(pg_dbname), "publication": "retire_pub", "slot": SLOT, "create": True},
            "staging": {"uri": str(tmp_path / "staging"), "retention": {"keep_batches": 1}},
            "targets": {
                "reporting": {"kind": "postgres", "dsn": pg_server.uri(reporting),
                              "tables": {"public.orders": {"row_filter": REPORTING_FILTER}, "public.customers": {}}},
                "lake": lake_target,
            },
            "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
        }
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        create_replication(spec)  # what a first run would create, before the source changes
        for sql in WORKLOAD:
            execute(pg_dsn, sql)
        run_ok("run", "--spec", str(spec))
        reporting_dsn = pg_server.dsn(reporting)
        kept = reporting_rows(reporting_dsn)
        assert kept["orders"] and progress_rows(reporting_dsn) > 0

        # The reporting database stops taking writes: it falls behind, and retention keeps every batch for it.
        execute(pg_server.dsn(), f'ALTER DATABASE "{reporting}" SET default_transaction_read_only = on')
        for sql in LATER[:1]:
            execute(pg_dsn, sql)
            assert pglogical("run", "--spec", str(spec)).returncode == 1
        execute(pg_dsn, "UPDATE orders SET note = 'held' WHERE id = 12")
        assert pglogical("run", "--spec", str(spec)).returncode == 1
        held = run_ok("prune", "--spec", str(spec))
        assert held["pruned_batches"] == 0 and held["kept_batches"] >= 2 and held["held_by"] == [
            t for t in held["targets"] if t.startswith("postgres/")]
        execute(pg_server.dsn(), f'ALTER DATABASE "{reporting}" RESET default_transaction_read_only')

        layout = StagingLayout.from_uri(str(tmp_path / "staging"), SLOT)
        before = positions(layout)
        (reporting_id,) = [t for t in before if t.startswith("postgres/")]
        assert "confirm with --yes" in error_line(pglogical("drop", "--spec", str(spec), "--target", "reporting"))
        assert "drop --target retires one target and keeps it" in error_line(
            pglogical("drop", "--spec", str(spec), "--target", "reporting", "--staging", "--yes"))
        assert "--target nope: neither a target of the spec's targets: (reporting, lake)" in error_line(
            pglogical("drop", "--spec", str(spec), "--target", "nope", "--yes"))

        # A run holding the target's apply lock: refused, nothing dropped.
        holder = psycopg2.connect(reporting_dsn)
        try:
            with holder.cursor() as cur:
                cur.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"pglogical-apply:{SLOT}",))
            busy = error_line(pglogical("drop", "--spec", str(spec), "--target", "reporting", "--yes"))
            assert "PipelineBusyError" not in busy and "apply lock is held" in busy
        finally:
            holder.close()
        assert positions(layout) == before

        dry = run_ok("drop", "--spec", str(spec), "--target", "reporting", "--dry-run")
        assert dry["dry_run"] is True and dry["identity"] == reporting_id and dry["in_spec"] is True
        assert dry["bookkeeping"]["rows"]["public.pglogical_progress"] > 0 and len(dry["staging_records"]) == 2
        assert positions(layout) == before and progress_rows(reporting_dsn) > 0

        retired = run_ok("drop", "--spec", str(spec), "--target", "reporting", "--yes")
        assert retired["dry_run"] is False and retired["staging_records"] == dry["staging_records"]
        assert progress_rows(reporting_dsn) == 0
        assert reporting_rows(reporting_dsn) == kept  # the user's tables and rows stay
        assert reporting_id not in positions(layout) and set(positions(layout)) == set(before) - {reporting_id}
        again = run_ok("drop", "--spec", str(spec), "--target", "reporting", "--yes")  # idempotent
        assert sum(again["bookkeeping"]["rows"].values()) == 0 and again["staging_records"] == []
        # Still listed in the spec: its apply stops, naming the way out, instead of applying every batch again.
        still = pglogical("apply", "--spec", str(spec), "--target", "reporting")
        assert still.returncode == 1 and "retired by `pglogical drop --target`" in still.stderr, still.stderr[-3000:]
        assert reporting_rows(reporting_dsn) == kept and progress_rows(reporting_dsn) == 0
        assert reporting_id not in positions(layout)
        # Slot and publication stay: the lake goes on from them.
        assert query(pg_dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)) == [(1,)]
        assert query(pg_dsn, "SELECT count(*) FROM pg_publication WHERE pubname = 'retire_pub'") == [(1,)]

        # The spec without it: runs go on, and retention prunes what the lake applied.
        doc["targets"] = {"lake": lake_target}
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        for sql in LATER[1:]:
            execute(pg_dsn, sql)
        result = run_ok("run", "--spec", str(spec))
        assert result["targets"]["lake"]["batches_applied"] == 1
        status = run_ok("status", "--spec", str(spec))
        assert status["staging"]["batch_count"] == 1  # keep_batches: 1, the lake done with the rest
        assert set(positions(layout)) == set(before) - {reporting_id}
        wait_for_subscriber(pg_dsn, pg_server.dsn(native_lake), "sub_retire_lake")
        lake = IcebergTarget(IcebergLocation(catalog, "lake"), SLOT)
        assert lake_rows(lake) == native_lake_rows(pg_server.dsn(native_lake))
        assert reporting_rows(reporting_dsn) == kept  # nothing applied there any more
    finally:
        try:
            unsubscribe(pg_server.dsn(native_lake), "sub_retire_lake")
        except Exception:  # noqa: BLE001, S110 - the subscription may not have been created
            pass
        execute(pg_dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name IN ('sub_retire_lake', %s)", params=(SLOT,))
        for db in (reporting, catalog_db, native_lake):
            drop_database(pg_server, db)


def test_a_target_removed_from_the_spec_is_retired_by_the_name_its_records_carry(pg_server, pg_dsn, pg_dbname,
                                                                                 tmp_path):
    """Two Iceberg targets in one catalog, one namespace each (recorded apart); the spec loses one, whose record holds
    every later batch until ``drop --target`` names it."""
    execute(pg_dsn, SCHEMA)
    catalog_db = make_database(pg_server)
    try:
        catalog = {"type": "sql", "uri": pg_server.uri(catalog_db).replace("postgresql://", "postgresql+psycopg2://", 1),
                   "warehouse": str(tmp_path / "warehouse")}
        targets = {name: {"kind": "iceberg", "catalog": dict(catalog), "namespace": name,
                          "tables": {"public.orders": {"row_filter": f"region = '{name.upper()}'"}}}
                   for name in ("eu", "us")}
        doc = {"source": {"dsn": pg_server.uri(pg_dbname), "publication": "gone_pub", "slot": SLOT, "create": True},
               "staging": {"uri": str(tmp_path / "staging"), "retention": {"keep_batches": 1}},
               "targets": targets, "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)}}
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        create_replication(spec)  # what a first run would create, before the source changes
        execute(pg_dsn, WORKLOAD[0])
        both = run_ok("run", "--spec", str(spec))
        assert {name: t["batches_applied"] for name, t in both["targets"].items()} == {"eu": 1, "us": 1}
        layout = StagingLayout.from_uri(str(tmp_path / "staging"), SLOT)
        names = recorded_names(layout)
        assert sorted(names.values()) == ["eu", "us"] and len(positions(layout)) == 2

        doc["targets"] = {"eu": targets["eu"]}  # us removed from the spec; its record stays
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        for sql in WORKLOAD[1:]:
            execute(pg_dsn, sql)
            run_ok("run", "--spec", str(spec))
        held = pglogical("prune", "--spec", str(spec))
        assert held.returncode == 0, held.stderr
        assert json.loads(held.stdout)["pruned_batches"] == 0 and json.loads(held.stdout)["kept_batches"] >= 2
        (us_id,) = [t for t, n in names.items() if n == "us"]
        assert f"staged batches are held for target {us_id} (us), which {spec} does not name" in held.stderr
        assert f"`pglogical drop --spec {spec} --target us --yes`" in held.stderr

        (eu_id,) = [t for t, n in names.items() if n == "eu"]
        refused = error_line(pglogical("drop", "--spec", str(spec), "--target", eu_id, "--yes"))
        assert f"--target {eu_id}: that is where the spec's target eu writes; retire it by that name" in refused
        assert set(positions(layout)) == set(names)  # nothing forgotten
        dry = run_ok("drop", "--spec", str(spec), "--target", "us", "--dry-run")
        assert dry["identity"] == us_id and dry["in_spec"] is False and len(dry["staging_records"]) == 1
        run_ok("drop", "--spec", str(spec), "--target", "us", "--yes")
        assert set(positions(layout)) == set(names) - {us_id}
        pruned = run_ok("prune", "--spec", str(spec))
        assert pruned["kept_batches"] == 1 and pruned["pruned_batches"] >= 1
        eu = IcebergTarget(IcebergLocation(catalog, "eu"), SLOT).open("public.orders")
        assert eu is not None
        assert sorted(r["id"] for r in eu.scan().to_arrow().to_pylist()) == [
            i for (i,) in query(pg_dsn, "SELECT id FROM orders WHERE region = 'EU' ORDER BY id")]
    finally:
        execute(pg_dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                params=(SLOT,))
        drop_database(pg_server, catalog_db)
