"""PostgreSQL's src/test/subscription/t/028_row_filter.pl, the scenarios a spec can express, on one pipeline.

The TAP test's initial copy (tablesync) has no counterpart here (changes before the slot exist are
not streamed), so the target is seeded with the rows the TAP test expects after it; the changes
made after CREATE SUBSCRIPTION then go through drain → stage → Spark apply and the TAP test's
expected rows are asserted. Several publications of one table become one OR-ed filter, and a
publication without a filter wins (no filter), as PostgreSQL combines them. Not ported yet: the
partitioned and publish_via_partition_root cases (leaf routing itself is ``leaves: route_to_root``,
tested in test_partition_routing.py).
"""

from __future__ import annotations

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from tests.integration.parity_support import source_with_slot
from tests.pgserver import execute, query
from tests.subscriber import drain_all, run_script
from tests.unit.apply.targetdb import make_target

SOURCE = """
CREATE TABLE tab_rowfilter_1 (a int primary key, b text);
ALTER TABLE tab_rowfilter_1 REPLICA IDENTITY FULL;
CREATE TABLE tab_rowfilter_2 (c int primary key);
CREATE TABLE tab_rowfilter_4 (c int primary key);
CREATE TABLE tab_rowfilter_toast (a text NOT NULL, b text NOT NULL);
ALTER TABLE tab_rowfilter_toast ALTER COLUMN a SET STORAGE EXTERNAL;
CREATE UNIQUE INDEX tab_rowfilter_toast_ri_index on tab_rowfilter_toast (a, b);
ALTER TABLE tab_rowfilter_toast REPLICA IDENTITY USING INDEX tab_rowfilter_toast_ri_index;
CREATE TABLE tab_rowfilter_inherited (a int);
CREATE TABLE tab_rowfilter_child (b text) INHERITS (tab_rowfilter_inherited);
CREATE PUBLICATION pub_all FOR TABLE tab_rowfilter_1, tab_rowfilter_2, tab_rowfilter_4, tab_rowfilter_toast,
    tab_rowfilter_inherited;
"""
SUBSCRIBER = """
CREATE TABLE tab_rowfilter_1 (a int primary key, b text);
CREATE TABLE tab_rowfilter_2 (c int primary key);
CREATE TABLE tab_rowfilter_4 (c int primary key);
CREATE TABLE tab_rowfilter_toast (a text NOT NULL, b text NOT NULL);
CREATE UNIQUE INDEX tab_rowfilter_toast_ri_index on tab_rowfilter_toast (a, b);
CREATE TABLE tab_rowfilter_inherited (a int);
CREATE TABLE tab_rowfilter_child (b text) INHERITS (tab_rowfilter_inherited);
"""
# Source rows before the subscription (TAP: "executed before the CREATE SUBSCRIPTION").
INITIAL_SOURCE = """
INSERT INTO tab_rowfilter_1 (a, b) VALUES (1, 'not replicated'), (1500, 'filtered'), (1980, 'not filtered');
INSERT INTO tab_rowfilter_1 (a, b) SELECT x, 'test ' || x FROM generate_series(990,1002) x;
INSERT INTO tab_rowfilter_2 (c) SELECT generate_series(1, 20);
INSERT INTO tab_rowfilter_4 (c) SELECT generate_series(1, 10);
INSERT INTO tab_rowfilter_toast(a, b) VALUES(repeat('1234567890', 200), '1234567890');
INSERT INTO tab_rowfilter_inherited(a) VALUES(10),(20);
INSERT INTO tab_rowfilter_child(a, b) VALUES(0,'0'),(30,'30'),(40,'40');
"""
# What the TAP test asserts after the initial copy.
INITIAL_COPY = """
INSERT INTO tab_rowfilter_1 VALUES (1001, 'test 1001'), (1002, 'test 1002'), (1980, 'not filtered');
INSERT INTO tab_rowfilter_2 SELECT c FROM generate_series(1, 20) c WHERE c % 2 = 0 OR c % 3 = 0;
INSERT INTO tab_rowfilter_4 SELECT generate_series(1, 10);
INSERT INTO tab_rowfilter_inherited(a) VALUES (20);
INSERT INTO tab_rowfilter_child(a, b) VALUES (30, '30'), (40, '40');
"""
TOAST_VALUE = "1234567890" * 200
FILTERS = {
    "tab_rowfilter_1": TableApplyConfig(row_filter="a > 1000 AND b <> 'filtered'"),
    # tap_pub_1 WHERE (c % 2 = 0) and tap_pub_2 WHERE (c % 3 = 0): OR-ed.
    "tab_rowfilter_2": TableApplyConfig(row_filter="c % 2 = 0 OR c % 3 = 0"),
    # tap_pub_4a WHERE (c % 2 = 0) and tap_pub_4b without a filter: no filter.
    "tab_rowfilter_4": TableApplyConfig(),
    # The filter's repeat('1234567890', 200) written as its value (repeat is not a supported function).
    "tab_rowfilter_toast": TableApplyConfig(row_filter=f"a = '{TOAST_VALUE}' AND b < '10'"),
    # Insert-only inherited tables filtered on a column outside the (absent) replica identity.
    "tab_rowfilter_inherited": TableApplyConfig(row_filter="a > 15"),
    "tab_rowfilter_child": TableApplyConfig(row_filter="a > 15"),
}


def result(dsn: str, sql: str) -> str:
    return "\n".join("|".join("" if v is None else ("t" if v is True else "f" if v is False else str(v)) for v in row)
                     for row in query(dsn, sql))


def test_028_row_filter(pg_server, spark, tmp_path):
    with source_with_slot(pg_server, SOURCE + INITIAL_SOURCE) as (src, slot):
        run_028(spark, src, slot, make_target(pg_server)[1], str(tmp_path / "staging"))


def run_028(spark, src: str, slot: str, ours: str, uri: str) -> None:
    execute(ours, SUBSCRIBER + INITIAL_COPY)
    config = ApplyConfig(slot=slot, staging_root=uri, tables={f"public.{t}": c for t, c in FILTERS.items()})
    run_script(src, [
        "INSERT INTO tab_rowfilter_1 (a, b) VALUES (800, 'test 800');",
        "INSERT INTO tab_rowfilter_1 (a, b) VALUES (1600, 'test 1600');",
        "INSERT INTO tab_rowfilter_1 (a, b) VALUES (1601, 'test 1601');",
        "INSERT INTO tab_rowfilter_1 (a, b) VALUES (1602, 'filtered');",
        "INSERT INTO tab_rowfilter_1 (a, b) VALUES (1700, 'test 1700');",
        "UPDATE tab_rowfilter_1 SET b = NULL WHERE a = 1600;",
        "UPDATE tab_rowfilter_1 SET b = 'test 1601 updated' WHERE a = 1601;",
        "UPDATE tab_rowfilter_1 SET b = 'test 1602 updated' WHERE a = 1602;",
        "DELETE FROM tab_rowfilter_1 WHERE a = 1700;",
        "INSERT INTO tab_rowfilter_2 (c) VALUES (21), (22), (23), (24), (25);",
        "INSERT INTO tab_rowfilter_4 (c) VALUES (0), (11), (12);",
        "INSERT INTO tab_rowfilter_inherited (a) VALUES (14), (16);",
        "INSERT INTO tab_rowfilter_child (a, b) VALUES (13, '13'), (17, '17');",
    ])
    drain_all(src, uri, slot=slot)
    apply_slot(spark, config, ours)
    assert result(ours, "SELECT count(c), min(c), max(c) FROM tab_rowfilter_2") == "16|2|24", \
        "check replicated rows to tab_rowfilter_2"
    assert result(ours, "SELECT count(c), min(c), max(c) FROM tab_rowfilter_4") == "13|0|12", \
        "check replicated rows to tab_rowfilter_4"
    assert result(ours, "SELECT a, b FROM tab_rowfilter_1 ORDER BY 1, 2") == (
        "1001|test 1001\n1002|test 1002\n1601|test 1601 updated\n1602|test 1602 updated\n1980|not filtered"), \
        "check replicated rows to table tab_rowfilter_1"
    assert result(ours, "SELECT a FROM tab_rowfilter_inherited ORDER BY a") == "16\n17\n20\n30\n40", \
        "check replicated rows to tab_rowfilter_inherited and tab_rowfilter_child"

    run_script(src, ["UPDATE tab_rowfilter_toast SET b = '1';"])
    drain_all(src, uri, slot=slot)
    apply_slot(spark, config, ours)
    assert result(ours, "SELECT a = repeat('1234567890', 200), b FROM tab_rowfilter_toast") == "t|1", \
        "check replicated rows to tab_rowfilter_toast"
