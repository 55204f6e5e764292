"""PostgreSQL's src/test/subscription/t/031_column_list.pl, the non-partitioned scenarios, on one pipeline.

As in the other TAP ports, the target is seeded with what the TAP test expects after its initial
copy, the changes after CREATE SUBSCRIPTION go through drain → stage → Spark apply (one apply per
``wait_for_catchup``), and the TAP test's expected rows are asserted. Publication column lists
become ``columns``; replica-identity changes on the source (tab6, tab7) are followed from the staged
relation versions, including writes while tab7 has no replica identity at all. Not ported: the
partitioned-table and publish_via_partition_root scenarios (not yet; leaf routing itself is
``leaves: route_to_root``, tested in test_partition_routing.py).
"""

from __future__ import annotations

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from tests.integration.parity_support import source_with_slot
from tests.pgserver import execute, query
from tests.subscriber import drain_all, run_script
from tests.unit.apply.targetdb import make_target

SOURCE = """
CREATE TABLE tab1 (a int PRIMARY KEY, "B" int, c int);
CREATE TABLE tab2 (a int PRIMARY KEY, b varchar, c int);
CREATE TABLE tab3 ("a'" int PRIMARY KEY, "B" varchar, "c'" int);
CREATE TYPE test_typ AS ENUM ('blue', 'red');
CREATE TABLE tab4 (a INT PRIMARY KEY, b test_typ, c int, d text);
CREATE TABLE tab5 (a int PRIMARY KEY, b int, c int, d int);
CREATE TABLE tab6 (a int PRIMARY KEY, b int, c int, d int);
CREATE TABLE tab7 (a int PRIMARY KEY, b int, c int, d int);
CREATE PUBLICATION pub_all FOR TABLE tab1, tab2, tab3, tab4, tab5, tab6, tab7;
INSERT INTO tab1 VALUES (1, 2, 3), (4, 5, 6);
INSERT INTO tab3 VALUES (1, 2, 3), (4, 5, 6);
INSERT INTO tab4 VALUES (1, 'red', 3, 'oh my'), (2, 'blue', 4, 'hello');
INSERT INTO tab2 VALUES (1, 'abc', 3);
INSERT INTO tab5 VALUES (1, 11, 111, 1111), (2, 22, 222, 2222);
INSERT INTO tab6 VALUES (1, 22, 333, 4444);
INSERT INTO tab7 VALUES (1, 22, 333, 4444);
"""
# Subscriber tables and the rows the TAP test expects after each initial copy.
SUBSCRIBER = """
CREATE TABLE tab1 (a int PRIMARY KEY, "B" int, c int);
CREATE TABLE tab2 (a int PRIMARY KEY, b varchar);
CREATE TABLE tab3 ("a'" int PRIMARY KEY, "c'" int);
CREATE TYPE test_typ AS ENUM ('blue', 'red');
CREATE TABLE tab4 (a INT PRIMARY KEY, b test_typ, d text);
CREATE TABLE tab5 (a int PRIMARY KEY, b int, d int);
CREATE TABLE tab6 (a int PRIMARY KEY, b int, c int, d int);
CREATE TABLE tab7 (a int PRIMARY KEY, b int, c int, d int);
INSERT INTO tab1 VALUES (1, 2), (4, 5);
INSERT INTO tab3 VALUES (1, 3), (4, 6);
INSERT INTO tab4 VALUES (1, 'red', 'oh my'), (2, 'blue', 'hello');
INSERT INTO tab2 VALUES (1, 'abc');
INSERT INTO tab5 VALUES (1, 11), (2, 22);
INSERT INTO tab6 (a, b) VALUES (1, 22);
INSERT INTO tab7 (a, b) VALUES (1, 22);
"""
COLUMN_LISTS = {
    "tab1": ("a", "B"), "tab2": ("a", "b"), "tab3": ("a'", "c'"), "tab4": ("a", "b", "d"), "tab5": ("a", "b"),
    "tab6": ("a", "b"), "tab7": ("a", "b"),
}


def result(dsn: str, sql: str) -> str:
    return "\n".join("|".join("" if v is None else str(v) for v in row) for row in query(dsn, sql))


def test_031_column_list(pg_server, spark, tmp_path):
    with source_with_slot(pg_server, SOURCE) as (src, slot):
        run_031(spark, src, slot, make_target(pg_server)[1], str(tmp_path / "staging"))


def run_031(spark, src: str, slot: str, ours: str, uri: str) -> None:
    execute(ours, SUBSCRIBER)
    config = ApplyConfig(slot=slot, staging_root=uri,
                         tables={f"public.{t}": TableApplyConfig(columns=c) for t, c in COLUMN_LISTS.items()})

    def catch_up(transactions: list[str]) -> None:
        run_script(src, transactions)
        drain_all(src, uri, slot=slot)
        apply_slot(spark, config, ours)

    catch_up(["INSERT INTO tab1 VALUES (2, 3, 4); INSERT INTO tab1 VALUES (5, 6, 7);",
              "INSERT INTO tab3 VALUES (2, 3, 4); INSERT INTO tab3 VALUES (5, 6, 7);",
              "INSERT INTO tab4 VALUES (3, 'red', 5, 'foo'); INSERT INTO tab4 VALUES (4, 'blue', 6, 'bar');"])
    assert result(ours, "SELECT * FROM tab1 ORDER BY a") == "1|2|\n2|3|\n4|5|\n5|6|", \
        "insert on column tab1.c is not replicated"
    assert result(ours, """SELECT * FROM tab3 ORDER BY "a'\"""") == "1|3\n2|4\n4|6\n5|7", \
        "insert on column tab3.b is not replicated"
    assert result(ours, "SELECT * FROM tab4 ORDER BY a") == "1|red|oh my\n2|blue|hello\n3|red|foo\n4|blue|bar", \
        "insert on column tab4.c is not replicated"

    catch_up(['UPDATE tab1 SET "B" = 2 * "B" where a = 1;', "UPDATE tab1 SET c = 2*c where a = 4;",
              """UPDATE tab3 SET "B" = "B" || ' updated' where "a'" = 4;""",
              """UPDATE tab3 SET "c'" = 2 * "c'" where "a'" = 1;""",
              "UPDATE tab4 SET b = 'blue', c = c * 2, d = d || ' updated' where a = 1;",
              "UPDATE tab4 SET b = 'red', c = c * 2, d = d || ' updated' where a = 2;"])
    assert result(ours, "SELECT * FROM tab1 ORDER BY a") == "1|4|\n2|3|\n4|5|\n5|6|", \
        "only update on column tab1.b is replicated"
    assert result(ours, """SELECT * FROM tab3 ORDER BY "a'\"""") == "1|6\n2|4\n4|6\n5|7", \
        "only update on column tab3.c is replicated"
    assert result(ours, "SELECT * FROM tab4 ORDER BY a") == (
        "1|blue|oh my updated\n2|red|hello updated\n3|red|foo\n4|blue|bar"), "update on column tab4.c is not replicated"

    catch_up(["INSERT INTO tab2 VALUES (2, 'def', 6);"])
    assert result(ours, "SELECT * FROM tab2 ORDER BY a") == "1|abc\n2|def", "insert on column tab2.c is not replicated"
    catch_up(["UPDATE tab2 SET c = 5 where a = 1; UPDATE tab2 SET b = 'xyz' where a = 2;"])
    assert result(ours, "SELECT * FROM tab2 ORDER BY a") == "1|abc\n2|xyz", "update on column tab2.c is not replicated"

    catch_up(["INSERT INTO tab5 VALUES (3, 33, 333, 3333); INSERT INTO tab5 VALUES (4, 44, 444, 4444);"])
    assert result(ours, "SELECT * FROM tab5 ORDER BY a") == "1|11|\n2|22|\n3|33|\n4|44|", \
        "overlapping publications with overlapping column lists"

    catch_up(["INSERT INTO tab6 VALUES (2, 33, 444, 5555); UPDATE tab6 SET b = b * 2, c = c * 3, d = d * 4;"])
    assert result(ours, "SELECT * FROM tab6 ORDER BY a") == "1|44||\n2|66||", "replication with the original primary key"
    run_script(src, ["ALTER TABLE tab6 DROP CONSTRAINT tab6_pkey; ALTER TABLE tab6 ADD PRIMARY KEY (b);"])
    execute(ours, "ALTER TABLE tab6 DROP CONSTRAINT tab6_pkey; ALTER TABLE tab6 ADD PRIMARY KEY (b);")
    catch_up(["INSERT INTO tab6 VALUES (3, 55, 666, 8888); UPDATE tab6 SET b = b * 2, c = c * 3, d = d * 4;"])
    assert result(ours, "SELECT * FROM tab6 ORDER BY a") == "1|88||\n2|132||\n3|110||", \
        "replication with the modified primary key"

    catch_up(["INSERT INTO tab7 VALUES (2, 33, 444, 5555); UPDATE tab7 SET b = b * 2, c = c * 3, d = d * 4;"])
    assert result(ours, "SELECT * FROM tab7 ORDER BY a") == "1|44||\n2|66||", "replication with the original primary key"
    catch_up(["ALTER TABLE tab7 DROP CONSTRAINT tab7_pkey; ALTER TABLE tab7 ADD PRIMARY KEY (a, b);",
              "INSERT INTO tab7 VALUES (3, 55, 666, 7777); UPDATE tab7 SET b = b * 2, c = c * 3, d = d * 4;"])
    assert result(ours, "SELECT * FROM tab7 ORDER BY a") == "1|88||\n2|132||\n3|110||", \
        "replication with the modified primary key"
    # Writes while tab7 has no replica identity at all (INSERT only), then a new one.
    catch_up(["ALTER TABLE tab7 DROP CONSTRAINT tab7_pkey; INSERT INTO tab7 VALUES (4, 77, 888, 9999);"
              "ALTER TABLE tab7 ADD PRIMARY KEY (b, a); UPDATE tab7 SET b = b * 2, c = c * 3, d = d * 4;"
              "DELETE FROM tab7 WHERE a = 1;"])
    assert result(ours, "SELECT * FROM tab7 ORDER BY a") == "2|264||\n3|220||\n4|154||", \
        "replication with the modified primary key"
