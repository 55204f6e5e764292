"""A pipeline DAG of a spec with two PostgreSQL targets (``targets:``) in a real ``airflow dags test``: one decode,
one apply task per target, each target holding its own filtered, column-listed selection."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import yaml

from scripts.harness.pgserver import drop_database, execute, make_database
from scripts.harness.pgserver import query as rows

TEST_DAGS = Path(__file__).parent / "dags"
DAG_ID = "pglogical_test_targets"


def test_a_dag_of_two_targets_applies_each_its_own_selection_from_one_decode(pg_server, airflow, tmp_path):
    src, cheap, dear = (make_database(pg_server) for _ in range(3))
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump({
            "source": {"conn_id": "pgl_source", "publication": "items_pub", "slot": "fan_dag_slot"},
            "staging": {"uri": str(tmp_path / "staging")},
            "targets": {
                "cheap": {"kind": "postgres", "conn_id": "pgl_cheap",
                          "tables": {"public.items": {"row_filter": "price < 100"}}},
                "dear": {"kind": "postgres", "conn_id": "pgl_dear",
                         "tables": {"public.items": {"row_filter": "price >= 100", "columns": ["id", "price"]}}},
            }}, sort_keys=False))
        env = {"AIRFLOW_CONN_PGL_SOURCE": pg_server.uri(src), "AIRFLOW_CONN_PGL_CHEAP": pg_server.uri(cheap),
               "AIRFLOW_CONN_PGL_DEAR": pg_server.uri(dear), "PGLOGICAL_TEST_TARGETS_SPEC": str(spec),
               "AIRFLOW__CORE__DAGS_FOLDER": str(TEST_DAGS)}
        execute(pg_server.dsn(src), "CREATE TABLE items (id int PRIMARY KEY, name text, price int NOT NULL)",
                # The filters' column in the replica identity, and the column lists covering it (publication rules).
                "CREATE UNIQUE INDEX items_identity ON items (id, price)",
                "ALTER TABLE items REPLICA IDENTITY USING INDEX items_identity",
                "CREATE PUBLICATION items_pub FOR TABLE items",
                "SELECT pg_create_logical_replication_slot('fan_dag_slot', 'pgoutput')")
        execute(pg_server.dsn(src), "INSERT INTO items SELECT g, 'item ' || g, g * 10 FROM generate_series(1, 30) g",
                "UPDATE items SET price = 500 WHERE id = 2", "UPDATE items SET price = 5 WHERE id = 20",
                "DELETE FROM items WHERE id IN (3, 25)")
        result = airflow.run("dags", "test", DAG_ID, env=env, timeout=1500)
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "state=success" in output, output[-6000:]
        for task in ("pglogical.decode", "pglogical.apply_cheap", "pglogical.apply_dear"):
            assert task in output, task
        assert rows(pg_server.dsn(cheap), "SELECT id, name, price FROM items ORDER BY id") == \
            rows(pg_server.dsn(src), "SELECT id, name, price FROM items WHERE price < 100 ORDER BY id")
        assert rows(pg_server.dsn(dear), "SELECT * FROM items ORDER BY id") == \
            rows(pg_server.dsn(src), "SELECT id, price FROM items WHERE price >= 100 ORDER BY id")
        # Both write public.items: each target's apply emits its own asset, told apart by its location.
        db = sqlite3.connect(airflow.home / "airflow.db")
        try:
            uris = {uri for (uri,) in db.execute("SELECT a.uri FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                                                 "WHERE a.uri LIKE 'pglogical://fan_dag_slot/target/%'")}
        finally:
            db.close()
        assert uris == {"pglogical://fan_dag_slot/target/postgres%2Fpgl_cheap/public.items",
                        "pglogical://fan_dag_slot/target/postgres%2Fpgl_dear/public.items"}
    finally:
        execute(pg_server.dsn(src), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                    "WHERE slot_name = 'fan_dag_slot'")
        for db in (dear, cheap, src):
            drop_database(pg_server, db)
