"""Kill the apply of staged snapshots in every kind of crash window (inside a table's COPY, right before and
after the load transaction's COMMIT, inside a later snapshot group); the rerun ends
with the target equal to the source, every row once, nothing staged in the target, each table synced at its
LSN."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import psycopg2

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.exceptions import format_lsn
from airflow_provider_pglogical.snapshot.run import (
    SnapshotJob,
    SnapshotSettings,
    initial_snapshot,
    request_resync,
    sync_pending,
)
from scripts.harness.pgserver import execute, make_target, query
from scripts.harness.subscriber import drain_all
from tests.conftest import REPO_ROOT
from tests.support.snapshot import SNAP_SCHEMA_SQL, write_burst
from tests.support.snapshot_apply_child import KILLED
from tests.support.spark import TEST_SPARK_CONF

TARGET_SQL = """
CREATE TABLE parents (id int PRIMARY KEY, name text NOT NULL, region text, amount numeric(12,2));
CREATE TABLE children (id int PRIMARY KEY, parent_id int REFERENCES parents(id) ON DELETE CASCADE,
                       body text, big text, secret text);
CREATE TABLE wide (id bigint PRIMARY KEY, payload text, flags int[], at timestamptz);
"""
# wide: enough rows that its staging COPY lasts long enough to be killed in the middle
MORE_WIDE_SQL = """INSERT INTO wide SELECT g, repeat('m', 50 + g % 30), ARRAY[g % 11], '2024-06-01'::timestamptz
  + g * interval '1 s' FROM generate_series(30001, 90000) g"""
TABLES = ("parents", "children", "wide")


def job(dsn: str, uri: str) -> SnapshotJob:
    return SnapshotJob(dsn=dsn, slot="s1", publication="pub", staging_uri=uri,
                       tables={f"public.{t}": (None, None) for t in TABLES},
                       settings=SnapshotSettings(initial=True, parallelism=2, chunk_bytes=2 << 20))


def run_child(**args) -> int:
    proc = subprocess.run([sys.executable, "-m", "tests.support.snapshot_apply_child", json.dumps(args)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, KILLED), proc.stderr[-3000:]
    return proc.returncode


def wait_for_no_other_sessions(dsn: str, timeout_s: float = 60) -> None:
    """The killed child's backends (apply connection, executors' COPY) end when they see the socket close."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND pid <> pg_backend_pid()") == [(0,)]:
            return
        time.sleep(0.1)
    raise TimeoutError("the killed apply's sessions are still there")


def assert_equal(source: str, target: str) -> None:
    for table in TABLES:
        expected = query(source, f"SELECT * FROM {table} ORDER BY id")
        got = query(target, f"SELECT * FROM {table} ORDER BY id")
        assert len(got) == len(expected), table  # nothing twice, nothing missing
        assert got == expected, table


def staging_tables(dsn: str) -> list[str]:
    return [r[0] for r in query(dsn, "SELECT relname FROM pg_class WHERE relname LIKE '\\_pglogical\\_stg\\_%'")]


# Each child run is killed at its point, starting from what the previous kill left: group 1 is parents +
# children at the initial snapshot's LSN, group 2 is wide at its resync's LSN. Every row is COPYed straight
# into the target tables inside the load transaction (no staging tables). One kill per kind of window (each
# child is a Spark process: ~40 s): inside a COPY, between a group's last write and its COMMIT, inside a later
# group's transaction, right after a COMMIT. No kill right after group 1's COMMIT: the mid_copy kill leaves the
# same durable state (group 1 committed with both sync marks, group 2's transaction rolled back) and asserts
# it, and the next rerun starts from it and must skip group 1; "right after a COMMIT" is group 2's kill.
KILLS = (("snapshot_copying:1", 0),  # parents' COPY under way inside the load transaction
         ("snapshot_before_commit:1", 0),  # everything written, COMMIT not sent
         ("mid_copy", 2),  # the rerun commits group 1, then dies while wide's snapshot streams into it
         ("snapshot_committed:1", 3))  # the rerun skips group 1, commits group 2; the change batches not applied


def test_a_snapshot_apply_killed_anywhere_reruns_to_an_exact_copy(pg_server, pg_dsn, spark, tmp_path):
    source = pg_dsn  # the fixture's database: dropped with its slot s1 (slot names are cluster-wide)
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL, MORE_WIDE_SQL)
    execute(target, TARGET_SQL)
    uri = str(tmp_path / "stage")
    rnd = random.Random(5)
    writer = psycopg2.connect(source)
    writer.autocommit = True
    wcur = writer.cursor()

    def meanwhile(point: str) -> None:
        if point == "chunk_written":
            write_burst(wcur, rnd, 1)

    first = initial_snapshot(job(source, uri), on_checkpoint=meanwhile)
    write_burst(wcur, rnd, 5)
    # a resync of wide at a later LSN: two snapshot groups (parents + children at the first LSN, wide later)
    request_resync(job(source, uri), ["public.wide"])
    second = sync_pending(job(source, uri))
    assert second.lsn > first.lsn and set(second.tables) == {"public.wide"}
    write_burst(wcur, rnd, 5, truncate_wide=False)
    drain_all(source, uri, slot="s1", publication="pub")

    for kill_at, synced_groups in KILLS:
        code = run_child(dsn=target, slot="s1", staging_uri=uri, kill_at=kill_at,
                         target_tables=[f"public.{t}" for t in TABLES])
        assert code == KILLED, f"the child was not killed at {kill_at}"
        wait_for_no_other_sessions(target)
        synced = dict(query(target, "SELECT target_table, sync_lsn::text FROM pglogical_sync")) \
            if query(target, "SELECT to_regclass('pglogical_sync')") != [(None,)] else {}
        assert len(synced) == synced_groups, kill_at  # nothing of an uncommitted group is visible
        if synced_groups == 0:
            assert query(target, "SELECT count(*) FROM parents") == [(0,)], kill_at
        assert staging_tables(target) == [], kill_at  # a snapshot load stages nothing in the target

    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    apply_slot(spark, config, target)
    assert_equal(source, target)
    assert staging_tables(target) == []
    synced = dict(query(target, "SELECT target_table, sync_lsn::text FROM pglogical_sync"))
    assert synced == {"public.parents": format_lsn(first.lsn), "public.children": format_lsn(first.lsn),
                      "public.wide": format_lsn(second.lsn)}

    # more changes, including a truncate; the next run applies them once
    write_burst(wcur, rnd, 4, truncate_wide=True)
    drain_all(source, uri, slot="s1", publication="pub")
    apply_slot(spark, config, target)
    assert_equal(source, target)
    assert not any(r.applied for r in apply_slot(spark, config, target))
    writer.close()


def test_leftover_staging_tables_are_dropped_for_this_slot_only(pg_conn):
    from airflow_provider_pglogical.apply.targets.postgres.copy import drop_leftover_staging
    from airflow_provider_pglogical.apply.targets.postgres.plan import staging_name, staging_prefix

    mine = [staging_name("s1", 0x16B3C10, "public.t"), staging_name("s1", 0x16B3C10, "public.t") + "_snap"]
    other = [staging_name("s2", 0x16B3C10, "public.t"), staging_name("s1", 0x16B3C10, "public.u")]
    with pg_conn.cursor() as cur:
        for name in mine + other:
            schema, _, table = name.partition(".")
            cur.execute(f'CREATE UNLOGGED TABLE {schema}."{table}" (x int)')
    pg_conn.commit()
    dropped = drop_leftover_staging(pg_conn, "public", [staging_prefix("s1", "public.t")])
    assert sorted(dropped) == sorted(n.partition(".")[2] for n in mine)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT relname FROM pg_class WHERE relname LIKE '\\_pglogical\\_stg\\_%' ORDER BY 1")
        assert [r[0] for r in cur.fetchall()] == sorted(n.partition(".")[2] for n in other)


# Tables linked by a foreign key on both sides, the child large enough that its snapshot COPY is under way for
# seconds (``chunk_size`` 1MB: many chunks), read after its parent (tables are read in name order, one reader).
FK_SOURCE_SQL = """
CREATE TABLE customer (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE invoice (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customer(id), body text);
CREATE TABLE solo (id int PRIMARY KEY, v text);
INSERT INTO customer SELECT g, 'p' || g FROM generate_series(1, 2000) g;
INSERT INTO invoice SELECT g, 1 + g % 2000, repeat('c', 80 + g % 40) FROM generate_series(1, 200000) g;
INSERT INTO solo SELECT g, 's' || g FROM generate_series(1, 100) g;
"""
FK_TARGET_SQL = """
CREATE TABLE customer (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE invoice (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customer(id), body text);
CREATE TABLE solo (id int PRIMARY KEY, v text);
"""
FK_TABLES = ("customer", "invoice", "solo")


def kill_during_copy_of(source: str, proc: subprocess.Popen, table: str, timeout_s: float = 240) -> bool:
    """SIGKILL ``proc``'s process group as soon as a snapshot reader is seen COPYing ``table`` (its chunk queries
    name it): inside that table's snapshot, whatever the machine's speed (on an idle machine the whole COPY can
    take less than a second); False when the process ended first."""
    import os
    import signal

    conn = psycopg2.connect(source)
    conn.autocommit = True
    cur = conn.cursor()
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            cur.execute("SELECT 1 FROM pg_stat_activity WHERE state = 'active' AND query LIKE %s",
                        (f'COPY (SELECT % FROM ONLY "public"."{table}"%',))
            if cur.fetchone() is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.005)
        return False
    finally:
        conn.close()


def test_a_run_killed_inside_the_snapshot_copy_of_fk_linked_tables_ends_in_the_uninterrupted_target(
        pg_server, pg_dbname, pg_dsn, tmp_path):
    import yaml

    from scripts.harness.userenv import default_home, run_as_user, user_env, venv_script

    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, FK_SOURCE_SQL)
    execute(target, FK_TARGET_SQL)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": "fk_pub", "slot": "fk_slot", "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "postgres", "dsn": target},
        "tables": {f"public.{t}": {} for t in FK_TABLES},
        "snapshot": {"initial": True, "parallelism": 1, "chunk_size": "1MB"},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }))
    pglogical = venv_script("pglogical")
    home = default_home()
    proc = subprocess.Popen([pglogical, "run", "--spec", str(spec)], env=user_env(home), cwd=home,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert kill_during_copy_of(source, proc, "invoice"), "the run ended before the invoices' snapshot COPY"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for_no_other_sessions(target)
    # Writes after the crash, touching both linked tables (new parents referenced by new children).
    execute(source, "INSERT INTO customer SELECT g, 'n' || g FROM generate_series(2001, 2100) g",
            "INSERT INTO invoice SELECT g, 2001 + g % 100, 'new' FROM generate_series(200001, 200500) g",
            "UPDATE customer SET name = name || '!' WHERE id % 7 = 0", "DELETE FROM invoice WHERE id % 11 = 0",
            "UPDATE solo SET v = v || '?' WHERE id < 10")

    decoded = run_as_user([pglogical, "decode", "--spec", str(spec)], timeout=600)
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    ran = run_as_user([pglogical, "run", "--spec", str(spec)], timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    for table in FK_TABLES:
        expected = query(source, f"SELECT * FROM {table} ORDER BY id")
        assert query(target, f"SELECT * FROM {table} ORDER BY id") == expected, table
    # the linked tables hold snapshots of one LSN
    synced = dict(query(target, "SELECT target_table, sync_lsn::text FROM pglogical_sync"))
    assert synced["public.customer"] == synced["public.invoice"]


def test_a_snapshot_killed_between_the_manifests_of_linked_tables_is_neither_loaded_in_part_nor_lost(
        pg_server, pg_dsn, spark, tmp_path):
    """Killed after the parents' manifest, before the children's: the apply loads neither (the parents' snapshot
    waits with its linked, still requested children), and the next snapshot run copies both again at one LSN."""
    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL)
    uri = str(tmp_path / "stage")
    proc = subprocess.run([sys.executable, "-m", "tests.support.snapshot_child", json.dumps({
        "dsn": source, "slot": "s1", "publication": "pub", "staging_uri": uri, "mode": "initial",
        "tables": {f"public.{t}": [None, None] for t in TABLES}, "kill_at": "manifest_written:1", "parallelism": 1})],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == KILLED, proc.stderr[-3000:]
    rnd = random.Random(7)
    writer = psycopg2.connect(source)
    writer.autocommit = True
    wcur = writer.cursor()
    write_burst(wcur, rnd, 3)
    drain_all(source, uri, slot="s1", publication="pub")
    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    apply_slot(spark, config, target)  # nothing of the linked tables yet, and no error
    assert query(target, "SELECT count(*) FROM parents") == [(0,)]
    assert query(target, "SELECT count(*) FROM children") == [(0,)]

    later = sync_pending(job(source, uri))
    assert {"public.parents", "public.children"} <= set(later.tables)
    write_burst(wcur, rnd, 3)
    drain_all(source, uri, slot="s1", publication="pub")
    apply_slot(spark, config, target)
    assert_equal(source, target)
    synced = dict(query(target, "SELECT target_table, sync_lsn::text FROM pglogical_sync"))
    assert synced["public.parents"] == synced["public.children"] == format_lsn(later.lsn)
    writer.close()
