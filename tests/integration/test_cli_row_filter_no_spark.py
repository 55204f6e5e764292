"""`pglogical run` of a row-filtered table without a JVM: the filter is evaluated in the pglogical process
(``apply/filter_eval.py``, ``apply/published.py``), UPDATEs crossing it become INSERTs and DELETEs, keys repeat and
unchanged TOAST values are refilled — with ``JAVA_HOME`` pointing nowhere (a JVM start fails the run), and the
target ends equal to a native subscriber of a publication with the same filter."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import subscribe, unsubscribe, wait_for_subscriber
from tests.integration.test_cli_no_spark import run
from tests.support.spark import TEST_SPARK_CONF

TABLE = """
CREATE TABLE orders (id int PRIMARY KEY, qty int NOT NULL, note text, body text);
ALTER TABLE orders REPLICA IDENTITY FULL;
"""
FILTER = "qty > 10 AND note IS DISTINCT FROM 'hidden'"
ROWS = "SELECT id, qty, note, md5(body) FROM orders ORDER BY id"
BODY = "(SELECT string_agg(md5((g * {n})::text), '') FROM generate_series(1, 3000) g)"  # ~96 kB: TOASTed


def _drop(server, name: str) -> None:
    execute(server.dsn(name), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                              "WHERE database = current_database() AND NOT active")
    execute(server.dsn(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_row_filtered_table_applies_without_java_as_a_native_subscriber_holds_it(pg_server, tmp_path: Path):
    source, native, target = make_database(pg_server), make_database(pg_server), make_database(pg_server)
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, TABLE + f"CREATE PUBLICATION pub_native FOR TABLE orders WHERE ({FILTER});")
    execute(native_dsn, TABLE)
    subscribe(source_dsn, native_dsn)
    doc = {
        "source": {"dsn": pg_server.uri(source), "publication": "rf_pub", "slot": "rf_slot", "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
        "tables": {"public.orders": {"row_filter": FILTER}},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    spec = tmp_path / "filtered.yaml"
    spec.write_text(yaml.safe_dump(json.loads(json.dumps(doc))))
    try:
        first, _ = run(str(spec), tmp_path, java=False)  # creates publication and slot: nothing to apply
        assert first["apply"]["batches_seen"] == 0
        execute(source_dsn, "BEGIN; INSERT INTO orders SELECT g, g, CASE WHEN g % 7 = 0 THEN 'hidden' END, "
                            f"CASE WHEN g <= 4 OR g BETWEEN 30 AND 33 THEN {BODY.format(n='g')} END "
                            "FROM generate_series(1, 40) g; COMMIT;")
        # One batch: UPDATEs entering the filter (→ INSERT, their TOASTed body unchanged and refilled from the full
        # old image), leaving it (→ DELETE), a key updated again and again across it, a key change, changes that
        # stay outside, deletes of rows in and out.
        execute(source_dsn, """
            UPDATE orders SET qty = qty + 20 WHERE id <= 4;
            UPDATE orders SET qty = 0 WHERE id BETWEEN 30 AND 33;
            UPDATE orders SET note = 'hidden' WHERE id = 12;
            UPDATE orders SET qty = 50 WHERE id = 31;
            UPDATE orders SET qty = 5 WHERE id = 31;
            UPDATE orders SET qty = 60, note = 'back' WHERE id = 31;
            UPDATE orders SET id = 1000 WHERE id = 15;
            UPDATE orders SET id = 1001, qty = 3 WHERE id = 16;
            UPDATE orders SET note = 'still out' WHERE id = 5;
            DELETE FROM orders WHERE id IN (6, 17);
            INSERT INTO orders VALUES (2000, 99, 'new', NULL), (2001, 1, 'out', NULL);""")
        summary, logs = run(str(spec), tmp_path, java=False)  # no Java: a JVM start would fail the run
        assert summary["apply"]["batches_applied"] == 1 and summary["apply"]["batches_replayed_in_order"] == 0
        assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False and logs == []
        assert "applied without Spark" in summary["stderr"] and "starting Spark" not in summary["stderr"]
        wait_for_subscriber(source_dsn, native_dsn)
        ours = query(pg_server.dsn(target), ROWS)
        assert ours == query(native_dsn, ROWS)
        # Not vacuous: rows entered (with their TOASTed bodies) and left by UPDATEs on both sides.
        ids = {r[0] for r in ours}
        assert {1, 2, 3, 4, 31, 1000, 2000} <= ids and not {12, 16, 1001, 30, 32, 33, 17, 2001} & ids
        assert all(r[3] is not None for r in ours if r[0] in (1, 2, 3, 4, 31))
    finally:
        unsubscribe(native_dsn)
        for name in (native, source, target):
            _drop(pg_server, name)
