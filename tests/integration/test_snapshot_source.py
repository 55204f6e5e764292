"""Snapshots on a real server: consistent with the slot while writers run, crash-safe, typed errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import psycopg2
import pytest

from airflow_provider_pglogical.exceptions import SnapshotError, SnapshotOnExistingSlotError
from airflow_provider_pglogical.hooks import PgLogicalHook
from airflow_provider_pglogical.snapshot.layout import SnapshotLayout
from airflow_provider_pglogical.snapshot.run import (
    SnapshotJob,
    SnapshotSettings,
    initial_snapshot,
    request_resync,
    sync_pending,
)
from scripts.harness.subscriber import drain_all
from tests.conftest import REPO_ROOT
from tests.support.snapshot import SNAP_SCHEMA_SQL, replayed, source_rows, write_burst
from tests.support.snapshot_child import KILLED

TABLES = {"public.parents": ("id",), "public.children": ("id",), "public.wide": ("id",)}
COLUMNS = {"public.parents": ["id", "name", "region", "amount"],
           "public.children": ["id", "parent_id", "body", "big", "secret"],
           "public.wide": ["id", "payload", "flags", "at"]}


def job(dsn: str, uri: str, **settings) -> SnapshotJob:
    return SnapshotJob(dsn=dsn, slot="s1", publication="pub", staging_uri=uri,
                       tables={t: (None, None) for t in TABLES},
                       settings=SnapshotSettings(initial=True, **{"parallelism": 2, "chunk_bytes": 1 << 20,
                                                                  **settings}))


def assert_consistent(cur, uri: str) -> None:
    for table, key in TABLES.items():
        expected = source_rows(cur, table, COLUMNS[table], key)
        got = replayed(uri, "s1", table, key)
        assert set(got) == set(expected), table
        assert got == expected, table


def slots_of_this_database(cur, settle_s: float = 15.0) -> list[str]:
    """Slot names in the test's own database (the server is shared by all tests).

    A temporary slot is dropped by its backend's exit, which runs after the client has closed the
    connection; poll until no temporary slot is left, or return it so the assertion shows it.
    """
    deadline = time.monotonic() + settle_s
    while True:
        cur.execute("SELECT slot_name, temporary FROM pg_replication_slots "
                    "WHERE database = current_database() ORDER BY slot_name")
        slots = cur.fetchall()
        if not any(temporary for _, temporary in slots) or time.monotonic() > deadline:
            return [name for name, _ in slots]
        time.sleep(0.1)


def test_initial_snapshot_meets_the_slot_exactly_while_writers_run(pg_conn, pg_dsn, tmp_path):
    cur = pg_conn.cursor()
    cur.execute(SNAP_SCHEMA_SQL)
    writer = psycopg2.connect(pg_dsn)
    writer.autocommit = True
    wcur, rnd = writer.cursor(), random.Random(7)

    def meanwhile(point: str) -> None:
        # committed after the consistent point, before and while readers import the snapshot
        if point in ("slot_created", "chunk_written"):
            write_burst(wcur, rnd, 5, truncate_wide=False)

    uri = str(tmp_path / "stage")
    result = initial_snapshot(job(pg_dsn, uri), on_checkpoint=meanwhile)
    assert set(result.tables) == set(TABLES)
    assert result.tables["public.wide"]["chunks"] > 1  # read in ctid ranges by two processes
    layout = SnapshotLayout.from_uri(uri, "s1")
    assert layout.requests() == {}
    assert all(layout.latest(t).lsn == result.lsn for t in TABLES)
    assert PgLogicalHook.from_dsn(pg_dsn).slot_info("s1").confirmed_flush_lsn == result.lsn

    write_burst(wcur, rnd, 10, truncate_wide=True)
    write_burst(wcur, rnd, 5)
    drain_all(pg_dsn, uri, slot="s1", publication="pub")
    assert_consistent(cur, uri)

    # resync one table at a later LSN: the older changes of that table are in its new snapshot
    request_resync(job(pg_dsn, uri), ["public.children"])
    write_burst(wcur, rnd, 3)
    later = sync_pending(job(pg_dsn, uri), on_checkpoint=meanwhile)
    assert later.lsn > result.lsn and set(later.tables) == {"public.children"}
    assert layout.latest("public.children").lsn == later.lsn
    write_burst(wcur, rnd, 5)
    drain_all(pg_dsn, uri, slot="s1", publication="pub")
    assert_consistent(cur, uri)
    assert slots_of_this_database(cur) == ["s1"]  # the temporary slot went with its connection
    writer.close()


def run_child(**args) -> int:
    proc = subprocess.run([sys.executable, "-m", "tests.support.snapshot_child", json.dumps(args)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, KILLED), proc.stderr[-3000:]
    return proc.returncode


@pytest.mark.parametrize("kill_at", ["requested", "slot_created", "chunk_written:2", "files_moved",
                                     "manifest_written:2", "done"])
def test_a_snapshot_killed_anywhere_reruns_to_an_exact_copy(kill_at, pg_conn, pg_dsn, tmp_path):
    cur = pg_conn.cursor()
    cur.execute(SNAP_SCHEMA_SQL)
    uri = str(tmp_path / "stage")
    args = {"dsn": pg_dsn, "slot": "s1", "publication": "pub", "staging_uri": uri,
            "tables": {t: [None, None] for t in TABLES}, "kill_at": kill_at, "parallelism": 1}
    assert run_child(mode="initial", **args) == KILLED
    rnd = random.Random(11)
    write_burst(cur, rnd, 5)
    snap = job(pg_dsn, uri, parallelism=1)
    layout = SnapshotLayout.from_uri(uri, "s1")
    if kill_at == "requested":  # the slot was never created: the initial snapshot simply runs again
        initial_snapshot(snap)
    else:
        with pytest.raises(SnapshotOnExistingSlotError, match="resync"):
            initial_snapshot(snap)
        sync_pending(snap)  # unfinished tables at a later LSN; published ones are kept
    assert layout.requests() == {}
    assert all(layout.leftovers(t) == [] for t in TABLES)
    write_burst(cur, rnd, 5)
    drain_all(pg_dsn, uri, slot="s1", publication="pub")
    assert_consistent(cur, uri)


def test_bad_tables_fail_before_anything_is_created(pg_conn, pg_dsn, tmp_path):
    cur = pg_conn.cursor()
    cur.execute(SNAP_SCHEMA_SQL)
    cur.execute("CREATE ROLE snap_reader LOGIN REPLICATION; GRANT SELECT ON parents, children TO snap_reader")
    uri = str(tmp_path / "stage")
    limited = pg_dsn + " user=snap_reader"
    with pytest.raises(SnapshotError, match=r"may not SELECT from public\.wide"):
        initial_snapshot(job(limited, uri))
    cur.execute("DROP TABLE wide")
    with pytest.raises(SnapshotError, match=r"public\.wide does not exist"):
        initial_snapshot(job(pg_dsn, uri))
    assert slots_of_this_database(cur) == []
    assert SnapshotLayout.from_uri(uri, "s1").requests() == {}


@pytest.mark.parametrize(("row_filter", "error"), [
    ("pg_sleep(1) IS NOT NULL", r"row filter of public\.parents: function pg_sleep is not allowed"),
    ("/* ( */ true) OR (true /* ) */", r"row filter of public\.parents: does not parse"),
    ("nope > 1", r"row filter of public\.parents references column\(s\) nope that its publications do not publish"),
])
def test_a_filter_publication_rules_refuse_fails_the_snapshot_before_anything_is_created(row_filter, error, pg_conn,
                                                                                         pg_dsn, tmp_path):
    cur = pg_conn.cursor()
    cur.execute(SNAP_SCHEMA_SQL)
    uri = str(tmp_path / "stage")
    bad = job(pg_dsn, uri)
    bad.tables["public.parents"] = (None, row_filter)  # as a caller that loaded no spec passes it
    with pytest.raises(SnapshotError, match=error):
        initial_snapshot(bad)
    assert slots_of_this_database(cur) == []
    assert SnapshotLayout.from_uri(uri, "s1").requests() == {}


def test_a_lost_replication_connection_publishes_nothing_unfinished_and_the_rerun_completes(pg_conn, pg_dsn,
                                                                                            tmp_path):
    import time

    from airflow_provider_pglogical.exceptions import SnapshotConnectionLostError

    cur = pg_conn.cursor()
    cur.execute(SNAP_SCHEMA_SQL)
    uri = str(tmp_path / "stage")
    calls = {"n": 0}

    def cut(point: str) -> None:
        if point == "chunk_written":
            calls["n"] += 1
            if calls["n"] == 2:  # the walsender holding the exported snapshot goes away mid-table
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'walsender'"
                            " AND datname = current_database()")
                assert cur.fetchone() == (True,)
                time.sleep(1)

    with pytest.raises(SnapshotConnectionLostError, match="s1"):
        initial_snapshot(job(pg_dsn, uri, parallelism=1), on_checkpoint=cut)
    layout = SnapshotLayout.from_uri(uri, "s1")
    published = {t for t in TABLES if layout.latest(t) is not None}
    assert published != set(TABLES) and set(layout.requests()) == set(TABLES) - published
    write_burst(cur, random.Random(3), 3)
    sync_pending(job(pg_dsn, uri, parallelism=1))
    assert layout.requests() == {}
    drain_all(pg_dsn, uri, slot="s1", publication="pub")
    assert_consistent(cur, uri)


def test_a_table_partitioned_and_published_via_its_root_is_snapshot_whole(pg_conn, pg_dsn, tmp_path):
    """A partitioned table has no rows of its own: ``FROM ONLY`` it read nothing. Published via its
    root, its snapshot is every leaf's rows (through the filter), chunked by page ranges in each leaf,
    and meets the slot's later changes exactly."""
    cur = pg_conn.cursor()
    cur.execute("CREATE TABLE meas (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);"
                "CREATE TABLE meas_eu PARTITION OF meas FOR VALUES IN ('eu');"
                "CREATE TABLE meas_us (v int, region text NOT NULL, id int NOT NULL);"  # another column order
                "ALTER TABLE meas ATTACH PARTITION meas_us FOR VALUES IN ('us');"
                "INSERT INTO meas SELECT g, CASE WHEN g % 3 = 0 THEN 'us' ELSE 'eu' END, g % 100"
                " FROM generate_series(1, 30000) g;"
                "CREATE PUBLICATION pub FOR TABLE meas WHERE (id % 10 <> 0) WITH (publish_via_partition_root = true)")
    uri = str(tmp_path / "stage")
    snap = SnapshotJob(dsn=pg_dsn, slot="s1", publication="pub", staging_uri=uri,
                       tables={"public.meas": (None, None)},
                       settings=SnapshotSettings(initial=True, parallelism=2, chunk_bytes=64 << 10))
    result = initial_snapshot(snap)
    assert result.tables["public.meas"]["rows"] == 27000
    cur.execute("UPDATE meas SET v = v + 1 WHERE id % 7 = 0; DELETE FROM meas WHERE id % 11 = 0;"
                "INSERT INTO meas VALUES (40001, 'us', 5), (40010, 'eu', 95)")
    drain_all(pg_dsn, uri, slot="s1", publication="pub")
    got = replayed(uri, "s1", "public.meas", ("id", "region"))
    expected = source_rows(cur, "public.meas", ["id", "region", "v"], ("id", "region"), where="id % 10 <> 0")
    assert {k: {c: r[c] for c in ("id", "region", "v")} for k, r in got.items()} == expected


def test_a_partitioned_table_whose_entry_does_not_route_its_leaves_refuses_a_snapshot_clearly(pg_conn, pg_dsn,
                                                                                                  tmp_path):
    cur = pg_conn.cursor()
    cur.execute("CREATE TABLE meas (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);"
                "CREATE TABLE meas_1 PARTITION OF meas FOR VALUES FROM (0) TO (100);"
                "INSERT INTO meas VALUES (1, 1); CREATE PUBLICATION pub FOR TABLE meas")
    snap = SnapshotJob(dsn=pg_dsn, slot="s1", publication="pub", staging_uri=str(tmp_path / "stage"),
                       tables={"public.meas": (None, None)}, settings=SnapshotSettings(initial=True))
    with pytest.raises(SnapshotError, match=r"public\.meas is partitioned .* leaves: route_to_root .* "
                                            "publish_via_partition_root = true"):
        initial_snapshot(snap)
    assert slots_of_this_database(cur) == []


ROUTED_SQL = """
CREATE TABLE meas (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY LIST (k);
CREATE TABLE meas_a PARTITION OF meas FOR VALUES IN (1);
CREATE TABLE meas_b PARTITION OF meas FOR VALUES IN (2, 3) PARTITION BY LIST (k);
CREATE TABLE meas_b2 PARTITION OF meas_b FOR VALUES IN (2);
CREATE TABLE meas_b3 PARTITION OF meas_b FOR VALUES IN (3);
CREATE TABLE meas_own PARTITION OF meas FOR VALUES IN (4);
CREATE TABLE empty_root (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
INSERT INTO meas SELECT g, 1 + g % 4, 'v' || g FROM generate_series(1, 4000) g;
"""


def test_routed_leaves_are_snapshotted_as_their_entry_routes_them(pg_conn, pg_dsn, tmp_path):
    """Leaves at any depth, each FROM ONLY with its own publication filter AND the entry's; a leaf with an entry
    of its own and a leaf no publication publishes stay out; a routing entry's table without leaves: no rows."""
    import pyarrow.parquet as pq

    cur = pg_conn.cursor()
    cur.execute(ROUTED_SQL + "CREATE PUBLICATION pub FOR TABLE meas_a, meas_b2 WHERE (id > 100), meas_own, empty_root")
    uri = str(tmp_path / "stage")
    tables = {"public.meas": (("id", "k"), "id % 3 <> 0"), "public.meas_own": (None, None),
              "public.empty_root": (None, None)}
    snap = SnapshotJob(dsn=pg_dsn, slot="s1", publication="pub", staging_uri=uri, tables=tables,
                       routing=("public.meas", "public.empty_root"),
                       settings=SnapshotSettings(initial=True, parallelism=2, chunk_bytes=8 << 10))
    result = initial_snapshot(snap)
    def count(where: str) -> int:
        cur.execute(f"SELECT count(*) FROM {where}")
        return int(cur.fetchone()[0])

    expected = {"public.meas_a": count("ONLY meas_a WHERE id % 3 <> 0"),
                "public.meas_b2": count("ONLY meas_b2 WHERE id > 100 AND id % 3 <> 0")}
    assert result.tables["public.meas"]["leaves"] == expected  # not meas_b3 (unpublished), not meas_own (own entry)
    assert min(expected.values()) > 500
    assert result.tables["public.meas_own"]["rows"] == 1000 and result.tables["public.empty_root"]["rows"] == 0
    layout = SnapshotLayout.from_uri(uri, "s1")
    ref = layout.latest("public.meas")
    assert ref is not None
    manifest = layout.manifest(ref)
    assert manifest.format_version == 2 and manifest.row_filter == "(id % 3 <> 0)"
    assert [c["name"] for c in manifest.relation["columns"]] == ["id", "k"]
    by_leaf = {p["table"]: p for p in manifest.parts}
    assert by_leaf["public.meas_b2"]["row_filter"] == "(id > 100) AND (id % 3 <> 0)"  # its own AND the entry's
    assert by_leaf["public.meas_a"]["row_filter"] == "(id % 3 <> 0)"
    for leaf, k in (("public.meas_a", 1), ("public.meas_b2", 2)):
        rows = [r["new"] for f in by_leaf[leaf]["files"] for r in pq.read_table(f"{ref.path}/{f}").to_pylist()]
        assert rows and all(r["k"] == k and r["id"] % 3 != 0 and set(r) == {"id", "k"} for r in rows)
        assert len(rows) == by_leaf[leaf]["rows"]
    assert len(by_leaf["public.meas_a"]["files"]) > 1  # chunked by the leaf's own pages
    empty = layout.latest("public.empty_root")
    assert empty is not None and layout.manifest(empty).format_version == 1


def test_a_routing_entry_whose_leaves_are_not_published_refuses_a_snapshot_clearly(pg_conn, pg_dsn, tmp_path):
    cur = pg_conn.cursor()
    cur.execute(ROUTED_SQL + "CREATE TABLE other (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE other")
    snap = SnapshotJob(dsn=pg_dsn, slot="s1", publication="pub", staging_uri=str(tmp_path / "stage"),
                       tables={"public.meas": (None, None)}, routing=("public.meas",),
                       settings=SnapshotSettings(initial=True))
    with pytest.raises(SnapshotError, match=r"public\.meas routes its leaf partitions .* publishes none of them "
                                            r"\(public\.meas_a, public\.meas_b2, public\.meas_b3, public\.meas_own\)"):
        initial_snapshot(snap)
    assert slots_of_this_database(cur) == []
