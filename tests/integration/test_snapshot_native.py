"""Snapshot + changes against a native subscriber created with copy_data = true, on the same pre-existing rows,
with writers inserting, updating, deleting and truncating while the snapshot is read; then a table added to the
running pipeline and a resync of damaged target tables."""

from __future__ import annotations

import dataclasses
import random

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.snapshot.run import (
    SnapshotJob,
    SnapshotSettings,
    initial_snapshot,
    request_added_tables,
    request_resync,
    sync_pending,
)
from scripts.harness.pgserver import execute, make_database, make_target, query
from scripts.harness.subscriber import connect, drain_all, wait_for_subscriber

TABLES_SQL = """
CREATE TABLE rf_key (id int PRIMARY KEY, grp int, note text);
CREATE TABLE rf_full (id int PRIMARY KEY, grp int, note text);
ALTER TABLE rf_full REPLICA IDENTITY FULL;
CREATE TABLE cols (id int PRIMARY KEY, a text, secret text, b int);
CREATE TABLE toasty (id int PRIMARY KEY, n int, body text);
ALTER TABLE toasty ALTER body SET STORAGE EXTERNAL;
CREATE TABLE parent (id int PRIMARY KEY, name text);
CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent ON DELETE CASCADE, v text);
CREATE TABLE big (id bigint PRIMARY KEY, v text, n int);
CREATE TABLE late (id int PRIMARY KEY, v text);
"""
PRE_EXISTING_SQL = """
INSERT INTO rf_key SELECT g, g % 10, 'k' || g FROM generate_series(1, 400) g;
INSERT INTO rf_full SELECT g, g % 10, 'f' || g FROM generate_series(1, 400) g;
INSERT INTO cols SELECT g, 'a' || g, 's' || g, g FROM generate_series(1, 300) g;
INSERT INTO toasty SELECT g, g, repeat(md5(g::text), 300) FROM generate_series(1, 60) g;
INSERT INTO parent SELECT g, 'p' || g FROM generate_series(1, 200) g;
INSERT INTO child SELECT g, 1 + g % 200, 'c' || g FROM generate_series(1, 600) g;
INSERT INTO big SELECT g, repeat('b', 80 + g % 50), g FROM generate_series(1, 25000) g;
INSERT INTO late SELECT g, 'l' || g FROM generate_series(1, 100) g;
"""
PUBLICATIONS_SQL = """
CREATE PUBLICATION pub_native FOR TABLE rf_key WHERE (id > 100), rf_full WHERE (grp >= 5), cols (id, a, b),
    toasty, parent, child, big;
CREATE PUBLICATION pub_all FOR TABLE rf_key, rf_full, cols, toasty, parent, child, big;
"""
SPEC_TABLES: dict[str, tuple[tuple[str, ...] | None, str | None]] = {
    "public.rf_key": (None, "id > 100"), "public.rf_full": (None, "grp >= 5"), "public.cols": (("id", "a", "b"), None),
    "public.toasty": (None, None), "public.parent": (None, None), "public.child": (None, None),
    "public.big": (None, None),
}
COMPARED = ("rf_key", "rf_full", "cols", "toasty", "parent", "child", "big")


def apply_config(uri: str, tables: dict) -> ApplyConfig:
    return ApplyConfig(slot="ours", staging_root=uri, tables={
        name: TableApplyConfig(columns=cols, row_filter=flt) for name, (cols, flt) in tables.items()})


def job(dsn: str, uri: str, tables: dict) -> SnapshotJob:
    return SnapshotJob(dsn=dsn, slot="ours", publication="pub_all", staging_uri=uri, tables=tables,
                       settings=SnapshotSettings(initial=True, parallelism=2, chunk_bytes=1 << 20))


def burst(dsn: str, rnd: random.Random, n: int) -> None:
    """``n`` transactions of every kind of change the tables allow, including truncates."""
    conn = connect(dsn)
    cur = conn.cursor()
    for i in range(n):
        cur.execute("BEGIN")
        k = rnd.randint(1, 500)
        cur.execute("UPDATE rf_key SET id = id + 1000 WHERE id = %s", (k,))  # key change across the filter
        cur.execute("UPDATE rf_key SET grp = grp + 1 WHERE id = %s", (rnd.randint(1, 500),))
        cur.execute("INSERT INTO rf_key VALUES (%s, 1, 'new') ON CONFLICT DO NOTHING", (rnd.randint(50, 5000),))
        cur.execute("UPDATE rf_full SET grp = %s WHERE id = %s", (rnd.randint(0, 9), rnd.randint(1, 400)))
        cur.execute("DELETE FROM rf_full WHERE id = %s", (rnd.randint(1, 400),))
        cur.execute("UPDATE cols SET secret = 'x', b = b + 1 WHERE id = %s", (rnd.randint(1, 300),))
        cur.execute("UPDATE toasty SET n = n + 1 WHERE id = %s", (rnd.randint(1, 60),))  # unchanged TOAST
        cur.execute("UPDATE toasty SET id = id + 100 WHERE id = %s", (rnd.randint(1, 60),))  # moves a TOAST value
        cur.execute("UPDATE toasty SET body = repeat(md5(%s), 310) WHERE id = %s", (str(i), rnd.randint(1, 160)))
        p = rnd.randint(1, 300)
        cur.execute("INSERT INTO parent VALUES (%s, 'np') ON CONFLICT DO NOTHING", (p,))
        cur.execute("INSERT INTO child VALUES (%s, %s, 'nc') ON CONFLICT DO NOTHING", (rnd.randint(600, 2000), p))
        cur.execute("DELETE FROM parent WHERE id = %s", (rnd.randint(1, 300),))  # cascades to child rows
        cur.execute("UPDATE big SET v = v || 'u', n = n + 1 WHERE id = %s", (rnd.randint(1, 25000),))
        cur.execute("DELETE FROM big WHERE id = %s", (rnd.randint(1, 25000),))
        cur.execute("INSERT INTO big VALUES (%s, 'ins', 0) ON CONFLICT DO NOTHING", (rnd.randint(25001, 60000),))
        cur.execute("UPDATE late SET v = v || 'u' WHERE id = %s", (rnd.randint(1, 100),))
        if i % 4 == 3:
            cur.execute("TRUNCATE cols")
            cur.execute("INSERT INTO cols SELECT g, 'ra' || g, 'rs', g FROM generate_series(1, 50) g")
        cur.execute("COMMIT")
    conn.close()


def wait_ready(native_dsn: str) -> None:
    import time

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        states = query(native_dsn, "SELECT srsubstate FROM pg_subscription_rel")
        if states and all(s == "r" for (s,) in states):
            return
        time.sleep(0.2)
    raise TimeoutError("native table sync did not finish")


def rows(dsn: str, table: str) -> list[tuple]:
    return query(dsn, f"SELECT * FROM {table} ORDER BY 1")  # this module's constants


def assert_equal(ours: str, native: str, tables=COMPARED) -> None:
    for table in tables:
        assert rows(ours, table) == rows(native, table), table


def test_snapshot_then_changes_equal_a_native_copy_data_subscriber(pg_server, spark, tmp_path):
    source, native = make_database(pg_server), make_database(pg_server)
    _, ours = make_target(pg_server)
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, TABLES_SQL + PRE_EXISTING_SQL + PUBLICATIONS_SQL)
    execute(native_dsn, TABLES_SQL)
    execute(ours, TABLES_SQL)
    uri = str(tmp_path / "staging")
    rnd = random.Random(42)
    execute(source_dsn, "SELECT pg_create_logical_replication_slot('sub_native', 'pgoutput')")
    execute(native_dsn, "CREATE SUBSCRIPTION sub_native CONNECTION '" + source_dsn + "' PUBLICATION pub_native "
                        "WITH (create_slot = false, slot_name = sub_native, copy_data = true)")
    try:
        def meanwhile(point: str) -> None:
            if point in ("slot_created", "chunk_written"):
                burst(source_dsn, rnd, 2)

        result = initial_snapshot(job(source_dsn, uri, SPEC_TABLES), on_checkpoint=meanwhile)
        assert result.tables["public.big"]["chunks"] > 1
        burst(source_dsn, rnd, 6)
        drain_all(source_dsn, uri)
        reports = apply_slot(spark, apply_config(uri, SPEC_TABLES), ours)
        assert reports[0].rows["public.big"]["snapshot_rows"] > 20000  # the snapshot went first
        wait_ready(native_dsn)
        wait_for_subscriber(source_dsn, native_dsn)
        assert_equal(ours, native_dsn)
        assert len(rows(ours, "toasty")) > 50 and len(rows(ours, "rf_full")) > 100  # not vacuous

        # more changes and runs; a re-run applies nothing twice
        burst(source_dsn, rnd, 8)
        drain_all(source_dsn, uri, max_changes=40)
        apply_slot(spark, apply_config(uri, SPEC_TABLES), ours)
        assert not any(r.applied for r in apply_slot(spark, apply_config(uri, SPEC_TABLES), ours))
        wait_for_subscriber(source_dsn, native_dsn)
        assert_equal(ours, native_dsn)

        # a table added to the running pipeline: snapshotted at a later LSN while writers run
        tables = {**SPEC_TABLES, "public.late": (None, None)}
        execute(source_dsn, "ALTER PUBLICATION pub_all ADD TABLE late", "ALTER PUBLICATION pub_native ADD TABLE late")
        execute(native_dsn, "ALTER SUBSCRIPTION sub_native REFRESH PUBLICATION")
        burst(source_dsn, rnd, 3)
        assert request_added_tables(job(source_dsn, uri, tables)) == ["public.late"]
        added = sync_pending(job(source_dsn, uri, tables), on_checkpoint=meanwhile)
        assert set(added.tables) == {"public.late"} and added.lsn > result.lsn
        burst(source_dsn, rnd, 4)
        drain_all(source_dsn, uri)
        apply_slot(spark, apply_config(uri, tables), ours)
        wait_ready(native_dsn)
        wait_for_subscriber(source_dsn, native_dsn)
        assert_equal(ours, native_dsn, (*COMPARED, "late"))

        # damage two target tables, resync them while the others keep flowing
        execute(ours, "DELETE FROM child WHERE id % 2 = 0", "UPDATE big SET v = 'damaged' WHERE id % 3 = 0")
        assert rows(ours, "big") != rows(native_dsn, "big")
        request_resync(job(source_dsn, uri, tables), ["public.big", "public.child"])
        burst(source_dsn, rnd, 2)
        drain_all(source_dsn, uri)  # staged while the resync is pending: held for those two tables
        apply_slot(spark, apply_config(uri, tables), ours)
        resynced = sync_pending(job(source_dsn, uri, tables), on_checkpoint=meanwhile)
        assert set(resynced.tables) == {"public.big", "public.child"}
        burst(source_dsn, rnd, 3)
        drain_all(source_dsn, uri)
        apply_slot(spark, apply_config(uri, tables), ours)
        wait_for_subscriber(source_dsn, native_dsn)
        assert_equal(ours, native_dsn, (*COMPARED, "late"))
        synced = dict(query(ours, "SELECT target_table, sync_lsn::text FROM pglogical_sync"))
        assert synced["public.big"] == synced["public.child"] != synced["public.parent"]
    finally:
        execute(native_dsn, "ALTER SUBSCRIPTION sub_native DISABLE", "ALTER SUBSCRIPTION sub_native SET (slot_name = NONE)",
                "DROP SUBSCRIPTION sub_native")
        # slot names are cluster-wide: leave no 'ours' behind for the next test of this server
        execute(source_dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name IN ('sub_native', 'ours')")


MULTI_TABLES_SQL = """
CREATE TABLE mp_or (id int PRIMARY KEY, grp int, note text);
ALTER TABLE mp_or REPLICA IDENTITY FULL;
CREATE TABLE mp_open (id int PRIMARY KEY, grp int, note text);
ALTER TABLE mp_open REPLICA IDENTITY FULL;
CREATE TABLE mp_cols (id int PRIMARY KEY, a text, secret text, b int);
"""
MULTI_ROWS_SQL = """
INSERT INTO mp_or SELECT g, g % 7, 'o' || g FROM generate_series(1, 600) g;
INSERT INTO mp_open SELECT g, g % 7, 'n' || g FROM generate_series(1, 300) g;
INSERT INTO mp_cols SELECT g, 'a' || g, 's' || g, g FROM generate_series(1, 300) g;
"""
# mp_or: filters OR-ed; mp_open: pub_b publishes it without a filter (no filter at all); mp_cols: the same
# column list in both, a filter in one only (none then)
MULTI_PUBS_SQL = """
CREATE PUBLICATION pub_a FOR TABLE mp_or WHERE (id < 100), mp_open WHERE (grp = 1), mp_cols (id, a, b);
CREATE PUBLICATION pub_b FOR TABLE mp_or WHERE (grp = 3), mp_open, mp_cols (id, a, b) WHERE (id > 250);
"""


def multi_burst(dsn: str, rnd: random.Random, n: int) -> None:
    conn = connect(dsn)
    cur = conn.cursor()
    for _ in range(n):
        cur.execute("BEGIN")
        cur.execute("UPDATE mp_or SET grp = %s WHERE id = %s", (rnd.randint(0, 6), rnd.randint(1, 700)))
        cur.execute("INSERT INTO mp_or VALUES (%s, %s, 'new') ON CONFLICT DO NOTHING",
                    (rnd.randint(1, 900), rnd.randint(0, 6)))
        cur.execute("DELETE FROM mp_or WHERE id = %s", (rnd.randint(1, 700),))
        cur.execute("UPDATE mp_open SET grp = grp + 1, note = note || 'u' WHERE id = %s", (rnd.randint(1, 300),))
        cur.execute("DELETE FROM mp_open WHERE id = %s", (rnd.randint(1, 300),))
        cur.execute("UPDATE mp_cols SET secret = 'x', b = b + 1 WHERE id = %s", (rnd.randint(1, 300),))
        cur.execute("INSERT INTO mp_cols VALUES (%s, 'na', 'ns', 0) ON CONFLICT DO NOTHING", (rnd.randint(300, 600),))
        cur.execute("COMMIT")
    conn.close()


def test_snapshot_of_two_publications_equals_a_native_subscriber_to_both(pg_server, spark, tmp_path):
    """Row filters OR-ed (a publication without one: none), one column list: as a native table sync reads them."""
    source, native = make_database(pg_server), make_database(pg_server)
    _, ours = make_target(pg_server)
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, MULTI_TABLES_SQL + MULTI_ROWS_SQL + MULTI_PUBS_SQL)
    execute(native_dsn, MULTI_TABLES_SQL)
    execute(ours, MULTI_TABLES_SQL)
    uri = str(tmp_path / "staging")
    rnd = random.Random(13)
    tables: dict[str, tuple[tuple[str, ...] | None, str | None]] = {
        f"public.{t}": (None, None) for t in ("mp_or", "mp_open", "mp_cols")}
    execute(source_dsn, "SELECT pg_create_logical_replication_slot('sub_multi', 'pgoutput')")
    execute(native_dsn, "CREATE SUBSCRIPTION sub_multi CONNECTION '" + source_dsn + "' PUBLICATION pub_a, pub_b "
                        "WITH (create_slot = false, slot_name = sub_multi, copy_data = true)")
    try:
        snapshot = SnapshotJob(dsn=source_dsn, slot="ours_multi", publication="pub_a", publications=("pub_a", "pub_b"),
                               staging_uri=uri, tables=tables,
                               settings=SnapshotSettings(initial=True, parallelism=1, chunk_bytes=1 << 20))

        def meanwhile(point: str) -> None:
            if point in ("slot_created", "chunk_written"):
                multi_burst(source_dsn, rnd, 3)

        result = initial_snapshot(snapshot, on_checkpoint=meanwhile)
        assert result.tables["public.mp_or"]["rows"] < 600  # filtered on the source
        assert query(source_dsn, "SELECT count(*) FROM mp_open") != [(0,)]
        multi_burst(source_dsn, rnd, 10)
        drain_all(source_dsn, uri, slot="ours_multi", publication=("pub_a", "pub_b"))
        apply_slot(spark, dataclasses.replace(apply_config(uri, tables), slot="ours_multi"), ours)
        wait_ready(native_dsn)
        wait_for_subscriber(source_dsn, native_dsn, name="sub_multi")
        assert_equal(ours, native_dsn, ("mp_or", "mp_open", "mp_cols"))
        assert query(ours, "SELECT count(*) FROM mp_cols WHERE secret IS NOT NULL") == [(0,)]  # column list
        assert query(ours, "SELECT count(*) FROM mp_or WHERE NOT (id < 100 OR grp = 3)") == [(0,)]
        assert query(ours, "SELECT count(*) FROM mp_or WHERE grp = 3 AND id >= 100") != [(0,)]  # both filters
        assert query(ours, "SELECT count(*) FROM mp_open WHERE grp <> 1") != [(0,)]  # no filter
    finally:
        execute(native_dsn, "ALTER SUBSCRIPTION sub_multi DISABLE", "ALTER SUBSCRIPTION sub_multi SET (slot_name = NONE)",
                "DROP SUBSCRIPTION sub_multi")
        execute(source_dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name IN ('sub_multi', 'ours_multi')")
