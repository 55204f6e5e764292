"""Snapshots into a Delta target (mirror): an initial snapshot of filtered and column-listed tables taken while
writers run, then changes; a resync of a damaged Delta table; a crash before a snapshot commit — each ends
with the Delta tables equal to the source, every row once."""

from __future__ import annotations

import random

import pytest
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation, app_id, sync_app_id
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from airflow_provider_pglogical.snapshot.run import (
    SnapshotJob,
    SnapshotSettings,
    initial_snapshot,
    request_resync,
    sync_pending,
)
from scripts.harness.pgserver import execute, query
from scripts.harness.subscriber import connect, drain_all

SOURCE_SQL = """
CREATE TABLE flt (id int PRIMARY KEY, grp int, note text, amount numeric(12,2));
CREATE TABLE cols (id int PRIMARY KEY, a text, secret text, b int, at timestamptz);
CREATE TABLE plain (id bigint PRIMARY KEY, v text, tags text[]);
INSERT INTO flt SELECT g, g % 10, 'f' || g, g * 1.25 FROM generate_series(1, 800) g;
INSERT INTO cols SELECT g, 'a' || g, 's' || g, g, '2024-01-01'::timestamptz + g * interval '1 h'
  FROM generate_series(1, 500) g;
INSERT INTO plain SELECT g, repeat('p', 20 + g % 30), ARRAY['x' || g, 'y'] FROM generate_series(1, 20000) g;
CREATE PUBLICATION pub FOR TABLE flt WHERE (id > 200), cols (id, a, b, at), plain;
"""
SPEC: dict[str, tuple[tuple[str, ...] | None, str | None]] = {
    "public.flt": (None, "id > 200"), "public.cols": (("id", "a", "b", "at"), None), "public.plain": (None, None)}
EXPECTED = {"flt": ("id, grp, note, amount", "id > 200"), "cols": ("id, a, b, at", None), "plain": ("id, v, tags", None)}


def burst(dsn: str, rnd: random.Random, n: int) -> None:
    conn = connect(dsn)
    cur = conn.cursor()
    for _ in range(n):
        cur.execute("BEGIN")
        cur.execute("UPDATE flt SET note = note || 'u', amount = amount + 1 WHERE id = %s", (rnd.randint(1, 900),))
        cur.execute("UPDATE flt SET id = id + 1000 WHERE id = %s", (rnd.randint(150, 250),))  # across the filter
        cur.execute("INSERT INTO flt VALUES (%s, 1, 'n', 2) ON CONFLICT DO NOTHING", (rnd.randint(1, 3000),))
        cur.execute("DELETE FROM flt WHERE id = %s", (rnd.randint(1, 900),))
        cur.execute("UPDATE cols SET secret = 'x', b = b + 1 WHERE id = %s", (rnd.randint(1, 500),))
        cur.execute("UPDATE plain SET v = v || 'u', tags = tags || 'z'::text WHERE id = %s", (rnd.randint(1, 20000),))
        cur.execute("DELETE FROM plain WHERE id = %s", (rnd.randint(1, 20000),))
        cur.execute("INSERT INTO plain VALUES (%s, 'ins', '{}') ON CONFLICT DO NOTHING", (rnd.randint(20001, 40000),))
        cur.execute("COMMIT")
    conn.close()


def job(dsn: str, uri: str) -> SnapshotJob:
    return SnapshotJob(dsn=dsn, slot="ours", publication="pub", staging_uri=uri, tables=SPEC,
                       settings=SnapshotSettings(initial=True, parallelism=2, chunk_bytes=1 << 20))


def config(uri: str) -> ApplyConfig:
    return ApplyConfig(slot="ours", staging_root=uri, tables={
        name: TableApplyConfig(columns=cols, row_filter=flt) for name, (cols, flt) in SPEC.items()})


def delta(location: DeltaLocation, table: str) -> DeltaTable:
    return DeltaTable(location.table_uri(f"public.{table}"))


def assert_equal(dsn: str, location: DeltaLocation) -> None:
    for table, (columns, where) in EXPECTED.items():
        expected = query(dsn, f"SELECT {columns} FROM {table}" + (f" WHERE {where}" if where else "") + " ORDER BY 1")
        data = delta(location, table).to_pyarrow_table().sort_by("id")
        names = [c.strip() for c in columns.split(",")]
        got = [tuple(r[c] for c in names) for r in data.to_pylist()]
        assert len(got) == len(expected), table  # nothing twice, nothing missing
        assert got == [tuple(r) for r in expected], table


class Crash(Exception):
    pass


def test_snapshot_resync_and_a_crash_into_a_delta_mirror_end_equal_to_the_source(pg_dsn, spark, tmp_path):
    execute(pg_dsn, SOURCE_SQL)
    uri, location = str(tmp_path / "staging"), DeltaLocation(str(tmp_path / "lake"))
    rnd = random.Random(7)

    def meanwhile(point: str) -> None:
        if point in ("slot_created", "chunk_written"):
            burst(pg_dsn, rnd, 2)

    try:
        first = initial_snapshot(job(pg_dsn, uri), on_checkpoint=meanwhile)
        assert first.tables["public.plain"]["chunks"] > 1
        burst(pg_dsn, rnd, 6)
        drain_all(pg_dsn, uri, slot="ours", publication="pub")

        # a crash right before the second table's snapshot commit: the first is loaded, the rerun loads the rest
        seen: list[str] = []

        def crash(name: str, target: str) -> None:
            seen.append(f"{name} {target}")
            if name == "before_commit" and len([s for s in seen if s.startswith("before_commit")]) == 2:
                raise Crash(target)

        with pytest.raises(Crash):
            apply_slot(spark, config(uri), target=DeltaTarget(location, "ours", on_checkpoint=crash))
        reports = apply_slot(spark, config(uri), target=DeltaTarget(location, "ours"))
        assert reports[0].applied and len(reports[0].rows) == 2  # the table committed before the crash is skipped
        assert_equal(pg_dsn, location)
        assert delta(location, "flt").transaction_version(sync_app_id("ours", "public.flt")) == first.lsn
        assert not any(r.applied for r in apply_slot(spark, config(uri), target=DeltaTarget(location, "ours")))

        # damage a Delta table, resync it while the others keep flowing
        delta(location, "plain").delete("id % 2 = 0")
        burst(pg_dsn, rnd, 3)
        drain_all(pg_dsn, uri, slot="ours", publication="pub")
        request_resync(job(pg_dsn, uri), ["public.plain"])
        apply_slot(spark, config(uri), target=DeltaTarget(location, "ours"))  # plain held: its changes wait
        resynced = sync_pending(job(pg_dsn, uri), on_checkpoint=meanwhile)
        assert set(resynced.tables) == {"public.plain"} and resynced.lsn > first.lsn
        burst(pg_dsn, rnd, 4)
        drain_all(pg_dsn, uri, slot="ours", publication="pub")
        apply_slot(spark, config(uri), target=DeltaTarget(location, "ours"))
        assert_equal(pg_dsn, location)
        plain = delta(location, "plain")
        assert plain.transaction_version(sync_app_id("ours", "public.plain")) == resynced.lsn
        assert plain.transaction_version(app_id("ours", "public.plain")) > resynced.lsn  # changes after it applied
        assert delta(location, "flt").transaction_version(sync_app_id("ours", "public.flt")) == first.lsn
    finally:
        execute(pg_dsn, "SELECT pg_drop_replication_slot('ours') FROM pg_replication_slots WHERE slot_name = 'ours'")
