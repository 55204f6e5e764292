"""A snapshot's tables load in atomic groups: tables linked by a foreign key of the target in one transaction,
unrelated tables each in their own (in parallel, like native table sync workers); a failure after one group's
COMMIT leaves that group synced and the other untouched, and the rerun loads only the other, to an exact copy."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget
from airflow_provider_pglogical.exceptions import format_lsn
from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, initial_snapshot
from scripts.harness.pgserver import execute, make_target, query
from tests.support.snapshot import SNAP_SCHEMA_SQL

TARGET_SQL = """
CREATE TABLE parents (id int PRIMARY KEY, name text NOT NULL, region text, amount numeric(12,2));
CREATE TABLE children (id int PRIMARY KEY, parent_id int REFERENCES parents(id) ON DELETE CASCADE,
                       body text, big text, secret text);
CREATE TABLE wide (id bigint PRIMARY KEY, payload text, flags int[], at timestamptz);
INSERT INTO parents VALUES (-1, 'stale', NULL, NULL);
INSERT INTO children VALUES (-1, -1, 'stale', NULL, NULL);
INSERT INTO wide VALUES (-1, 'stale', NULL, NULL);
"""
TABLES = ("parents", "children", "wide")


class Stop(Exception):
    """Stands for a crash of the apply at a checkpoint."""


def _xmins(dsn: str, table: str) -> set[str]:
    return {r[0] for r in query(dsn, f"SELECT DISTINCT xmin::text FROM {table}")}


def test_fk_linked_tables_load_together_and_a_failure_after_one_groups_commit_reruns_to_an_exact_copy(
        pg_dsn, pg_server, spark, tmp_path):
    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL)
    uri = str(tmp_path / "stage")
    snap = initial_snapshot(SnapshotJob(dsn=source, slot="s1", publication="pub", staging_uri=uri,
                                        tables={f"public.{t}": (None, None) for t in TABLES},
                                        settings=SnapshotSettings(initial=True, parallelism=2, chunk_bytes=1 << 20)))
    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    seen: list[str] = []

    def second_group_dies_before_commit(point: str) -> None:
        seen.append(point)
        if point == "snapshot_before_commit" and seen.count(point) == 2:
            raise Stop  # the first group to get here has committed (or is about to): this one rolls back

    with pytest.raises(Stop):
        apply_slot(spark, config, target=PostgresTarget(spark, config, target, on_checkpoint=second_group_dies_before_commit))
    synced = {r[0] for r in query(target, "SELECT target_table FROM pglogical_sync")}
    # exactly one group committed, whole: parents + children together, or wide alone
    assert synced in ({"public.parents", "public.children"}, {"public.wide"}), synced
    for table in TABLES:
        stale = query(target, f"SELECT count(*) FROM {table} WHERE id = -1") == [(1,)]
        assert stale == (f"public.{table}" not in synced), table  # the other group's tables still hold old rows

    loaded: list[str] = []
    reports = apply_slot(spark, config, target=PostgresTarget(
        spark, config, target, on_checkpoint=lambda p: loaded.append(p) if p == "snapshot_committed" else None))
    assert loaded == ["snapshot_committed"]  # only the group that was not committed is loaded again
    assert [r.applied for r in reports] == [True]
    for table in TABLES:
        assert query(target, f"SELECT * FROM {table} ORDER BY id") == query(source, f"SELECT * FROM {table} ORDER BY id")
    assert dict(query(target, "SELECT target_table, sync_lsn::text FROM pglogical_sync")) == \
        {f"public.{t}": format_lsn(snap.lsn) for t in TABLES}
    assert not any(r.applied for r in apply_slot(spark, config, target))


def test_unrelated_tables_load_in_their_own_transactions_fk_linked_ones_in_one(pg_dsn, pg_server, spark, tmp_path):
    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL)
    uri = str(tmp_path / "stage")
    initial_snapshot(SnapshotJob(dsn=source, slot="s1", publication="pub", staging_uri=uri,
                                 tables={f"public.{t}": (None, None) for t in TABLES},
                                 settings=SnapshotSettings(initial=True, parallelism=2, chunk_bytes=1 << 20)))
    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    commits: list[str] = []
    apply_slot(spark, config, target=PostgresTarget(
        spark, config, target, on_checkpoint=lambda p: commits.append(p) if p == "snapshot_committed" else None))
    assert len(commits) == 2
    parents, children, wide = (_xmins(target, t) for t in TABLES)
    assert len(parents) == 1 and parents == children  # one transaction wrote both (TRUNCATE names both)
    assert len(wide) == 1 and wide != parents
    for table in TABLES:
        assert query(target, f"SELECT * FROM {table} ORDER BY id") == query(source, f"SELECT * FROM {table} ORDER BY id")
