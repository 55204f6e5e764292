"""PostgreSQL's src/test/subscription/t/031_column_list.pl, on one pipeline.

As in the other TAP ports, the target is seeded with what the TAP test expects after its initial
copy, the changes after CREATE SUBSCRIPTION go through drain → stage → Spark apply (one apply per
``wait_for_catchup``), and the TAP test's expected rows are asserted. Publication column lists
become ``columns``; replica-identity changes on the source (tab6, tab7) are followed from the staged
relation versions, including writes while tab7 has no replica identity at all.

The partitioned tables (``test_031_column_list_partitions``, a stream of their own, one publication
with publish_via_partition_root and one without): via the root, the root's list applies — test_part
(multi-level, the subscriber without c), test_part_a/b/d (leaves whose replica identities the leaves'
lists would not cover), test_root (the leaf also published directly, without via-root), t_1/t_2
(pub4: the top-most ancestor *in the publication*, t_1, and its list); without it, each leaf's own list
(test_part_c, the lists changed between two runs, with the publisher's TRUNCATE). Not ported: pub3
(the same as pub4 here but for t_2's unused list), the s1.t schema-publication case and the FOR ALL
TABLES / TABLES IN SCHEMA cases (a publication without a list overriding one: a publication property,
only its result — no ``columns`` — is the apply's), the old-tuple byte check (pgoutput's own output),
and the different-lists errors (test_native_parity.py covers the drain's).
"""

from __future__ import annotations

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from scripts.harness.pgserver import execute, make_target, query
from scripts.harness.subscriber import drain_all, run_script
from tests.support.parity import source_with_slot

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


# The partitioned tables, with the TAP test's initial data. pub_via_root holds what pub1, pub6, pub7,
# pub9, pub_test_root and pub4 publish with publish_via_partition_root; pub_leaves what pub8 and
# pub_test_root_1 publish without it. The column lists are the apply's.
PARTITIONS_SOURCE = """
CREATE TABLE test_part (a int PRIMARY KEY, b text, c timestamptz) PARTITION BY LIST (a);
CREATE TABLE test_part_1_1 PARTITION OF test_part FOR VALUES IN (1,2,3,4,5,6);
CREATE TABLE test_part_2_1 PARTITION OF test_part FOR VALUES IN (7,8,9,10,11,12) PARTITION BY LIST (a);
CREATE TABLE test_part_2_2 PARTITION OF test_part_2_1 FOR VALUES IN (7,8,9,10);
INSERT INTO test_part VALUES (1, 'abc', '2021-07-04 12:00:00');
INSERT INTO test_part VALUES (2, 'bcd', '2021-07-03 11:12:13');
INSERT INTO test_part VALUES (7, 'abc', '2021-07-04 12:00:00');
INSERT INTO test_part VALUES (8, 'bcd', '2021-07-03 11:12:13');

CREATE TABLE test_part_a (a int, b int, c int) PARTITION BY LIST (a);
CREATE TABLE test_part_a_1 PARTITION OF test_part_a FOR VALUES IN (1,2,3,4,5);
ALTER TABLE test_part_a_1 ADD PRIMARY KEY (a);
ALTER TABLE test_part_a_1 REPLICA IDENTITY USING INDEX test_part_a_1_pkey;
CREATE TABLE test_part_a_2 PARTITION OF test_part_a FOR VALUES IN (6,7,8,9,10);
ALTER TABLE test_part_a_2 ADD PRIMARY KEY (b);
ALTER TABLE test_part_a_2 REPLICA IDENTITY USING INDEX test_part_a_2_pkey;
INSERT INTO test_part_a VALUES (1, 3);
INSERT INTO test_part_a VALUES (6, 4);

CREATE TABLE test_part_b (a int, b int) PARTITION BY LIST (a);
CREATE TABLE test_part_b_1 PARTITION OF test_part_b FOR VALUES IN (1,2,3,4,5);
ALTER TABLE test_part_b_1 ADD PRIMARY KEY (a);
ALTER TABLE test_part_b_1 REPLICA IDENTITY USING INDEX test_part_b_1_pkey;
CREATE TABLE test_part_b_2 PARTITION OF test_part_b FOR VALUES IN (6,7,8,9,10);
ALTER TABLE test_part_b_2 ADD PRIMARY KEY (b);
ALTER TABLE test_part_b_2 REPLICA IDENTITY USING INDEX test_part_b_2_pkey;
INSERT INTO test_part_b VALUES (1, 1);
INSERT INTO test_part_b VALUES (6, 2);

CREATE TABLE test_part_c (a int, b int, c int) PARTITION BY LIST (a);
CREATE TABLE test_part_c_1 PARTITION OF test_part_c FOR VALUES IN (1,3);
ALTER TABLE test_part_c_1 ADD PRIMARY KEY (a);
ALTER TABLE test_part_c_1 REPLICA IDENTITY USING INDEX test_part_c_1_pkey;
CREATE TABLE test_part_c_2 PARTITION OF test_part_c FOR VALUES IN (2,4);
ALTER TABLE test_part_c_2 ADD PRIMARY KEY (b);
ALTER TABLE test_part_c_2 REPLICA IDENTITY USING INDEX test_part_c_2_pkey;
INSERT INTO test_part_c VALUES (1, 3, 5);
INSERT INTO test_part_c VALUES (2, 4, 6);

CREATE TABLE test_part_d (a int, b int) PARTITION BY LIST (a);
CREATE TABLE test_part_d_1 PARTITION OF test_part_d FOR VALUES IN (1,3);
ALTER TABLE test_part_d_1 ADD PRIMARY KEY (a);
ALTER TABLE test_part_d_1 REPLICA IDENTITY USING INDEX test_part_d_1_pkey;
INSERT INTO test_part_d VALUES (1, 2);

CREATE TABLE test_root (a int PRIMARY KEY, b int, c int) PARTITION BY RANGE (a);
CREATE TABLE test_root_1 PARTITION OF test_root FOR VALUES FROM (1) TO (10);
CREATE TABLE test_root_2 PARTITION OF test_root FOR VALUES FROM (10) TO (20);
INSERT INTO test_root VALUES (1, 2, 3);
INSERT INTO test_root VALUES (10, 20, 30);

CREATE TABLE t (a int, b int, c int) PARTITION BY RANGE (a);
CREATE TABLE t_1 PARTITION OF t FOR VALUES FROM (1) TO (10) PARTITION BY RANGE (a);
CREATE TABLE t_2 PARTITION OF t_1 FOR VALUES FROM (1) TO (10);
INSERT INTO t VALUES (1, 2, 3);

CREATE PUBLICATION pub_via_root FOR TABLE test_part, test_part_a, test_part_a_1, test_part_a_2, test_part_b,
    test_part_d, test_root, t_1, t_2 WITH (publish_via_partition_root = true);
CREATE PUBLICATION pub_leaves FOR TABLE test_part_c, test_root_1;
"""
PARTITIONS_SUBSCRIBER = """
CREATE TABLE test_part (a int PRIMARY KEY, b text) PARTITION BY LIST (a);
CREATE TABLE test_part_1_1 PARTITION OF test_part FOR VALUES IN (1,2,3,4,5,6);
CREATE TABLE test_part_2_1 PARTITION OF test_part FOR VALUES IN (7,8,9,10,11,12) PARTITION BY LIST (a);
CREATE TABLE test_part_2_2 PARTITION OF test_part_2_1 FOR VALUES IN (7,8,9,10);
INSERT INTO test_part VALUES (1, 'abc'), (2, 'bcd'), (7, 'abc'), (8, 'bcd');

CREATE TABLE test_part_a (b int, a int) PARTITION BY LIST (a);
CREATE TABLE test_part_a_1 PARTITION OF test_part_a FOR VALUES IN (1,2,3,4,5);
ALTER TABLE test_part_a_1 ADD PRIMARY KEY (a);
ALTER TABLE test_part_a_1 REPLICA IDENTITY USING INDEX test_part_a_1_pkey;
CREATE TABLE test_part_a_2 PARTITION OF test_part_a FOR VALUES IN (6,7,8,9,10);
ALTER TABLE test_part_a_2 ADD PRIMARY KEY (b);
ALTER TABLE test_part_a_2 REPLICA IDENTITY USING INDEX test_part_a_2_pkey;
INSERT INTO test_part_a (a, b) VALUES (1, 3), (6, 4);

CREATE TABLE test_part_b (a int, b int) PARTITION BY LIST (a);
CREATE TABLE test_part_b_1 PARTITION OF test_part_b FOR VALUES IN (1,2,3,4,5);
ALTER TABLE test_part_b_1 ADD PRIMARY KEY (a);
ALTER TABLE test_part_b_1 REPLICA IDENTITY USING INDEX test_part_b_1_pkey;
CREATE TABLE test_part_b_2 PARTITION OF test_part_b FOR VALUES IN (6,7,8,9,10);
ALTER TABLE test_part_b_2 ADD PRIMARY KEY (b);
ALTER TABLE test_part_b_2 REPLICA IDENTITY USING INDEX test_part_b_2_pkey;
INSERT INTO test_part_b VALUES (1, 1), (6, 2);

CREATE TABLE test_part_c (a int, b int, c int) PARTITION BY LIST (a);
CREATE TABLE test_part_c_1 PARTITION OF test_part_c FOR VALUES IN (1,3);
ALTER TABLE test_part_c_1 ADD PRIMARY KEY (a);
ALTER TABLE test_part_c_1 REPLICA IDENTITY USING INDEX test_part_c_1_pkey;
CREATE TABLE test_part_c_2 PARTITION OF test_part_c FOR VALUES IN (2,4);
ALTER TABLE test_part_c_2 ADD PRIMARY KEY (b);
ALTER TABLE test_part_c_2 REPLICA IDENTITY USING INDEX test_part_c_2_pkey;
INSERT INTO test_part_c VALUES (1, NULL, 5), (2, 4, NULL);

CREATE TABLE test_part_d (a int, b int) PARTITION BY LIST (a);
CREATE TABLE test_part_d_1 PARTITION OF test_part_d FOR VALUES IN (1,3);
ALTER TABLE test_part_d_1 ADD PRIMARY KEY (a);
ALTER TABLE test_part_d_1 REPLICA IDENTITY USING INDEX test_part_d_1_pkey;
CREATE TABLE test_part_d_2 PARTITION OF test_part_d FOR VALUES IN (2,4);
ALTER TABLE test_part_d_2 ADD PRIMARY KEY (a);
ALTER TABLE test_part_d_2 REPLICA IDENTITY USING INDEX test_part_d_2_pkey;
INSERT INTO test_part_d (a) VALUES (1);

CREATE TABLE test_root (a int PRIMARY KEY, b int, c int) PARTITION BY RANGE (a);
CREATE TABLE test_root_1 PARTITION OF test_root FOR VALUES FROM (1) TO (10);
CREATE TABLE test_root_2 PARTITION OF test_root FOR VALUES FROM (10) TO (20);
INSERT INTO test_root (a) VALUES (1), (10);

CREATE TABLE t (a int, b int, c int) PARTITION BY RANGE (a);
CREATE TABLE t_1 PARTITION OF t FOR VALUES FROM (1) TO (10) PARTITION BY RANGE (a);
CREATE TABLE t_2 PARTITION OF t_1 FOR VALUES FROM (1) TO (10);
INSERT INTO t (a) VALUES (1);
"""
PARTITION_COLUMN_LISTS = {
    "test_part": ("a", "b"),
    # pub6: via the root, the root's list (b, a); the leaves' lists (a) and (b) are not used.
    "test_part_a": ("b", "a"), "test_part_a_1": ("a",), "test_part_a_2": ("b",),
    "test_part_b": ("a", "b"),
    # pub8: without publish_via_partition_root, each leaf's own list.
    "test_part_c_1": ("a", "c"), "test_part_c_2": ("a", "b"),
    "test_part_d": ("a",),
    # pub_test_root via the root (a), pub_test_root_1 the leaf without it (a, b): the root's list.
    "test_root": ("a",), "test_root_1": ("a", "b"),
    # pub4: t_1 (a), t_2 (b) via the root: the top-most ancestor in the publication, t_1, and its list.
    "t_1": ("a",), "t_2": ("b",),
}


def test_031_column_list_partitions(pg_server, spark, tmp_path):
    """Column lists of partitioned tables: via the root (the root's list; multi-level partitions;
    leaves with other replica identities than the list covers), leaves without it (their own lists,
    changed between two runs), and the top-most published ancestor's list."""
    with source_with_slot(pg_server, PARTITIONS_SOURCE) as (src, slot):
        ours, uri = make_target(pg_server)[1], str(tmp_path / "staging")
        execute(ours, PARTITIONS_SUBSCRIBER)

        def catch_up(transactions: list[str], lists: dict[str, tuple[str, ...]]) -> None:
            run_script(src, transactions)
            drain_all(src, uri, slot=slot, publication=("pub_via_root", "pub_leaves"))
            apply_slot(spark, ApplyConfig(slot=slot, staging_root=uri, tables={
                f"public.{t}": TableApplyConfig(columns=c) for t, c in lists.items()}), ours)

        catch_up(["INSERT INTO test_part VALUES (3, 'xxx', '2022-02-01 10:00:00');"
                  " INSERT INTO test_part VALUES (4, 'yyy', '2022-03-02 15:12:13');"
                  " INSERT INTO test_part VALUES (9, 'zzz', '2022-04-03 21:00:00');"
                  " INSERT INTO test_part VALUES (10, 'qqq', '2022-05-04 22:12:13');",
                  "INSERT INTO test_part_a VALUES (2, 5); INSERT INTO test_part_a VALUES (7, 6);",
                  "INSERT INTO test_part_b VALUES (2, 3); INSERT INTO test_part_b VALUES (7, 4);",
                  "INSERT INTO test_part_c VALUES (3, 7, 8); INSERT INTO test_part_c VALUES (4, 9, 10);",
                  "INSERT INTO test_part_d VALUES (3, 4);",
                  "INSERT INTO test_root VALUES (2, 3, 4); INSERT INTO test_root VALUES (11, 21, 31);",
                  "INSERT INTO t VALUES (4, 5, 6);"], PARTITION_COLUMN_LISTS)
        assert result(ours, "SELECT * FROM test_part ORDER BY a") == (
            "1|abc\n2|bcd\n3|xxx\n4|yyy\n7|abc\n8|bcd\n9|zzz\n10|qqq"), \
            "insert on column test_part.c columns is not replicated"
        assert result(ours, "SELECT a, b FROM test_part_a ORDER BY a, b") == "1|3\n2|5\n6|4\n7|6", \
            "partitions with different replica identities not replicated correctly"
        assert result(ours, "SELECT * FROM test_part_b ORDER BY a, b") == "1|1\n2|3\n6|2\n7|4", \
            "partitions with different replica identities not replicated correctly"
        assert result(ours, "SELECT * FROM test_part_c ORDER BY a, b") == "1||5\n2|4|\n3||8\n4|9|", \
            "partitions with different replica identities not replicated correctly"
        assert result(ours, "SELECT * FROM test_part_d ORDER BY a, b") == "1|\n3|", \
            "partitions with different replica identities not replicated correctly"
        assert result(ours, "SELECT * FROM test_root ORDER BY a, b, c") == "1||\n2||\n10||\n11||", \
            "publication via partition root applies column list"
        assert result(ours, "SELECT * FROM t ORDER BY a, b, c") == "1||\n4||", \
            "publication containing both parent and child relation"

        # pub8 again with test_part_c_1 (a): the subscriber's table truncated, then the publisher's.
        execute(ours, "TRUNCATE test_part_c")
        catch_up(["TRUNCATE test_part_c; INSERT INTO test_part_c VALUES (1, 3, 5); INSERT INTO test_part_c VALUES (2, 4, 6);"],
                 {**PARTITION_COLUMN_LISTS, "test_part_c_1": ("a",)})
        assert result(ours, "SELECT * FROM test_part_c ORDER BY a, b") == "1||\n2|4|", \
            "partitions with different replica identities not replicated correctly"
