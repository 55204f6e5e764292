"""Leaf partitions routed to their root's target (``leaves: route_to_root``) without publish_via_partition_root,
against a native subscriber that has the source's partitions: pgoutput sends every change under its leaf,
a row moving between leaves as a DELETE from one and an INSERT into the other, and a leaf's TRUNCATE
under the leaf alone — which empties only that leaf's rows of the shared target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.exceptions import ApplyError
from scripts.harness.pgserver import execute, make_target, query
from scripts.harness.subscriber import drain_all, run_script, wait_for_subscriber
from tests.integration.test_native_parity import native_and_ours
from tests.support.parity import source_with_slot
from tests.support.spark import TEST_SPARK_CONF

# meas_asia was made on its own, with another column order and a dropped column, then attached: its
# attribute numbers differ from its siblings' (columns are matched by name).
SOURCE_SQL = """
CREATE TABLE meas (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE meas_eu PARTITION OF meas FOR VALUES IN ('eu');
CREATE TABLE meas_us PARTITION OF meas FOR VALUES IN ('us');
CREATE TABLE meas_asia (junk int, v int, region text NOT NULL, id int NOT NULL);
ALTER TABLE meas_asia DROP COLUMN junk;
ALTER TABLE meas ATTACH PARTITION meas_asia FOR VALUES IN ('asia');
CREATE PUBLICATION pub_leaves FOR TABLE meas;
"""
NATIVE_SQL = """
CREATE TABLE meas (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE meas_eu PARTITION OF meas FOR VALUES IN ('eu');
CREATE TABLE meas_us PARTITION OF meas FOR VALUES IN ('us');
CREATE TABLE meas_asia PARTITION OF meas FOR VALUES IN ('asia');
"""
# Our second target is partitioned too, by other partitions than the source's (a range over the same
# values, and a default one).
PARTITIONED_TARGET_SQL = """
CREATE TABLE meas (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY RANGE (region);
CREATE TABLE meas_a_f PARTITION OF meas FOR VALUES FROM ('a') TO ('f');
CREATE TABLE meas_rest PARTITION OF meas DEFAULT;
"""
BATCH_1 = [
    "INSERT INTO meas VALUES (1, 'eu', 1), (2, 'eu', 2), (3, 'us', 3), (4, 'us', 4), (8, 'asia', 8);",
    # cross-partition UPDATEs: DELETE from one leaf, INSERT into the other
    "UPDATE meas SET region = 'us', v = 10 WHERE id = 1; UPDATE meas SET v = 30 WHERE id = 3;"
    " UPDATE meas SET v = 80 WHERE id = 8;",
    "DELETE FROM meas WHERE id = 4; INSERT INTO meas VALUES (5, 'eu', 5); UPDATE meas SET region = 'eu' WHERE id = 8;",
]
BATCH_2 = [
    # a leaf's TRUNCATE among other changes: only the eu rows go (2, 5, 8 — 8 moved there from asia)
    "INSERT INTO meas VALUES (11, 'asia', 11); TRUNCATE meas_eu; INSERT INTO meas VALUES (6, 'eu', 6);",
    "INSERT INTO meas VALUES (7, 'us', 7); UPDATE meas SET v = v + 1 WHERE region = 'us';"
    " UPDATE meas SET region = 'eu' WHERE id = 7;",
    # 9 goes into us and out again before us is truncated, 3 leaves us for asia first; then 9 moves into us
    "INSERT INTO meas VALUES (9, 'eu', 9); UPDATE meas SET region = 'us' WHERE id = 9; UPDATE meas SET region = 'eu'"
    " WHERE id = 9; UPDATE meas SET region = 'asia' WHERE id = 3; INSERT INTO meas VALUES (12, 'us', 12);"
    " TRUNCATE meas_us; UPDATE meas SET region = 'us' WHERE id = 9;",
    "INSERT INTO meas VALUES (10, 'us', 10); DELETE FROM meas WHERE id = 11; UPDATE meas SET v = 60 WHERE id = 6;",
]
ROUTED = {"public.meas": TableApplyConfig(leaves="route_to_root")}
ROWS = "SELECT id, region, v FROM meas ORDER BY 1, 2"


def test_leaves_routed_to_the_root_target_match_a_native_subscriber(pg_server, spark, tmp_path):
    from airflow_provider_pglogical.apply.runner import apply_slot

    with source_with_slot(pg_server, SOURCE_SQL) as (src, slot), \
            native_and_ours(pg_server, src, slot, NATIVE_SQL, "pub_leaves") as (native_db, ours):
        partitioned = make_target(pg_server)[1]
        execute(partitioned, PARTITIONED_TARGET_SQL)
        uri = str(tmp_path / "staging")
        config = ApplyConfig(slot=slot, staging_root=uri, tables=ROUTED)
        run_script(src, BATCH_1)
        assert drain_all(src, uri, slot=slot, publication="pub_leaves", max_changes=4) >= 2
        for target in (ours, partitioned):
            apply_slot(spark, config, target)
        run_script(src, BATCH_2)
        assert drain_all(src, uri, slot=slot, publication="pub_leaves", max_changes=5) >= 2
        for target in (ours, partitioned):
            apply_slot(spark, config, target)
        wait_for_subscriber(src, native_db, name=f"n_{slot}")
        assert query(ours, ROWS) == query(native_db, ROWS)
        assert query(partitioned, ROWS) == query(native_db, ROWS)
        assert query(native_db, ROWS) == query(src, ROWS)
        # Not vacuous: moved rows, both leaf truncates with survivors of the other leaves, the asia leaf.
        assert query(native_db, ROWS) == [(3, "asia", 31), (6, "eu", 60), (7, "eu", 8), (9, "us", 9),
                                          (10, "us", 10)]
        # Ours was created by the apply as one plain table, with the rows of every leaf in it.
        assert query(ours, "SELECT relkind FROM pg_class WHERE oid = 'public.meas'::regclass") == [("r",)]
        assert query(ours, "SELECT count(*) FROM pg_class WHERE relname LIKE 'meas_%%' AND relkind IN ('r', 'p')") == [(0,)]
        assert query(partitioned, "SELECT count(*) FROM meas_rest") == [(2,)]  # us rows: routed by our target


def rerecord(path: Path) -> None:
    """Record a rewritten staged file's new size and hash in its batch's manifest (written by the staging writer)."""
    import pyarrow.fs as pafs

    from airflow_provider_pglogical.staging.manifest import hash_file

    manifest_path = path.parent / "_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    size, digest = hash_file(pafs.LocalFileSystem(), str(path))
    manifest["files"][path.name].update(bytes=size, sha256=digest)
    manifest_path.write_text(json.dumps(manifest))


def test_a_leaf_truncate_in_a_batch_staged_without_partition_constraints_is_refused(pg_server, spark, tmp_path):
    """A batch staged before relations carried partition constraints cannot empty only the leaf's rows:
    the batch stops naming leaf, target and LSN, and nothing of it is written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_pglogical.apply.runner import apply_slot

    with source_with_slot(pg_server, SOURCE_SQL) as (src, slot):
        ours = make_target(pg_server)[1]
        uri = str(tmp_path / "staging")
        run_script(src, ["INSERT INTO meas VALUES (1, 'eu', 1), (3, 'us', 3);", "TRUNCATE meas_us;"])
        assert drain_all(src, uri, slot=slot, publication="pub_leaves") == 1
        [relations] = list((tmp_path / "staging").rglob("relations.parquet"))
        staged = pq.read_table(relations)
        pq.write_table(staged.set_column(staged.schema.get_field_index("partition_constraint"), "partition_constraint",
                                         pa.nulls(staged.num_rows, pa.string())), relations)
        rerecord(relations)  # as that older writer recorded it: the batch is intact, only older
        with pytest.raises(ApplyError, match=r"TRUNCATE of leaf partition public\.meas_us at LSN .* public\.meas"):
            apply_slot(spark, ApplyConfig(slot=slot, staging_root=uri, tables=ROUTED), ours)
        assert query(ours, "SELECT count(*) FROM meas") == [(0,)]  # created, but nothing of the batch written


def test_routed_leaves_replay_in_commit_order_when_the_netted_batch_cannot_apply(pg_server, spark, tmp_path):
    """Our plain target has a unique index the source's leaves cannot have (on ``v`` across leaves): two rows of
    different leaves swapping values need the ordered replay, which merges the leaves' changes by position —
    with a row moving between leaves and a leaf TRUNCATE in the same batch."""
    from airflow_provider_pglogical.apply.runner import apply_slot

    with source_with_slot(pg_server, SOURCE_SQL) as (src, slot), \
            native_and_ours(pg_server, src, slot, NATIVE_SQL, "pub_leaves") as (native_db, ours):
        execute(ours, "CREATE TABLE meas (id int, region text, v int, PRIMARY KEY (id, region), UNIQUE (v))")
        uri = str(tmp_path / "staging")
        config = ApplyConfig(slot=slot, staging_root=uri, tables=ROUTED)
        run_script(src, ["INSERT INTO meas VALUES (1, 'eu', 1), (2, 'us', 2), (4, 'asia', 4);"])
        drain_all(src, uri, slot=slot, publication="pub_leaves")
        assert not any(r.ordered for r in apply_slot(spark, config, ours))
        run_script(src, [
            "UPDATE meas SET v = 0 WHERE id = 1; UPDATE meas SET v = 1 WHERE id = 2; UPDATE meas SET v = 2 WHERE id = 1;",
            "UPDATE meas SET region = 'us' WHERE id = 4; INSERT INTO meas VALUES (5, 'asia', 5); TRUNCATE meas_asia;"
            " INSERT INTO meas VALUES (6, 'asia', 6);",
        ])
        drain_all(src, uri, slot=slot, publication="pub_leaves")
        reports = apply_slot(spark, config, ours)
        assert [r.ordered for r in reports if r.applied] == [True]
        wait_for_subscriber(src, native_db, name=f"n_{slot}")
        assert query(ours, ROWS) == query(native_db, ROWS) == [(1, "eu", 2), (2, "us", 1), (4, "us", 4), (6, "asia", 6)]


def test_the_source_catalog_names_leaves_ancestors_and_constraints_and_a_selection_skips_routed_leaves(pg_server):
    """What the drain stages for a leaf (at any depth) and what a run's selection resolves, on a real source."""
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
    from airflow_provider_pglogical.pipeline.source import resolve_with
    from airflow_provider_pglogical.pipeline.spec import parse_spec
    from scripts.harness.pgserver import make_database

    dsn = pg_server.dsn(make_database(pg_server))
    execute(dsn, SOURCE_SQL + """
        CREATE TABLE meas_x PARTITION OF meas FOR VALUES IN ('x1', 'x2') PARTITION BY LIST (region);
        CREATE TABLE meas_x1 PARTITION OF meas_x FOR VALUES IN ('x1');
        CREATE TABLE meas_x_rest PARTITION OF meas_x DEFAULT;
        CREATE TABLE other (id int PRIMARY KEY);
        CREATE PUBLICATION pub_two FOR TABLE meas, other;""")
    hook = PgLogicalHook.from_dsn(dsn)
    try:
        def info(table: str) -> tuple[tuple[str, ...], str | None]:
            return hook.partition_info(query(dsn, f"SELECT '{table}'::regclass::oid")[0][0])

        assert hook.partition_leaves("public.meas") == ["public.meas_asia", "public.meas_eu", "public.meas_us",
                                                        "public.meas_x1", "public.meas_x_rest"]
        assert hook.partition_leaves("public.other") == [] and hook.partition_leaves("public.nope") == []
        assert info("public.other") == ((), None) and info("public.meas") == ((), None)
        ancestors, constraint = info("public.meas_x1")
        assert ancestors == ("public.meas_x", "public.meas")
        # the constraint holds exactly the leaf's rows: evaluated against every row the root routes
        execute(dsn, "INSERT INTO meas VALUES (1, 'x1', 1), (2, 'x2', 2), (3, 'eu', 3), (4, 'asia', 4)")
        for leaf in ("public.meas_x1", "public.meas_x_rest", "public.meas_eu", "public.meas_asia"):
            _, constraint = info(leaf)
            assert query(dsn, f"SELECT id FROM meas WHERE {constraint} ORDER BY 1") == \
                query(dsn, f"SELECT id FROM {leaf} ORDER BY 1"), leaf
        spec = parse_spec({"source": {"dsn": dsn, "publication": "pub_two", "slot": "s"}, "staging": {"uri": "/x"},
                           "target": {"kind": "postgres", "dsn": dsn},
                           "tables": {"*": {}, "public.meas": {"leaves": "route_to_root"}}}, env={})
        assert sorted(resolve_with(spec, hook).tables) == ["public.meas", "public.other"]
    finally:
        hook.close()


def test_pglogical_run_routes_the_leaves_named_by_a_spec_to_the_roots_target(pg_server, tmp_path):
    """The spec as a user writes it, through the console script in a user-like environment: a ``"*"``
    selection beside a partitioned table whose leaves go to one target table."""
    import json

    import yaml

    from scripts.harness.pgserver import drop_database, make_database
    from tests.integration.test_cli import pglogical

    source_db, target_db = make_database(pg_server), make_database(pg_server)
    src = pg_server.dsn(source_db)
    execute(src, SOURCE_SQL + "CREATE TABLE other (id int PRIMARY KEY); ALTER PUBLICATION pub_leaves ADD TABLE other;")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "source": {"dsn": pg_server.uri(source_db), "publication": "pub_leaves", "slot": f"r_{source_db}".lower(),
                   "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "postgres", "dsn": pg_server.uri(target_db)},
        "tables": {"*": {}, "public.meas": {"leaves": "route_to_root", "target": "public.meas_all"}},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }))
    try:
        assert (first := pglogical("decode", "--spec", str(spec))).returncode == 0, first.stderr[-3000:]
        run_script(src, BATCH_1 + ["INSERT INTO other VALUES (1);", "TRUNCATE meas_us;"])
        result = pglogical("run", "--spec", str(spec))
        assert result.returncode == 0, result.stderr[-3000:]
        assert json.loads(result.stdout)["apply"]["batches_applied"] == 1
        target = pg_server.dsn(target_db)
        assert query(target, "SELECT id, region, v FROM meas_all ORDER BY 1, 2") == query(src, ROWS) == \
            [(2, "eu", 2), (5, "eu", 5), (8, "eu", 80)]
        assert query(target, "SELECT id FROM other") == [(1,)]
        assert query(target, "SELECT count(*) FROM pg_class WHERE relname LIKE 'meas_%%' AND relname <> 'meas_all' "
                             "AND relkind IN ('r', 'p')") == [(0,)]  # no leaf became a table of its own
    finally:
        execute(pg_server.dsn(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                 "WHERE slot_name = %s AND NOT active", params=(f"r_{source_db}".lower(),))
        drop_database(pg_server, source_db)
        drop_database(pg_server, target_db)
