"""Native-subscriber equivalence for what used to be refused up front: a table without a replica identity
(INSERT/TRUNCATE only), a filter outside the replica identity with insert-only publishing, published actions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from scripts.harness.pgserver import execute, make_database, make_target, query
from scripts.harness.subscriber import (
    drain_all,
    drop_slot_when_idle,
    run_script,
    subscribe,
    unsubscribe,
    wait_for_subscriber,
)
from tests.support.parity import source_with_slot

TABLES_SQL = """
CREATE TABLE logs (at int, msg text);
CREATE TABLE events (id int PRIMARY KEY, kind int, note text);
CREATE TABLE audit (id int PRIMARY KEY, v text);
"""
PUBLICATIONS_SQL = """
CREATE PUBLICATION pub_native FOR TABLE logs, events WHERE (kind > 5) WITH (publish = 'insert, truncate');
CREATE PUBLICATION pub_native_audit FOR TABLE audit WITH (publish = 'insert, delete');
CREATE PUBLICATION pub_all FOR TABLE logs, events, audit;
"""
APPLY_TABLES = {
    "public.logs": TableApplyConfig(actions=("insert", "truncate")),
    "public.events": TableApplyConfig(row_filter="kind > 5", actions=("insert", "truncate")),
    "public.audit": TableApplyConfig(actions=("insert", "delete")),
}
SCRIPT = [
    "INSERT INTO logs VALUES (1, 'a'), (1, 'a'), (2, 'b'); INSERT INTO events VALUES (1, 9, 'in'), (2, 1, 'out');",
    "UPDATE events SET kind = 1 WHERE id = 1; UPDATE events SET kind = 9 WHERE id = 2; INSERT INTO audit VALUES (1, 'x');",
    "INSERT INTO audit VALUES (2, 'y'); UPDATE audit SET v = 'changed' WHERE id = 1; DELETE FROM audit WHERE id = 2;",
    "TRUNCATE logs; INSERT INTO logs VALUES (3, 'c'); INSERT INTO events VALUES (3, 7, 'late');",
    "TRUNCATE events; INSERT INTO events VALUES (4, 8, 'after'), (5, 2, 'no');",
]


def test_insert_only_tables_filters_and_actions_match_a_native_subscriber(pg_server, spark, tmp_path):
    from airflow_provider_pglogical.apply.runner import apply_slot

    with source_with_slot(pg_server, TABLES_SQL + PUBLICATIONS_SQL) as (src, slot), \
            native_and_ours(pg_server, src, slot, TABLES_SQL, "pub_native, pub_native_audit") as (native_db, ours):
        run_script(src, SCRIPT)
        uri = str(tmp_path / "staging")
        drain_all(src, uri, slot=slot)
        apply_slot(spark, ApplyConfig(slot=slot, staging_root=uri, tables=APPLY_TABLES), ours)
        wait_for_subscriber(src, native_db, name=f"n_{slot}")
        for table in ("logs", "events", "audit"):
            sql = f"SELECT * FROM {table} ORDER BY 1, 2"  # module constants
            assert query(ours, sql) == query(native_db, sql), table
        # Not vacuous: duplicates, the truncate, the unpublished UPDATEs and the filter all show.
        assert query(native_db, "SELECT * FROM logs ORDER BY 1") == [(3, "c")]
        assert query(native_db, "SELECT * FROM events ORDER BY 1") == [(4, 8, "after")]
        assert query(native_db, "SELECT * FROM audit ORDER BY 1") == [(1, "x")]


@contextmanager
def native_and_ours(pg_server, src: str, slot: str, native_sql: str, publication: str) -> Iterator[tuple[str, str]]:
    """A native subscriber of ``publication`` (tables from ``native_sql``) and our empty target: (native, ours)."""
    native_name = make_database(pg_server)
    native_db = pg_server.dsn(native_name)
    ours = make_target(pg_server)[1]
    execute(native_db, native_sql)
    subscribe(src, native_db, publication=publication, name=f"n_{slot}")
    try:
        yield native_db, ours
    finally:
        unsubscribe(native_db, name=f"n_{slot}")
        drop_slot_when_idle(src, f"n_{slot}")
        execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{native_name}" WITH (FORCE)')


UNION_TABLES_SQL = """
CREATE TABLE t_or (id int PRIMARY KEY, k int); ALTER TABLE t_or REPLICA IDENTITY FULL;
CREATE TABLE t_nofilter (id int PRIMARY KEY, k int); ALTER TABLE t_nofilter REPLICA IDENTITY FULL;
"""
UNION_PUBLICATIONS_SQL = """
CREATE PUBLICATION pub_x FOR TABLE t_or WHERE (k > 5), t_nofilter WHERE (k > 5);
CREATE PUBLICATION pub_y FOR TABLE t_or WHERE (k < 0), t_nofilter;
"""
UNION_SCRIPT = [
    "INSERT INTO t_or VALUES (1, -1), (2, 3), (3, 9), (4, 7); INSERT INTO t_nofilter VALUES (1, -1), (2, 3), (3, 9);",
    "UPDATE t_or SET k = 3 WHERE id = 3; UPDATE t_or SET k = -2 WHERE id = 2; UPDATE t_nofilter SET k = 4 WHERE id = 3;",
    "UPDATE t_or SET k = 8 WHERE id = 1; DELETE FROM t_or WHERE id = 4; DELETE FROM t_nofilter WHERE id = 1;",
]


def test_several_publications_union_their_row_filters_like_a_native_subscription(pg_server, spark, tmp_path):
    """Filters of one table in two publications are OR-ed; a publication without a filter wins."""
    from airflow_provider_pglogical.apply.runner import apply_slot

    with source_with_slot(pg_server, UNION_TABLES_SQL + UNION_PUBLICATIONS_SQL) as (src, slot), \
            native_and_ours(pg_server, src, slot, UNION_TABLES_SQL, "pub_x, pub_y") as (native_db, ours):
        run_script(src, UNION_SCRIPT)
        uri = str(tmp_path / "staging")
        drain_all(src, uri, slot=slot, publication=("pub_x", "pub_y"))
        tables = {"public.t_or": TableApplyConfig(), "public.t_nofilter": TableApplyConfig()}
        apply_slot(spark, ApplyConfig(slot=slot, staging_root=uri, tables=tables), ours)
        wait_for_subscriber(src, native_db, name=f"n_{slot}")
        for table in ("t_or", "t_nofilter"):
            sql = f"SELECT * FROM {table} ORDER BY 1"  # module constants
            assert query(ours, sql) == query(native_db, sql), table
        # Not vacuous: rows outside both filters are gone or never came; t_nofilter has every row.
        assert query(native_db, "SELECT * FROM t_or ORDER BY 1") == [(1, 8), (2, -2)]
        assert query(native_db, "SELECT * FROM t_nofilter ORDER BY 1") == [(2, 3), (3, 4)]


def test_different_column_lists_of_one_table_in_two_publications_stop_the_drain_as_pgoutput_does(pg_server, tmp_path):
    """PostgreSQL 15+: a table published with different column lists by the publications decoded
    together is an error of the publisher (pgoutput_column_list_init); nothing is staged."""
    import psycopg2

    setup = """CREATE TABLE t_cols (id int PRIMARY KEY, a int, b int);
               CREATE PUBLICATION pub_c1 FOR TABLE t_cols (id, a); CREATE PUBLICATION pub_c2 FOR TABLE t_cols (id, b);"""
    with source_with_slot(pg_server, setup) as (src, slot):
        run_script(src, ["INSERT INTO t_cols VALUES (1, 2, 3);"])
        uri = str(tmp_path / "staging")
        with pytest.raises(psycopg2.Error, match="different column lists"):
            drain_all(src, uri, slot=slot, publication=("pub_c1", "pub_c2"))
        assert drain_all(src, uri, slot=slot, publication="pub_c1") == 1  # one publication: fine


PARTITIONED_SQL = """
CREATE TABLE meas (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE meas_eu PARTITION OF meas FOR VALUES IN ('eu');
CREATE TABLE meas_us PARTITION OF meas FOR VALUES IN ('us');
"""
PARTITION_SCRIPT = [
    "INSERT INTO meas VALUES (1, 'eu', 1), (2, 'eu', 2), (3, 'us', 3), (4, 'us', 4);",
    # a cross-partition UPDATE is a DELETE from one leaf and an INSERT into the other
    "UPDATE meas SET region = 'us', v = 10 WHERE id = 1; UPDATE meas SET v = 30 WHERE id = 3;",
    "DELETE FROM meas WHERE id = 4; INSERT INTO meas VALUES (5, 'eu', 5);",
    # via the root, a leaf's TRUNCATE is not published (pgoutput_truncate skips partitions)
    "TRUNCATE meas_eu; INSERT INTO meas VALUES (6, 'eu', 6);",
    "INSERT INTO meas VALUES (7, 'us', 7); UPDATE meas SET v = v + 1 WHERE region = 'us';",
]


def test_a_partitioned_table_published_via_its_root_matches_a_native_subscriber(pg_server, spark, tmp_path):
    """publish_via_partition_root: every leaf's changes arrive as the root's, in LSN order; our target
    is itself partitioned (other leaves than the source's), the native one a plain table."""
    from airflow_provider_pglogical.apply.runner import apply_slot

    setup = PARTITIONED_SQL + "CREATE PUBLICATION pub_root FOR TABLE meas WITH (publish_via_partition_root = true);"
    with source_with_slot(pg_server, setup) as (src, slot), \
            native_and_ours(pg_server, src, slot, "CREATE TABLE meas (id int, region text, v int, PRIMARY KEY (id, region))",
                            "pub_root") as (native_db, ours):
        execute(ours, "CREATE TABLE meas (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY HASH (id);"
                      "CREATE TABLE meas_h0 PARTITION OF meas FOR VALUES WITH (MODULUS 2, REMAINDER 0);"
                      "CREATE TABLE meas_h1 PARTITION OF meas FOR VALUES WITH (MODULUS 2, REMAINDER 1);")
        run_script(src, PARTITION_SCRIPT[:3])
        uri = str(tmp_path / "staging")
        drain_all(src, uri, slot=slot, publication="pub_root")
        config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.meas": TableApplyConfig()})
        apply_slot(spark, config, ours)
        run_script(src, PARTITION_SCRIPT[3:])
        drain_all(src, uri, slot=slot, publication="pub_root")
        apply_slot(spark, config, ours)
        wait_for_subscriber(src, native_db, name=f"n_{slot}")
        sql = "SELECT * FROM meas ORDER BY 1, 2"
        assert query(ours, sql) == query(native_db, sql)
        # Not vacuous: the moved row, the unpublished leaf TRUNCATE (rows 2 and 5 stay there).
        assert query(native_db, sql) == [(1, "us", 11), (2, "eu", 2), (3, "us", 31), (5, "eu", 5), (6, "eu", 6),
                                         (7, "us", 8)]
        assert query(src, "SELECT count(*) FROM meas") == [(4,)]
        assert query(ours, "SELECT count(*) FROM ONLY meas") == [(0,)]  # the rows live in our hash leaves
