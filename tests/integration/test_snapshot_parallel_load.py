"""A snapshot table the apply creates is loaded by several COPY streams and swapped in (``parallel_load``): it equals
the one COPY inside the TRUNCATE transaction (``write_partitions: 1``, the reference path) and the source, value for
value (NULLs, TOASTed text, arrays with NULL elements, numerics, jsonb, timestamps); a kill anywhere in the
parallel load leaves the empty created table without a sync mark, and the rerun loads it exactly once."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.hooks import PgLogicalHook
from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, initial_snapshot
from scripts.harness.pgserver import execute, make_target, query
from tests.conftest import REPO_ROOT
from tests.support.parallel_load_child import KILLED

SOURCE_SQL = """
CREATE TABLE big (id bigint PRIMARY KEY, n numeric(20,6), s text, tags text[], ints int[], tz timestamptz, j jsonb);
INSERT INTO big SELECT g,
  CASE g % 9 WHEN 0 THEN NULL WHEN 1 THEN -0.000001 ELSE g * 1.000001 - 5000 END,
  CASE g % 97 WHEN 0 THEN repeat(md5(g::text), 300)  -- TOASTed, compressed
              WHEN 1 THEN (SELECT string_agg(md5((g * 1000 + i)::text), '') FROM generate_series(1, 120) i)  -- out of line
              WHEN 2 THEN NULL ELSE E'tab\\there \\\\ ' || g END,
  CASE g % 4 WHEN 0 THEN ARRAY['a"b' || g, NULL, 'NULL', ''] WHEN 1 THEN '{}' WHEN 2 THEN NULL ELSE ARRAY['é' || g] END,
  CASE g % 3 WHEN 0 THEN ARRAY[g, NULL, -g]::int[] ELSE NULL END,
  '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 s',
  CASE g % 5 WHEN 0 THEN NULL ELSE jsonb_build_object('g', g, 'v', md5(g::text)) END
FROM generate_series(1, 12000) g;
CREATE PUBLICATION pub FOR TABLE big;
"""
LOGGER = "airflow_provider_pglogical.apply.targets.postgres.parallel_load"


def _rows(dsn: str) -> list[tuple]:
    return query(dsn, "SELECT t::text FROM big t ORDER BY id")


def _leftovers(dsn: str) -> list[tuple]:
    return query(dsn, "SELECT relname FROM pg_class WHERE relname LIKE '\\_pglogical\\_stg\\_%'")


def _never() -> None:
    raise AssertionError("a snapshot loaded from the staged files needs no Spark session")


@pytest.fixture
def staged(pg_dsn, tmp_path):
    """The source's ``big`` staged by an initial snapshot in many chunk files (several row groups to share)."""
    execute(pg_dsn, SOURCE_SQL)
    uri = str(tmp_path / "stage")
    slot = "parload"  # slots are server-wide
    initial_snapshot(SnapshotJob(dsn=pg_dsn, slot=slot, publication="pub", staging_uri=uri,
                                 tables={"public.big": (None, None)},
                                 settings=SnapshotSettings(initial=True, parallelism=2, chunk_bytes=1 << 18)))
    yield slot, uri
    PgLogicalHook.from_dsn(pg_dsn).drop_slot(slot)


def test_a_created_table_loaded_by_several_streams_equals_the_one_copy_load_and_the_source(
        pg_dsn, pg_server, staged, caplog):
    slot, uri = staged
    expected = _rows(pg_dsn)
    assert len(expected) == 12000
    loaded = {}
    for streams in (1, 3):
        _, target = make_target(pg_server)  # the apply creates big
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            reports = apply_slot(SparkOnDemand(_never), ApplyConfig(slot=slot, staging_root=uri, tables={},
                                                                   write_partitions=streams), target)
        assert [r.applied for r in reports] == [True]
        assert reports[0].rows == {"public.big": {"snapshot_rows": 12000}}
        swapped = [r.getMessage() for r in caplog.records if "COPY streams" in r.getMessage()]
        # not vacuous: the parallel load ran with 3 streams, the reference path without it
        assert [m.split(" loaded by ")[1].split(" COPY")[0] for m in swapped] == (["3"] if streams == 3 else [])
        loaded[streams] = target
        assert _leftovers(target) == []
        assert query(target, "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                             "WHERE conrelid = 'big'::regclass") == [("big_pkey", "PRIMARY KEY (id)")]
        assert query(target, "SELECT target_table, rows FROM pglogical_sync") == [("public.big", 12000)]
        # once: a rerun loads nothing
        assert not any(r.applied for r in apply_slot(SparkOnDemand(_never), ApplyConfig(
            slot=slot, staging_root=uri, tables={}, write_partitions=streams), target))
    assert _rows(loaded[3]) == expected
    assert _rows(loaded[1]) == expected


def test_a_table_that_existed_before_loads_in_one_copy(pg_dsn, pg_server, staged, caplog):
    """A target table someone else created (grants, views, indexes of theirs may be on it) is never swapped."""
    slot, uri = staged
    _, target = make_target(pg_server)
    execute(target, SOURCE_SQL.split("INSERT INTO")[0], "CREATE VIEW big_ids AS SELECT id FROM big")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        apply_slot(SparkOnDemand(_never), ApplyConfig(slot=slot, staging_root=uri, tables={}, write_partitions=3),
                   target)
    assert not [r for r in caplog.records if "COPY streams" in r.getMessage()]
    assert _rows(target) == _rows(pg_dsn)
    assert query(target, "SELECT count(*) FROM big_ids") == [(12000,)]


KILLS = ("snapshot_copying:1",  # a stream's COPY under way
         "snapshot_streams_loaded",  # every stream committed into the load table, no key yet
         "snapshot_key_built",  # the load table complete with its key, not swapped in
         "snapshot_before_commit",  # swapped and marked, COMMIT not sent
         "snapshot_committed")  # swapped and committed


@pytest.mark.parametrize("kill_at", KILLS)
def test_a_parallel_load_killed_anywhere_reruns_to_an_exact_copy(pg_dsn, pg_server, staged, kill_at):
    slot, uri = staged
    _, target = make_target(pg_server)
    proc = subprocess.run([sys.executable, "-m", "tests.support.parallel_load_child",
                           json.dumps({"dsn": target, "slot": slot, "staging_uri": uri, "kill_at": kill_at,
                                       "write_partitions": 3})],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == KILLED, proc.stderr[-3000:]
    committed = kill_at == "snapshot_committed"
    marks = query(target, "SELECT count(*) FROM pglogical_sync")
    assert marks == [(1 if committed else 0,)], kill_at
    # before the COMMIT readers see the empty table the apply created; after it every row
    assert query(target, "SELECT count(*) FROM big") == [(12000 if committed else 0,)], kill_at
    reports = apply_slot(SparkOnDemand(_never), ApplyConfig(slot=slot, staging_root=uri, tables={},
                                                            write_partitions=3), target)
    assert [r.applied for r in reports] == ([] if committed else [True]), kill_at
    assert _rows(target) == _rows(pg_dsn)
    assert query(target, "SELECT rows FROM pglogical_sync") == [(12000,)]
    assert _leftovers(target) == [], kill_at
