"""Snapshots into the Iceberg target: an initial snapshot loads each table in one commit that sets its watermark and
sync mark, the changes after it apply on top, and a re-run loads nothing twice."""

from __future__ import annotations

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation, sync_key
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, initial_snapshot
from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import drain_all, run_script

SQL = """
CREATE TABLE items (id int PRIMARY KEY, n numeric(12,2), body text, at timestamptz);
CREATE TABLE notes (id bigint PRIMARY KEY, tags text[]);
INSERT INTO items SELECT g, g * 1.25, repeat('b', g % 7), '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 h'
  FROM generate_series(1, 500) g;
INSERT INTO notes SELECT g, ARRAY['t' || g] FROM generate_series(1, 50) g;
CREATE PUBLICATION pub_all FOR TABLE items, notes;
"""


def test_an_initial_snapshot_loads_into_iceberg_and_later_changes_apply_on_top(pg_server, spark, tmp_path):
    staging = str(tmp_path / "staging")
    source = make_database(pg_server)
    dsn = pg_server.dsn(source)
    execute(dsn, SQL)
    job = SnapshotJob(dsn=dsn, slot="ours", publication="pub_all", staging_uri=staging,
                      tables={"public.items": (None, None), "public.notes": (None, None)},
                      settings=SnapshotSettings(initial=True))
    config = ApplyConfig(slot="ours", staging_root=staging,
                         tables={"public.items": TableApplyConfig(), "public.notes": TableApplyConfig()})
    target = IcebergTarget(IcebergLocation({"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                            "warehouse": str(tmp_path / "warehouse")}), "ours")
    try:
        initial_snapshot(job)
        run_script(dsn, ["UPDATE items SET n = 0 WHERE id <= 10; DELETE FROM items WHERE id > 490;"
                         "INSERT INTO notes VALUES (51, ARRAY['new']);"])
        drain_all(dsn, staging)
        assert any(r.applied for r in apply_slot(spark, config, target=target))
        marks = target.sync_marks("ours", ["public.items", "public.notes"])
        assert set(marks) == {"public.items", "public.notes"}
        items = target.open("public.items")
        assert items is not None and int(items.properties[sync_key("ours")]) == marks["public.items"]
        got = sorted((r["id"], r["n"], r["body"], r["at"]) for r in items.scan().to_arrow().to_pylist())
        assert got == query(dsn + " options='-c TimeZone=UTC'", "SELECT id, n, body, at FROM items ORDER BY id")
        notes = target.open("public.notes")
        assert notes is not None
        assert sorted((r["id"], r["tags"]) for r in notes.scan().to_arrow().to_pylist()) == \
            query(dsn, "SELECT id, tags FROM notes ORDER BY id")
        assert not any(r.applied for r in apply_slot(spark, config, target=target))  # nothing twice
    finally:
        execute(dsn, "SELECT pg_drop_replication_slot('ours') FROM pg_replication_slots WHERE slot_name = 'ours'")
        execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{source}" WITH (FORCE)')
