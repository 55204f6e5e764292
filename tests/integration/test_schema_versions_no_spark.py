"""`pglogical run` of a batch staged under several schema versions of a table, without a JVM: a DROP COLUMN and an
ADD COLUMN … DEFAULT between the table's changes (a key change among them), netted in the pglogical process
(``apply/versions.py``). The target follows the ALTERs in the batch's transaction, keeps the dropped column's values
as a native subscriber keeps them (the UPDATEs after the drop leave it alone, also along the key change), and gives
rows staged before the ADD COLUMN the source's default, as the source reads them. A table with a row filter and
restricted actions (the spec's, decoded from an unfiltered publication) across an ADD COLUMN … DEFAULT: the filter
turns UPDATEs into INSERTs and DELETEs on both sides of the schema change, as a native publication with that filter
and those actions does.

JAVA_HOME points nowhere: a Spark start fails the run (``tests/support/no_spark.run_without_java``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import subscribe, wait_for_subscriber
from tests.support.no_spark import run_without_java, tear_down
from tests.support.spark import TEST_SPARK_CONF

SOURCE = "CREATE TABLE t (id int PRIMARY KEY, a int, c int);"
# The native subscriber's table holds every column the source's will ever have (a native subscriber needs them).
NATIVE = "CREATE TABLE t (id int PRIMARY KEY, a int, c int, d int);"
PUBLICATION = "versions_pub"
SLOT = "versions_slot"


# The filtered table's spec, and the native subscriber's publication of the same filter and actions.
FILTER, ACTIONS = "id % 2 = 0", ["insert", "update"]
NATIVE_FILTERED = "versions_native_pub"


def _pipeline(pg_server: Any, pg_dsn: str, pg_dbname: str, tmp_path: Any, *, source: str, native_table: str,
              table: dict[str, Any], native_publication: str = "") -> Iterator[dict[str, Any]]:
    """``source`` on the source, published unfiltered to the pipeline (``table``: its spec) and to the native
    subscriber (``native_table``), or to that by ``native_publication`` (``CREATE PUBLICATION … FOR TABLE t …``)."""
    native_name, ours_name = make_database(pg_server), make_database(pg_server)
    native, ours = pg_server.dsn(native_name), pg_server.dsn(ours_name)
    execute(pg_dsn, source + f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t;" + native_publication)
    execute(native, native_table)
    execute(ours, source)
    subscribe(pg_dsn, native, publication=NATIVE_FILTERED if native_publication else PUBLICATION, name=f"n_{SLOT}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": PUBLICATION, "slot": SLOT, "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "postgres", "dsn": pg_server.uri(ours_name)},
        "tables": {"public.t": table},
        "snapshot": {"initial": True},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }))
    try:
        yield {"spec": str(spec), "source": pg_dsn, "native": native, "ours": ours, "tmp": tmp_path}
    finally:
        tear_down(pg_server, pg_dsn, SLOT, native_name, ours_name)


@pytest.fixture
def pipeline(pg_server, pg_dsn, pg_dbname, tmp_path):
    yield from _pipeline(pg_server, pg_dsn, pg_dbname, tmp_path, source=SOURCE, native_table=NATIVE, table={})


@pytest.fixture
def filtered(pg_server, pg_dsn, pg_dbname, tmp_path):
    # The native table's d has the source's default: the rows its initial copy writes get it, as ours follow the ADD.
    yield from _pipeline(pg_server, pg_dsn, pg_dbname, tmp_path, source="CREATE TABLE t (id int PRIMARY KEY, a int);",
                         native_table="CREATE TABLE t (id int PRIMARY KEY, a int, d int DEFAULT 5);",
                         table={"row_filter": FILTER, "actions": ACTIONS},
                         native_publication=f"CREATE PUBLICATION {NATIVE_FILTERED} FOR TABLE t WHERE ({FILTER}) "
                                            f"WITH (publish = '{', '.join(ACTIONS)}');")


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


def test_a_filtered_table_across_add_column_default_applies_without_spark_as_a_native_publication(
        filtered: dict[str, Any]) -> None:
    src, ours = filtered["source"], filtered["ours"]
    execute(src, "INSERT INTO t SELECT g, g FROM generate_series(1, 6) g;")
    run_without_java(filtered["spec"], filtered["tmp"])  # the snapshot's rows: the filter's (2, 4, 6)
    # Before the ADD COLUMN: an UPDATE kept, a key leaving the filter (a DELETE), a DELETE not published, an
    # INSERT kept and one filtered out.
    execute(src, "UPDATE t SET a = 20 WHERE id = 2; UPDATE t SET id = 7 WHERE id = 4; DELETE FROM t WHERE id = 6;"
                 " INSERT INTO t VALUES (8, 8), (9, 9);")
    execute(src, "ALTER TABLE t ADD COLUMN d int DEFAULT 5;")
    # After it: keys entering the filter (INSERTs of the new version's image), UPDATEs kept and filtered out.
    execute(src, "UPDATE t SET id = 10 WHERE id = 1; UPDATE t SET a = 80 WHERE id = 8; UPDATE t SET d = 9 WHERE id = 2;"
                 " INSERT INTO t VALUES (12, 12); UPDATE t SET id = 14 WHERE id = 3; UPDATE t SET a = 70 WHERE id = 7;")
    summary = run_without_java(filtered["spec"], filtered["tmp"])
    assert summary["apply"]["batches_applied"] == 1
    wait_for_subscriber(src, filtered["native"], name=f"n_{SLOT}")
    assert query(ours, "SELECT id, a, d FROM t ORDER BY id") == query(filtered["native"], "SELECT id, a, d FROM t "
                                                                                          "ORDER BY id") == [
        (2, 20, 9), (6, 6, 5), (8, 80, 5), (10, 1, 5), (12, 12, 5), (14, 3, 5)]
