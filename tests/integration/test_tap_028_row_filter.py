"""PostgreSQL's src/test/subscription/t/028_row_filter.pl, the scenarios a spec can express, on one pipeline.

The TAP test's initial copy (tablesync) has no counterpart here (changes before the slot exist are
not streamed), so the target is seeded with the rows the TAP test expects after it; the changes
made after CREATE SUBSCRIPTION then go through drain → stage → Spark apply and the TAP test's
expected rows are asserted. Several publications of one table become one OR-ed filter, and a
publication without a filter wins (no filter), as PostgreSQL combines them.

The partitioned tables (``test_028_row_filter_partitions``, a stream of their own): the publications
keep the TAP test's partition semantics without filters. Without publish_via_partition_root each leaf's
changes come under its own name and apply into the same-named leaf table with the leaf's filter
(tab_rowfilter_less_10k/greater_10k, tab_rowfilter_partition, and "TABLES IN SCHEMA"'s
tab_rf_partition in another schema than its root); with it, under the top-most published ancestor
with that ancestor's filter (tab_rowfilter_viaroot_part, tab_rowfilter_parent_sync); tap_pub_3 is
switched to publish_via_partition_root mid-stream as in the TAP test. There the TAP test's inserts
before CREATE SUBSCRIPTION are streamed, since tablesync picks the same relation and filter for them
as pgoutput does, except tab_rowfilter_partitioned's re-copy after the switch, which is seeded. The same
stream is also applied with the leaves routed to the root's table (``leaves: route_to_root``, the
root's filter): it reaches the TAP test's publish_via_partition_root rows without a re-copy. Not
ported: the FOR ALL TABLES case (that such a publication overrides a table's filter is a publication
property; the apply only has its result, an entry without a filter, as for schema_rf_x.tab_rf_x here)
and the initial copy itself.
"""

from __future__ import annotations

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from scripts.harness.pgserver import execute, make_target, query
from scripts.harness.subscriber import drain_all, run_script
from tests.support.parity import source_with_slot

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


# The partitioned tables of "FOR TABLE with row filter publications". The publications keep the TAP
# test's partition semantics (which tables, publish_via_partition_root or not), without filters: the
# filters are the apply's. pub_3 is tap_pub_3, pub_5 tap_pub_5a/5b, pub_viaroot tap_pub_viaroot_1/2 and
# tap_pub_parent_sync, pub_child_sync tap_pub_child_sync; pub_schema is "TABLES IN SCHEMA"'s
# tap_pub_allinschema.
PARTITIONS_SOURCE = """
CREATE TABLE tab_rowfilter_partitioned (a int primary key, b integer) PARTITION BY RANGE(a);
CREATE TABLE tab_rowfilter_less_10k (LIKE tab_rowfilter_partitioned);
ALTER TABLE tab_rowfilter_partitioned ATTACH PARTITION tab_rowfilter_less_10k FOR VALUES FROM (MINVALUE) TO (10000);
CREATE TABLE tab_rowfilter_greater_10k (LIKE tab_rowfilter_partitioned);
ALTER TABLE tab_rowfilter_partitioned ATTACH PARTITION tab_rowfilter_greater_10k FOR VALUES FROM (10000) TO (MAXVALUE);
CREATE TABLE tab_rowfilter_partitioned_2 (a int primary key, b integer) PARTITION BY RANGE(a);
CREATE TABLE tab_rowfilter_partition (LIKE tab_rowfilter_partitioned_2);
ALTER TABLE tab_rowfilter_partitioned_2 ATTACH PARTITION tab_rowfilter_partition DEFAULT;
CREATE TABLE tab_rowfilter_viaroot_part (a int) PARTITION BY RANGE (a);
CREATE TABLE tab_rowfilter_viaroot_part_1 PARTITION OF tab_rowfilter_viaroot_part FOR VALUES FROM (1) TO (20);
CREATE TABLE tab_rowfilter_parent_sync (a int) PARTITION BY RANGE (a);
CREATE TABLE tab_rowfilter_child_sync PARTITION OF tab_rowfilter_parent_sync FOR VALUES FROM (1) TO (20);
CREATE SCHEMA schema_rf_x;
CREATE TABLE schema_rf_x.tab_rf_x (x int primary key);
CREATE TABLE schema_rf_x.tab_rf_partitioned (x int primary key) PARTITION BY RANGE(x);
CREATE TABLE public.tab_rf_partition (LIKE schema_rf_x.tab_rf_partitioned);
ALTER TABLE schema_rf_x.tab_rf_partitioned ATTACH PARTITION public.tab_rf_partition DEFAULT;
CREATE PUBLICATION pub_3 FOR TABLE tab_rowfilter_partitioned, tab_rowfilter_less_10k;
CREATE PUBLICATION pub_5 FOR TABLE tab_rowfilter_partitioned_2, tab_rowfilter_partition;
CREATE PUBLICATION pub_viaroot FOR TABLE tab_rowfilter_viaroot_part, tab_rowfilter_viaroot_part_1,
    tab_rowfilter_parent_sync WITH (publish_via_partition_root);
CREATE PUBLICATION pub_child_sync FOR TABLE tab_rowfilter_child_sync;
CREATE PUBLICATION pub_schema FOR TABLES IN SCHEMA schema_rf_x, TABLE public.tab_rf_partition;
"""
PARTITION_PUBLICATIONS = ("pub_3", "pub_5", "pub_viaroot", "pub_child_sync", "pub_schema")
PARTITIONS_SUBSCRIBER = """
CREATE TABLE tab_rowfilter_partitioned (a int primary key, b integer) PARTITION BY RANGE(a);
CREATE TABLE tab_rowfilter_less_10k (LIKE tab_rowfilter_partitioned);
ALTER TABLE tab_rowfilter_partitioned ATTACH PARTITION tab_rowfilter_less_10k FOR VALUES FROM (MINVALUE) TO (10000);
CREATE TABLE tab_rowfilter_greater_10k (LIKE tab_rowfilter_partitioned);
ALTER TABLE tab_rowfilter_partitioned ATTACH PARTITION tab_rowfilter_greater_10k FOR VALUES FROM (10000) TO (MAXVALUE);
CREATE TABLE tab_rowfilter_partitioned_2 (a int primary key, b integer) PARTITION BY RANGE(a);
CREATE TABLE tab_rowfilter_partition (LIKE tab_rowfilter_partitioned_2);
ALTER TABLE tab_rowfilter_partitioned_2 ATTACH PARTITION tab_rowfilter_partition DEFAULT;
CREATE TABLE tab_rowfilter_viaroot_part (a int);
CREATE TABLE tab_rowfilter_viaroot_part_1 (a int);
CREATE TABLE tab_rowfilter_parent_sync (a int);
CREATE TABLE tab_rowfilter_child_sync (a int);
CREATE SCHEMA schema_rf_x;
CREATE TABLE schema_rf_x.tab_rf_x (x int primary key);
CREATE TABLE schema_rf_x.tab_rf_partitioned (x int primary key) PARTITION BY RANGE(x);
CREATE TABLE public.tab_rf_partition (LIKE schema_rf_x.tab_rf_partitioned);
ALTER TABLE schema_rf_x.tab_rf_partitioned ATTACH PARTITION public.tab_rf_partition DEFAULT;
"""
PARTITION_FILTERS = {
    # publish_via_partition_root = false: each leaf's own filter. tap_pub_3 publishes the root (no row
    # for the leaf in pg_publication_rel) and tab_rowfilter_less_10k WHERE (a < 6000): the leaf's filter.
    "public.tab_rowfilter_less_10k": TableApplyConfig(row_filter="a < 6000"),
    "public.tab_rowfilter_greater_10k": TableApplyConfig(),
    # After ALTER PUBLICATION tap_pub_3 SET (publish_via_partition_root = true): the root's filter.
    "public.tab_rowfilter_partitioned": TableApplyConfig(row_filter="a < 5000"),
    # tap_pub_5a (the root, no filter) OR tap_pub_5b (the leaf WHERE (a > 10)): no filter.
    "public.tab_rowfilter_partition": TableApplyConfig(),
    # Both via the root: the top-most ancestor's filter; the leaves' entries are never used.
    "public.tab_rowfilter_viaroot_part": TableApplyConfig(row_filter="a > 15"),
    "public.tab_rowfilter_viaroot_part_1": TableApplyConfig(row_filter="a < 15"),
    "public.tab_rowfilter_parent_sync": TableApplyConfig(row_filter="a > 15"),
    "public.tab_rowfilter_child_sync": TableApplyConfig(row_filter="a < 15"),
    # TABLES IN SCHEMA: no filter for the schema's table; the leaf in another schema keeps its own.
    "schema_rf_x.tab_rf_x": TableApplyConfig(),
    "public.tab_rf_partition": TableApplyConfig(row_filter="x > 10"),
}
# The TAP test's inserts before CREATE SUBSCRIPTION into the partitioned tables, streamed here: with
# these publications tablesync and pgoutput pick the same relation and filter for each row.
PARTITION_ROWS = [
    "INSERT INTO tab_rowfilter_parent_sync(a) VALUES(14), (16);",
    "INSERT INTO tab_rowfilter_partitioned (a, b) VALUES(1, 100),(7000, 101),(15000, 102),(5500, 300);",
    "INSERT INTO tab_rowfilter_less_10k (a, b) VALUES(2, 200),(6005, 201);",
    "INSERT INTO tab_rowfilter_greater_10k (a, b) VALUES(16000, 103);",
    "INSERT INTO tab_rowfilter_partitioned_2 (a, b) VALUES(1, 1),(20, 20);",
    "INSERT INTO tab_rowfilter_viaroot_part (a) VALUES (14), (15), (16);",
    "INSERT INTO schema_rf_x.tab_rf_x (x) VALUES (0), (5), (10), (15), (20);",
    "INSERT INTO schema_rf_x.tab_rf_partitioned (x) VALUES (1), (20);",
    "INSERT INTO schema_rf_x.tab_rf_x (x) VALUES (-99), (99);",
    "INSERT INTO schema_rf_x.tab_rf_partitioned (x) VALUES (5), (25);",
]
# After tap_pub_3 switches to publish_via_partition_root (the TAP test's second phase).
VIA_ROOT_ROWS = [
    "INSERT INTO tab_rowfilter_partitioned (a, b) VALUES(4000, 400),(4001, 401),(4002, 402);",
    "INSERT INTO tab_rowfilter_less_10k (a, b) VALUES(4500, 450);",
    "INSERT INTO tab_rowfilter_less_10k (a, b) VALUES(5600, 123);",
    "INSERT INTO tab_rowfilter_greater_10k (a, b) VALUES(14000, 1950);",
    "UPDATE tab_rowfilter_less_10k SET b = 30 WHERE a = 4001;",
    "DELETE FROM tab_rowfilter_less_10k WHERE a = 4002;",
]
VIA_ROOT_EXPECTED = "1|100\n2|200\n4000|400\n4001|30\n4500|450"


def test_028_row_filter_partitions(pg_server, spark, tmp_path):
    """Leaves published under their own names with their own filters, publish_via_partition_root with
    the top-most ancestor's filter, a publication switched to publish_via_partition_root mid-stream; and
    the same stream with the leaves routed to the root's table (``leaves: route_to_root``) and the
    root's filter, which reaches the TAP test's publish_via_partition_root rows without a re-copy."""
    with source_with_slot(pg_server, PARTITIONS_SOURCE) as (src, slot):
        ours, routed = make_target(pg_server)[1], make_target(pg_server)[1]
        uri = str(tmp_path / "staging")
        execute(ours, PARTITIONS_SUBSCRIBER)
        execute(routed, "CREATE TABLE tab_rowfilter_partitioned (a int primary key, b integer)")
        config = ApplyConfig(slot=slot, staging_root=uri, tables=PARTITION_FILTERS)
        routing = ApplyConfig(slot=slot, staging_root=uri, tables={
            "public.tab_rowfilter_partitioned": TableApplyConfig(row_filter="a < 5000", leaves="route_to_root")})

        def catch_up(transactions: list[str]) -> None:
            run_script(src, transactions)
            drain_all(src, uri, slot=slot, publication=PARTITION_PUBLICATIONS)
            apply_slot(spark, config, ours)
            apply_slot(spark, routing, routed)

        catch_up(PARTITION_ROWS)
        assert result(ours, "SELECT a, b FROM tab_rowfilter_less_10k ORDER BY 1, 2") == "1|100\n2|200\n5500|300", \
            "check initial data copy from partition tab_rowfilter_less_10k"
        assert result(ours, "SELECT a, b FROM tab_rowfilter_greater_10k ORDER BY 1, 2") == "15000|102\n16000|103", \
            "check initial data copy from partition tab_rowfilter_greater_10k"
        assert result(ours, "SELECT a, b FROM tab_rowfilter_partition ORDER BY 1, 2") == "1|1\n20|20", \
            "check initial data copy from partition tab_rowfilter_partition"
        assert result(ours, "SELECT a FROM tab_rowfilter_parent_sync ORDER BY 1") == "16", \
            "check initial data copy from tab_rowfilter_parent_sync"
        assert result(ours, "SELECT a FROM tab_rowfilter_child_sync ORDER BY 1") == "", \
            "check initial data copy from tab_rowfilter_child_sync"
        assert result(ours, "SELECT a FROM tab_rowfilter_viaroot_part") == "16", \
            "check replicated rows to tab_rowfilter_viaroot_part"
        assert result(ours, "SELECT a FROM tab_rowfilter_viaroot_part_1") == "", \
            "check replicated rows to tab_rowfilter_viaroot_part_1"
        assert result(ours, "SELECT count(x) FROM schema_rf_x.tab_rf_x") == "7", \
            "check table tab_rf_x should not be filtered"
        assert result(ours, "SELECT * FROM public.tab_rf_partition") == "20\n25", \
            "check table tab_rf_partition should be filtered"
        # Routed: every leaf's rows through the root's filter, as publish_via_partition_root would send them.
        assert result(routed, "SELECT a, b FROM tab_rowfilter_partitioned ORDER BY 1, 2") == "1|100\n2|200"

        # The TAP test's second phase: tap_pub_3 via the root; the subscriber's table truncated and copied
        # again with the root's filter (the rows the TAP test expects of that copy are seeded).
        execute(src, "ALTER PUBLICATION pub_3 SET (publish_via_partition_root = true)")
        execute(ours, "TRUNCATE TABLE tab_rowfilter_partitioned; "
                      "INSERT INTO tab_rowfilter_partitioned VALUES (1, 100), (2, 200)")
        catch_up(VIA_ROOT_ROWS)
        assert result(ours, "SELECT a, b FROM tab_rowfilter_partitioned ORDER BY 1, 2") == VIA_ROOT_EXPECTED, \
            "check publish_via_partition_root behavior"
        assert result(routed, "SELECT a, b FROM tab_rowfilter_partitioned ORDER BY 1, 2") == VIA_ROOT_EXPECTED, \
            "check publish_via_partition_root behavior"
