"""`pglogical run` of a batch staged under several schema versions of a table, without a JVM: a DROP COLUMN and an
ADD COLUMN … DEFAULT between the table's changes (a key change among them), netted in the pglogical process
(``apply/versions.py``). The target follows the ALTERs in the batch's transaction, keeps the dropped column's values
as a native subscriber keeps them (the UPDATEs after the drop leave it alone, also along the key change), and gives
rows staged before the ADD COLUMN the source's default, as the source reads them.

JAVA_HOME points nowhere: a Spark start fails the run (``test_truncate_no_spark.run_without_java``).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import subscribe, wait_for_subscriber
from tests.integration.test_truncate_no_spark import run_without_java, tear_down
from tests.support.spark import TEST_SPARK_CONF

SOURCE = "CREATE TABLE t (id int PRIMARY KEY, a int, c int);"
# The native subscriber's table holds every column the source's will ever have (a native subscriber needs them).
NATIVE = "CREATE TABLE t (id int PRIMARY KEY, a int, c int, d int);"
PUBLICATION = "versions_pub"
SLOT = "versions_slot"


@pytest.fixture
def pipeline(pg_server, pg_dsn, pg_dbname, tmp_path):
    native_name, ours_name = make_database(pg_server), make_database(pg_server)
    native, ours = pg_server.dsn(native_name), pg_server.dsn(ours_name)
    execute(pg_dsn, SOURCE + f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t;")
    execute(native, NATIVE)
    execute(ours, SOURCE)
    subscribe(pg_dsn, native, publication=PUBLICATION, name=f"n_{SLOT}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": PUBLICATION, "slot": SLOT, "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "postgres", "dsn": pg_server.uri(ours_name)},
        "tables": {"public.t": {}},
        "snapshot": {"initial": True},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }))
    try:
        yield {"spec": str(spec), "source": pg_dsn, "native": native, "ours": ours, "tmp": tmp_path}
    finally:
        tear_down(pg_server, pg_dsn, SLOT, native_name, ours_name)


def test_a_batch_across_drop_column_and_add_column_default_applies_without_spark(pipeline: dict[str, Any]) -> None:
    src, ours = pipeline["source"], pipeline["ours"]
    execute(src, "INSERT INTO t SELECT g, g, g FROM generate_series(1, 4) g;")
    run_without_java(pipeline["spec"], pipeline["tmp"])  # creates the slot; the rows come with the snapshot
    execute(src, "UPDATE t SET c = 50 WHERE id = 1; INSERT INTO t VALUES (5, 5, 5); UPDATE t SET a = 30 WHERE id = 3;")
    execute(src, "ALTER TABLE t DROP COLUMN c;")
    execute(src, "UPDATE t SET a = 90 WHERE id = 1; UPDATE t SET id = 20 WHERE id = 2; UPDATE t SET a = 40 WHERE id = 4;")
    execute(src, "ALTER TABLE t ADD COLUMN d int DEFAULT 7;")
    execute(src, "INSERT INTO t VALUES (6, 6, 8); UPDATE t SET d = 9 WHERE id = 1; INSERT INTO t (id, a) VALUES (7, 7);"
                 " UPDATE t SET a = 41 WHERE id = 4;")
    summary = run_without_java(pipeline["spec"], pipeline["tmp"])
    assert summary["apply"]["batches_applied"] == 1 and summary["apply"]["batches_replayed_in_order"] == 0
    wait_for_subscriber(src, pipeline["native"], name=f"n_{SLOT}")
    # c, dropped inside the batch: as the native subscriber keeps it (written before the drop, left alone after).
    assert query(ours, "SELECT id, a, c FROM t ORDER BY id") == query(pipeline["native"], "SELECT id, a, c FROM t "
                                                                                         "ORDER BY id") == [
        (1, 90, 50), (3, 30, 3), (4, 41, 4), (5, 5, 5), (6, 6, None), (7, 7, None), (20, 2, 2)]
    # d, added with a DEFAULT inside the batch: as the source reads it (rows staged before the ADD COLUMN too).
    assert query(ours, "SELECT id, d FROM t ORDER BY id") == query(src, "SELECT id, d FROM t ORDER BY id") == [
        (1, 9), (3, 7), (4, 7), (5, 7), (6, 8), (7, 7), (20, 7)]
