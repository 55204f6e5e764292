"""`pglogical run` into an Iceberg mirror without a JVM: every table-batch the direct path covers is read from its
staged files in the pglogical process (``lake/direct.py``) and committed with pyiceberg — plain batches, keys changed
twice and unchanged TOAST values netted in process, a row filter evaluated in process — with ``JAVA_HOME`` pointing
nowhere (a JVM start fails the run), and the Iceberg tables end equal to a native subscriber of publications with
the same filter. An initial snapshot, which a lake loads through Spark, starts Spark while the drain runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import subscribe, unsubscribe, wait_for_subscriber
from tests.integration.test_cli_no_spark import run
from tests.integration.test_cli_row_filter_no_spark import BODY, FILTER, _drop
from tests.integration.test_cli_row_filter_no_spark import ROWS as ORDERS
from tests.support.spark import TEST_SPARK_CONF

TABLES = """
CREATE TABLE items (id int PRIMARY KEY, qty smallint NOT NULL, label text, price numeric(12,2), seen timestamptz,
                    day date, ratio float8, ok boolean, lsn pg_lsn);
CREATE TABLE orders (id int PRIMARY KEY, qty int NOT NULL, note text, body text);
ALTER TABLE orders REPLICA IDENTITY FULL;
"""
ITEMS = "SELECT id, qty, label, price, seen, day, ratio, ok, lsn::text FROM items ORDER BY id"


def _iceberg(target: IcebergTarget, table: str) -> list[tuple]:
    tbl = target.open(f"public.{table}")
    assert tbl is not None, table
    rows = tbl.scan().to_arrow().sort_by("id").to_pylist()
    if table == "orders":
        return [(r["id"], r["qty"], r["note"], hashlib.md5(r["body"].encode()).hexdigest() if r["body"] else None)
                for r in rows]
    # pg_lsn lands as decimal(20,0): its 'X/X' text, as the native subscriber's column reads
    return [(*(r[c] for c in ("id", "qty", "label", "price", "seen", "day", "ratio", "ok")),
             None if r["lsn"] is None else f"{int(r['lsn']) >> 32:X}/{int(r['lsn']) & 0xFFFFFFFF:X}") for r in rows]


def test_an_iceberg_mirror_applies_without_java_as_a_native_subscriber_holds_it(pg_server, tmp_path: Path):
    source, native = make_database(pg_server), make_database(pg_server)
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, TABLES + f"CREATE PUBLICATION pub_native FOR TABLE items, orders WHERE ({FILTER});")
    execute(native_dsn, TABLES)
    subscribe(source_dsn, native_dsn)
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": str(tmp_path / "warehouse")}
    doc = {
        "source": {"dsn": pg_server.uri(source), "publication": "ice_pub", "slot": "ice_slot", "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "iceberg", "catalog": catalog, "namespace": "lake"},
        "tables": {"public.items": {}, "public.orders": {"row_filter": FILTER}},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    spec = tmp_path / "iceberg.yaml"
    spec.write_text(yaml.safe_dump(json.loads(json.dumps(doc))))
    target = IcebergTarget(IcebergLocation(catalog, "lake"), "ice_slot")
    try:
        first, _ = run(str(spec), tmp_path, java=False)  # creates publication and slot: nothing to apply
        assert first["apply"]["batches_seen"] == 0
        execute(source_dsn, f"""BEGIN;
            INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, '2026-01-01 00:00+00'::timestamptz + g * interval
              '1 h', '2026-01-01'::date + g, g / 7.0, g % 2 = 0, ('0/' || to_hex(g * 4096))::pg_lsn
              FROM generate_series(1, 60) g;
            INSERT INTO orders SELECT g, g, CASE WHEN g % 7 = 0 THEN 'hidden' END,
              CASE WHEN g <= 4 OR g BETWEEN 30 AND 33 THEN {BODY.format(n='g')} END FROM generate_series(1, 40) g;
            COMMIT;""")
        summary, logs = run(str(spec), tmp_path, java=False)  # no Java: a JVM start would fail the run
        assert summary["apply"]["batches_applied"] == 1 and summary["decode"]["changes"] == 100
        assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False and logs == []
        assert "applied without Spark" in summary["stderr"] and "starting Spark" not in summary["stderr"]

        # One batch: keys changed twice, a key change, deletes; in the filtered table UPDATEs entering it (their
        # TOASTed body unchanged, refilled from the full old image) and leaving it, a key updated across it.
        execute(source_dsn, """
            UPDATE items SET qty = qty + 100, label = NULL WHERE id BETWEEN 1 AND 20;
            UPDATE items SET ok = NULL WHERE id <= 5;
            UPDATE items SET id = 1000 WHERE id = 30;
            DELETE FROM items WHERE id BETWEEN 41 AND 50;
            INSERT INTO items (id, qty) SELECT g, g FROM generate_series(61, 80) g;
            UPDATE orders SET qty = qty + 20 WHERE id <= 4;
            UPDATE orders SET qty = 0 WHERE id BETWEEN 30 AND 33;
            UPDATE orders SET note = 'hidden' WHERE id = 12;
            UPDATE orders SET qty = 50 WHERE id = 31;
            UPDATE orders SET qty = 60, note = 'back' WHERE id = 31;
            UPDATE orders SET id = 1000 WHERE id = 15;
            DELETE FROM orders WHERE id IN (6, 17);
            INSERT INTO orders VALUES (2000, 99, 'new', NULL), (2001, 1, 'out', NULL);""")
        summary, logs = run(str(spec), tmp_path, java=False)
        assert summary["apply"]["batches_applied"] == 1 and summary["apply"]["batches_replayed_in_order"] == 0
        assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False and logs == []
        wait_for_subscriber(source_dsn, native_dsn)
        assert _iceberg(target, "items") == query(native_dsn, ITEMS)
        assert _iceberg(target, "orders") == query(native_dsn, ORDERS)
        # Not vacuous: rows moved, entered (with their TOASTed bodies) and left the filter on both sides.
        ids = {r[0] for r in _iceberg(target, "orders")}
        assert {1, 2, 3, 4, 31, 1000, 2000} <= ids and not {12, 30, 32, 33, 17, 2001} & ids
        assert len(_iceberg(target, "items")) == 70
        tbl = target.open("public.items")
        assert tbl is not None and str(tbl.schema().find_field("qty").field_type) == "int"
    finally:
        unsubscribe(native_dsn)
        for name in (native, source):
            _drop(pg_server, name)


def test_an_initial_snapshot_into_an_iceberg_mirror_starts_spark_during_the_drain(pg_server, tmp_path: Path):
    """Only PostgreSQL loads a snapshot's staged rows itself: a run staging one for an Iceberg mirror starts Spark
    in the background while the drain runs (``runs.spark_expected``), and the next run of plain changes needs none."""
    source = make_database(pg_server)
    source_dsn = pg_server.dsn(source)
    execute(source_dsn, TABLES + """INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, NULL, NULL, g / 7.0,
        g % 2 = 0, NULL FROM generate_series(1, 30) g;""")
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": str(tmp_path / "warehouse")}
    doc = {
        "source": {"dsn": pg_server.uri(source), "publication": "ice_snap_pub", "slot": "ice_snap_slot",
                   "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "iceberg", "catalog": catalog, "namespace": "lake"},
        "tables": {"public.items": {}},
        "snapshot": {"initial": True},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    spec = tmp_path / "iceberg.yaml"
    spec.write_text(yaml.safe_dump(json.loads(json.dumps(doc))))
    target = IcebergTarget(IcebergLocation(catalog, "lake"), "ice_snap_slot")
    try:
        first, _ = run(str(spec), tmp_path, java=True)  # the initial snapshot: loaded through Spark
        assert first["decode"]["snapshot"]["initial"] is not None
        assert first["spark"]["started"] == "during the drain", first["stderr"][-2000:]
        assert _iceberg(target, "items") == query(source_dsn, ITEMS)
        execute(source_dsn, "UPDATE items SET qty = qty + 1 WHERE id <= 10; INSERT INTO items (id, qty) VALUES (31, 1)")
        second, logs = run(str(spec), tmp_path, java=False)  # changes only: the direct path covers them
        assert second["apply"]["batches_applied"] == 1 and second["spark"]["started"] is None and logs == []
        assert _iceberg(target, "items") == query(source_dsn, ITEMS)
    finally:
        _drop(pg_server, source)
