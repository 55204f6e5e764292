"""Snapshots of a partitioned table whose leaves are routed to its target (``leaves: route_to_root``, published
without publish_via_partition_root) against a native subscriber with the source's partitions and
``copy_data = true``: pre-existing rows in every leaf of two levels of partitioning, a row filter on the
entry and one of the publication's on a leaf, writers changing rows (a row moving between leaves, leaf
TRUNCATEs) while the leaves are read; then a resync of the damaged target and a routed table added later."""

from __future__ import annotations

import random

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.snapshot.layout import SnapshotLayout
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
from tests.integration.test_snapshot_native import wait_ready

# Two levels: meas by region, its eu partition by id range. meas_asia was made on its own with another column
# order and a dropped column, then attached (other attribute numbers: matched by name).
PARTITIONS_SQL = """
CREATE TABLE meas (id int, region text, v int, note text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE meas_eu PARTITION OF meas FOR VALUES IN ('eu') PARTITION BY RANGE (id);
CREATE TABLE meas_eu_lo PARTITION OF meas_eu FOR VALUES FROM (MINVALUE) TO (3000);
CREATE TABLE meas_eu_hi PARTITION OF meas_eu FOR VALUES FROM (3000) TO (MAXVALUE);
CREATE TABLE meas_us PARTITION OF meas FOR VALUES IN ('us');
CREATE TABLE ev (id int, kind int, body text, PRIMARY KEY (id, kind)) PARTITION BY LIST (kind);
CREATE TABLE ev_a PARTITION OF ev FOR VALUES IN (1);
CREATE TABLE ev_b PARTITION OF ev FOR VALUES IN (2);
"""
SOURCE_ASIA_SQL = """
CREATE TABLE meas_asia (junk int, note text, v int, region text NOT NULL, id int NOT NULL);
ALTER TABLE meas_asia DROP COLUMN junk;
ALTER TABLE meas ATTACH PARTITION meas_asia FOR VALUES IN ('asia');
"""
NATIVE_ASIA_SQL = "CREATE TABLE meas_asia PARTITION OF meas FOR VALUES IN ('asia');"
PRE_EXISTING_SQL = """
INSERT INTO meas SELECT g, (ARRAY['eu', 'us', 'asia'])[1 + g % 3], g % 100, 'n' || g FROM generate_series(1, 6000) g;
INSERT INTO ev SELECT g, 1 + g % 2, 'e' || g FROM generate_series(1, 400) g;
"""
ENTRY_FILTER = "id % 5 <> 0"
# Ours: the root's leaves, meas_us also listed with a filter of its own (a leaf's own filter applies to it).
# The native subscriber gets the same rows through leaf filters (the entry's AND the publication's).
PUBLICATIONS_SQL = f"""
CREATE PUBLICATION pub_routed FOR TABLE meas, meas_us WHERE (id % 7 <> 0);
CREATE PUBLICATION pub_routed_native FOR TABLE meas_eu_lo WHERE ({ENTRY_FILTER}), meas_eu_hi WHERE ({ENTRY_FILTER}),
    meas_us WHERE ({ENTRY_FILTER} AND id % 7 <> 0), meas_asia WHERE ({ENTRY_FILTER});
"""
SLOT, SUB = "ours_routed", "sub_routed"
ROWS = "SELECT id, region, v, note FROM meas ORDER BY id, region"
EV_ROWS = "SELECT id, kind, body FROM ev ORDER BY id, kind"


def spec_tables(added: bool = False) -> dict[str, tuple[tuple[str, ...] | None, str | None]]:
    return {"public.meas": (None, ENTRY_FILTER), **({"public.ev": (None, None)} if added else {})}


def job(dsn: str, uri: str, added: bool = False) -> SnapshotJob:
    tables = spec_tables(added)
    return SnapshotJob(dsn=dsn, slot=SLOT, publication="pub_routed", staging_uri=uri, tables=tables,
                       routing=tuple(tables), settings=SnapshotSettings(initial=True, parallelism=2, chunk_bytes=32 << 10))


def apply_config(uri: str, added: bool = False) -> ApplyConfig:
    """``conflict: strict``, as native: an INSERT of a key the target holds fails the batch — so a leaf's change
    already in its root's snapshot (committed before the sync LSN) and applied again would fail the test."""
    return ApplyConfig(slot=SLOT, staging_root=uri, tables={
        name: TableApplyConfig(row_filter=flt, leaves="route_to_root", conflict="strict")
        for name, (_c, flt) in spec_tables(added).items()})


class Writer:
    """Transactions of every kind the leaves see: updates, rows moving between leaves (across the list level and
    across the eu range level, onto keys never used before), deletes, inserts, leaf TRUNCATEs."""

    def __init__(self, dsn: str, seed: int) -> None:
        self.dsn, self.rnd, self.moves = dsn, random.Random(seed), 0

    def burst(self, n: int, *, truncate: bool = True) -> None:
        rnd, conn = self.rnd, connect(self.dsn)
        cur = conn.cursor()
        for _ in range(n):
            self.moves += 1
            cur.execute("BEGIN")
            cur.execute("UPDATE meas SET v = v + 1, note = note || 'u' WHERE id = %s", (rnd.randint(1, 6000),))
            cur.execute("UPDATE meas SET region = %s WHERE id = %s", (rnd.choice(["eu", "us", "asia"]), rnd.randint(1, 6000)))
            cur.execute("UPDATE meas SET id = id + %s WHERE id = %s AND region = 'eu' AND id < 3000",  # eu_lo → eu_hi
                        (1_000_000 * self.moves, rnd.randint(1, 3000)))
            cur.execute("DELETE FROM meas WHERE id = %s", (rnd.randint(1, 6000),))
            cur.execute("INSERT INTO meas VALUES (%s, %s, 7, 'ins') ON CONFLICT DO NOTHING",
                        (rnd.randint(6001, 20000), rnd.choice(["eu", "us", "asia"])))
            cur.execute("UPDATE ev SET body = body || 'u' WHERE id = %s", (rnd.randint(1, 400),))
            cur.execute("UPDATE ev SET kind = 3 - kind WHERE id = %s", (rnd.randint(1, 400),))
            cur.execute("COMMIT")
            if truncate and self.moves % 3 == 0:
                leaf = rnd.choice(["meas_eu_hi", "meas_asia", "meas_us"])
                region = {"meas_eu_hi": "eu", "meas_asia": "asia", "meas_us": "us"}[leaf]
                base = 30_000 + 1_000 * self.moves
                cur.execute(f"BEGIN; TRUNCATE {leaf}; INSERT INTO meas SELECT g, %s, g %% 10, 't' FROM "
                            "generate_series(%s, %s) g; COMMIT", (region, base, base + 40))
        conn.close()


def test_routed_leaves_snapshot_resync_and_added_equal_a_native_subscriber(pg_server, spark, tmp_path):
    source, native = make_database(pg_server), make_database(pg_server)
    _, ours = make_target(pg_server)
    src, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(src, PARTITIONS_SQL + SOURCE_ASIA_SQL + PRE_EXISTING_SQL + PUBLICATIONS_SQL)
    execute(native_dsn, PARTITIONS_SQL + NATIVE_ASIA_SQL)
    uri = str(tmp_path / "staging")
    writer = Writer(src, 7)
    execute(src, f"SELECT pg_create_logical_replication_slot('{SUB}', 'pgoutput')")
    execute(native_dsn, f"CREATE SUBSCRIPTION {SUB} CONNECTION '{src}' PUBLICATION pub_routed_native "
                        f"WITH (create_slot = false, slot_name = {SUB}, copy_data = true)")

    def meanwhile(point: str) -> None:
        if point in ("slot_created", "chunk_written"):
            writer.burst(2)

    def assert_equal(table_rows: str = ROWS) -> None:
        wait_for_subscriber(src, native_dsn, name=SUB)
        assert query(ours, table_rows) == query(native_dsn, table_rows)

    try:
        # the initial snapshot: every leaf at any depth, read while writers run
        result = initial_snapshot(job(src, uri), on_checkpoint=meanwhile)
        leaves = result.tables["public.meas"]["leaves"]
        assert sorted(leaves) == ["public.meas_asia", "public.meas_eu_hi", "public.meas_eu_lo", "public.meas_us"]
        # (a leaf truncated while the snapshot is read may be read empty: TRUNCATE is not MVCC-safe, and its
        # record comes after the sync LSN, so the apply empties that leaf's rows anyway)
        assert sum(n > 300 for n in leaves.values()) >= 2 and result.tables["public.meas"]["chunks"] > 4
        assert writer.moves > 6  # writers ran while the leaves were read, leaf TRUNCATEs among them
        writer.burst(6)
        drain_all(src, uri, slot=SLOT, publication="pub_routed")
        reports = apply_slot(spark, apply_config(uri), ours)
        assert reports[0].rows["public.meas"]["snapshot_rows"] == sum(leaves.values())  # before any change batch
        wait_ready(native_dsn)
        assert_equal()
        # not vacuous: the filters worked on both sides, rows moved across both levels, leaves were truncated
        assert query(ours, f"SELECT count(*) FROM meas WHERE NOT ({ENTRY_FILTER})") == [(0,)]
        assert query(ours, "SELECT count(*) FROM meas WHERE region = 'us' AND id % 7 = 0") == [(0,)]
        assert query(ours, "SELECT count(*) FROM meas WHERE region = 'asia' AND id % 7 = 0") != [(0,)]
        assert query(ours, "SELECT count(*) FROM meas WHERE id > 1000000") != [(0,)]
        assert query(ours, "SELECT count(*) FROM meas WHERE note = 't'") != [(0,)]
        assert query(ours, "SELECT count(*) FROM meas WHERE region = 'eu' AND id < 3000") != [(0,)]

        # more changes and runs; a re-run applies nothing twice
        writer.burst(5)
        drain_all(src, uri, slot=SLOT, publication="pub_routed", max_changes=60)
        apply_slot(spark, apply_config(uri), ours)
        assert not any(r.applied for r in apply_slot(spark, apply_config(uri), ours))
        assert_equal()

        # damage the routed target, resync it while writers run: the leaves' changes staged before the resync's
        # sync LSN are in its snapshot and are skipped, those after it applied
        execute(ours, "DELETE FROM meas WHERE id % 4 = 0", "UPDATE meas SET v = -1 WHERE id % 3 = 0",
                "INSERT INTO meas VALUES (-5, 'eu', 0, 'stray')")
        assert query(ours, ROWS) != query(native_dsn, ROWS)
        request_resync(job(src, uri), ["public.meas"])
        writer.burst(3)
        drain_all(src, uri, slot=SLOT, publication="pub_routed")
        apply_slot(spark, apply_config(uri), ours)  # held: the damaged table waits for its snapshot
        assert query(ours, "SELECT count(*) FROM meas WHERE note = 'stray'") == [(1,)]
        writer.burst(3)  # staged below the sync LSN in the batch that crosses it: skipped (strict would fail)
        resynced = sync_pending(job(src, uri), on_checkpoint=meanwhile)
        assert set(resynced.tables) == {"public.meas"} and resynced.lsn is not None and resynced.lsn > result.lsn
        writer.burst(3)
        drain_all(src, uri, slot=SLOT, publication="pub_routed")
        apply_slot(spark, apply_config(uri), ours)
        assert_equal()
        synced = dict(query(ours, "SELECT target_table, (sync_lsn - '0/0')::bigint FROM pglogical_sync"))
        assert synced["public.meas"] == resynced.lsn

        # a routed partitioned table added to the running pipeline
        execute(src, "ALTER PUBLICATION pub_routed ADD TABLE ev", "ALTER PUBLICATION pub_routed_native ADD TABLE ev")
        execute(native_dsn, f"ALTER SUBSCRIPTION {SUB} REFRESH PUBLICATION")
        writer.burst(2)
        assert request_added_tables(job(src, uri, added=True)) == ["public.ev"]
        added = sync_pending(job(src, uri, added=True), on_checkpoint=meanwhile)
        assert sorted(added.tables["public.ev"]["leaves"]) == ["public.ev_a", "public.ev_b"]
        writer.burst(3)
        drain_all(src, uri, slot=SLOT, publication="pub_routed")
        apply_slot(spark, apply_config(uri, added=True), ours)
        wait_ready(native_dsn)
        assert_equal()
        assert_equal(EV_ROWS)
        assert len(query(ours, EV_ROWS)) == 400
        manifest = SnapshotLayout.from_uri(uri, SLOT).manifest(SnapshotLayout.from_uri(uri, SLOT).latest("public.ev"))
        assert manifest.format_version == 2 and [p["table"] for p in manifest.parts] == ["public.ev_a", "public.ev_b"]
    finally:
        execute(native_dsn, f"ALTER SUBSCRIPTION {SUB} DISABLE", f"ALTER SUBSCRIPTION {SUB} SET (slot_name = NONE)",
                f"DROP SUBSCRIPTION {SUB}")
        execute(src, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     f"WHERE slot_name IN ('{SUB}', '{SLOT}')")
