"""`pglogical run` staging on S3 with a local Spark master: this process reads the staged files through the staging
area's own pyarrow filesystem (``batches.readable_here``), so plain, repeated-key and row-filtered table-batches are
applied with ``JAVA_HOME`` pointing nowhere (a JVM start fails the run), and the target — PostgreSQL, or a Delta
mirror (``lake/direct.py``) — ends equal to a native subscriber; so is the initial snapshot of rows there before the
slot. A batch the direct path does not cover (a TRUNCATE, keys that repeat and the in-process netting off) starts Spark
for that table; another table of the batch
is still copied by this process (a plan on the store is never handed to Spark's tasks: ``DirectPlan`` refuses to be
pickled), and both end equal too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import subscribe, unsubscribe, wait_for_subscriber
from tests.integration.test_cli_no_spark import run
from tests.support.s3server import S3Server, s3_server
from tests.support.spark import TEST_SPARK_CONF

TABLES = """
CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, label text, price numeric(12,2), seen timestamptz);
CREATE TABLE orders (id int PRIMARY KEY, qty int NOT NULL, note text);
ALTER TABLE orders REPLICA IDENTITY FULL;
CREATE TABLE zeta (id int PRIMARY KEY, v int NOT NULL);
"""
FILTER = "qty > 10 AND note IS DISTINCT FROM 'hidden'"
ITEMS = "SELECT id, qty, label, price, seen FROM items ORDER BY id"
ORDERS = "SELECT id, qty, note FROM orders ORDER BY id"
ZETA = "SELECT id, v FROM zeta ORDER BY id"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """One S3 server for the module: each test stages under a prefix of its own, and its commands get the
    credentials in their environment (``S3Server.env``), so none is set in this process."""
    with s3_server() as server:
        yield server


def _drop(server: Any, name: str) -> None:
    execute(server.dsn(name), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                              "WHERE database = current_database() AND NOT active")
    execute(server.dsn(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _no_spark(summary: dict[str, Any], logs: list[Path], changes: int) -> None:
    assert summary["decode"]["changes"] == changes and summary["apply"]["batches_applied"] == 1
    assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False and logs == []
    assert "applied without Spark" in summary["stderr"] and "starting Spark" not in summary["stderr"]


def test_batches_staged_on_s3_apply_without_java_and_end_as_a_native_subscriber(pg_server, s3: S3Server,
                                                                                 tmp_path: Path):
    source, native, target = make_database(pg_server), make_database(pg_server), make_database(pg_server)
    source_dsn, native_dsn, target_dsn = pg_server.dsn(source), pg_server.dsn(native), pg_server.dsn(target)
    execute(source_dsn, TABLES + f"CREATE PUBLICATION pub_native FOR TABLE items, zeta, orders WHERE ({FILTER});")
    execute(native_dsn, TABLES)
    subscribe(source_dsn, native_dsn)
    doc = {
        "source": {"dsn": pg_server.uri(source), "publication": "s3_pub", "slot": "s3_slot", "create": True},
        "staging": {"uri": f"s3://{s3.bucket}/staging"},
        "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
        "tables": {"public.items": {}, "public.orders": {"row_filter": FILTER}, "public.zeta": {}},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    spec = tmp_path / "s3.yaml"
    spec.write_text(yaml.safe_dump(json.loads(json.dumps(doc))))
    env = s3.env()  # the credentials as a deployment gives them: the environment, never the spec or a command line
    try:
        first, _ = run(str(spec), tmp_path, java=False, env=env)  # creates publication and slot: nothing to apply
        assert first["apply"]["batches_seen"] == 0 and first["spark"]["started"] is None

        # Plain: 100 inserts, each key once.
        execute(source_dsn, "INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, "
                            "'2026-01-01 00:00+00'::timestamptz + g * interval '1 h' FROM generate_series(1, 100) g")
        _no_spark(*run(str(spec), tmp_path, java=False, env=env), changes=100)

        # Repeated keys (netted in this process by the Arrow kernels), a key change and deletes: 100 changes.
        execute(source_dsn, """
            UPDATE items SET qty = qty + 1 WHERE id <= 40;
            UPDATE items SET label = NULL WHERE id <= 30;
            UPDATE items SET id = 1000 WHERE id = 50;
            UPDATE items SET qty = -1 WHERE id = 1000;
            DELETE FROM items WHERE id BETWEEN 91 AND 100;
            INSERT INTO items SELECT g, g, 'again', NULL, NULL FROM generate_series(91, 108) g;""")
        _no_spark(*run(str(spec), tmp_path, java=False, env=env), changes=100)

        # A row filter evaluated in this process: inserts in and out of it, UPDATEs crossing it both ways.
        execute(source_dsn, """
            INSERT INTO orders SELECT g, g, CASE WHEN g % 7 = 0 THEN 'hidden' END FROM generate_series(1, 60) g;
            UPDATE orders SET qty = qty + 20 WHERE id <= 15;
            UPDATE orders SET qty = 0 WHERE id BETWEEN 31 AND 45;
            UPDATE orders SET note = 'hidden' WHERE id BETWEEN 46 AND 50;
            DELETE FROM orders WHERE id BETWEEN 51 AND 55;""")
        _no_spark(*run(str(spec), tmp_path, java=False, env=env), changes=100)

        wait_for_subscriber(source_dsn, native_dsn)
        assert query(target_dsn, ITEMS) == query(native_dsn, ITEMS)
        assert query(target_dsn, ORDERS) == query(native_dsn, ORDERS)
        ids = {r[0] for r in query(target_dsn, ORDERS)}  # not vacuous: rows entered and left by UPDATEs
        assert {1, 2, 15} <= ids and not {31, 45, 46, 7, 51} & ids

        # ``PGLOGICAL_APPLY_DIRECT=0`` (the reference): Spark's transforms, started while the drain runs.
        execute(source_dsn, "UPDATE items SET qty = qty * 2 WHERE id <= 25; UPDATE orders SET qty = 99 WHERE id <= 5;"
                            "INSERT INTO zeta SELECT g, g FROM generate_series(1, 30) g")
        summary, logs = run(str(spec), tmp_path, java=True, env={**env, "PGLOGICAL_APPLY_DIRECT": "0"})
        assert summary["apply"]["batches_applied"] == 1 and summary["apply"]["spark_started"] is True
        assert summary["spark"]["started"] == "during the drain" and logs == []

        # A TRUNCATE inside a batch whose items keys repeat, with the in-process netting off: Spark nets items, its
        # executors reading the store. Table zeta, after items, is still a direct plan on the store once Spark runs:
        # this process copies it.
        execute(source_dsn, """BEGIN;
            UPDATE items SET qty = 7 WHERE id <= 10;
            TRUNCATE items;
            INSERT INTO items SELECT g, g, 'after', NULL, NULL FROM generate_series(1, 20) g;
            UPDATE zeta SET v = v * 3 WHERE id <= 12;
            INSERT INTO zeta VALUES (31, 31);
            COMMIT;""")
        summary, logs = run(str(spec), tmp_path, java=True, env={**env, "PGLOGICAL_APPLY_INPROCESS_ROWS": "0"})
        assert summary["apply"]["batches_applied"] == 1 and summary["apply"]["spark_started"] is True
        assert "for the apply: a staged batch needs Spark" in summary["stderr"] and logs == []
        wait_for_subscriber(source_dsn, native_dsn)
        assert query(target_dsn, ITEMS) == query(native_dsn, ITEMS)
        assert query(target_dsn, ORDERS) == query(native_dsn, ORDERS)
        assert query(target_dsn, ZETA) == query(native_dsn, ZETA) and (12, 36) in query(target_dsn, ZETA)
    finally:
        unsubscribe(native_dsn)
        for name in (native, source, target):
            _drop(pg_server, name)


def test_an_initial_snapshot_staged_on_s3_loads_without_java_and_changes_follow(pg_server, s3: S3Server,
                                                                                tmp_path: Path):
    """The snapshot's files on the store are printed by this process (``direct.snapshot_files``) with a local
    master: no JVM (none is installed for the run)."""
    source, target = make_database(pg_server), make_database(pg_server)
    source_dsn, target_dsn = pg_server.dsn(source), pg_server.dsn(target)
    execute(source_dsn, TABLES + """
        INSERT INTO zeta SELECT g, g FROM generate_series(1, 300) g;
        INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, now() FROM generate_series(1, 200) g;""")
    doc = {
        "source": {"dsn": pg_server.uri(source), "publication": "s3_snap_pub", "slot": "s3_snap_slot", "create": True},
        "staging": {"uri": f"s3://{s3.bucket}/snap-staging"},
        "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
        "tables": {"public.items": {}, "public.zeta": {}},
        "snapshot": {"initial": True},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    spec = tmp_path / "s3-snapshot.yaml"
    spec.write_text(yaml.safe_dump(json.loads(json.dumps(doc))))
    env = s3.env()
    try:
        summary, logs = run(str(spec), tmp_path, java=False, env=env)  # slot created with the snapshot, loaded
        tables = summary["decode"]["snapshot"]["initial"]["tables"]
        assert (tables["public.zeta"]["rows"], tables["public.items"]["rows"]) == (300, 200)
        assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False and logs == []
        assert query(target_dsn, ZETA) == query(source_dsn, ZETA)
        assert query(target_dsn, ITEMS) == query(source_dsn, ITEMS)
        execute(source_dsn, "UPDATE zeta SET v = 0 WHERE id <= 50; DELETE FROM items WHERE id > 150;")
        _no_spark(*run(str(spec), tmp_path, java=False, env=env), changes=100)
        assert query(target_dsn, ZETA) == query(source_dsn, ZETA)
        assert query(target_dsn, ITEMS) == query(source_dsn, ITEMS)
        # Records and history are written by key: no directory marker (a PUT per level) above them on S3 (pyarrow
        # leaves one only where it deleted a directory's last file: a moved batch's, a closed snapshot request's).
        staged, slot = s3.keys("snap-staging/"), "snap-staging/s3_snap_slot"
        assert any(k.endswith("/_manifest.json") for k in staged) and any(k.startswith(f"{slot}/history/") for k in staged)
        assert not {"snap-staging/", f"{slot}/", f"{slot}/state/", f"{slot}/history/"} & set(staged), staged
    finally:
        for name in (source, target):
            _drop(pg_server, name)


def _lake_rows(lake: Path, table: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    data = DeltaTable(str(lake / "public" / table)).to_pyarrow_table()
    return sorted(tuple(r[c] for c in columns) for r in data.to_pylist())


def test_a_delta_mirror_applies_batches_staged_on_s3_without_java_as_a_native_subscriber(pg_server, s3: S3Server,
                                                                                        tmp_path: Path):
    source, native = make_database(pg_server), make_database(pg_server)
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, TABLES + f"CREATE PUBLICATION pub_native FOR TABLE items, orders WHERE ({FILTER});")
    execute(native_dsn, TABLES)
    subscribe(source_dsn, native_dsn)
    lake = tmp_path / "lake"
    doc = {
        "source": {"dsn": pg_server.uri(source), "publication": "s3_lake_pub", "slot": "s3_lake_slot", "create": True},
        "staging": {"uri": f"s3://{s3.bucket}/lake-staging"},
        "target": {"kind": "delta", "uri": str(lake)},
        "tables": {"public.items": {}, "public.orders": {"row_filter": FILTER}},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    spec = tmp_path / "s3-delta.yaml"
    spec.write_text(yaml.safe_dump(json.loads(json.dumps(doc))))
    env = s3.env()
    try:
        # The first run creates publication and slot: nothing to apply, so a Delta target starts no JVM either.
        first, logs = run(str(spec), tmp_path, java=False, env=env)
        assert first["apply"]["batches_seen"] == 0 and logs == []
        assert first["spark"]["started"] is None and first["apply"]["spark_started"] is False
        execute(source_dsn, """BEGIN;
            INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, NULL FROM generate_series(1, 60) g;
            INSERT INTO orders SELECT g, g, CASE WHEN g % 7 = 0 THEN 'hidden' END FROM generate_series(1, 40) g;
            COMMIT;""")
        _no_spark(*run(str(spec), tmp_path, java=False, env=env), changes=100)
        # Keys repeating (netted in process), a key change, UPDATEs crossing the filter both ways: 100 changes.
        execute(source_dsn, """
            UPDATE items SET qty = qty + 1 WHERE id <= 35;
            UPDATE items SET label = NULL WHERE id <= 20;
            UPDATE items SET id = 1000 WHERE id = 40;
            DELETE FROM items WHERE id BETWEEN 51 AND 60;
            UPDATE orders SET qty = qty + 20 WHERE id <= 15;
            UPDATE orders SET qty = 0 WHERE id BETWEEN 21 AND 39;""")
        _no_spark(*run(str(spec), tmp_path, java=False, env=env), changes=100)
        wait_for_subscriber(source_dsn, native_dsn)
        items = ("id", "qty", "label", "price")
        assert _lake_rows(lake, "items", items) == sorted(query(native_dsn, "SELECT id, qty, label, price FROM items"))
        assert _lake_rows(lake, "orders", ("id", "qty", "note")) == sorted(query(native_dsn, ORDERS))
    finally:
        unsubscribe(native_dsn)
        for name in (native, source):
            _drop(pg_server, name)
