"""Snapshot rows printed straight from the staged files (``SnapshotChanges.direct_rows`` + ``arrownet.plan_rows``)
and through Spark (``PGLOGICAL_APPLY_DIRECT=0``) load the same target: both equal the source, table by table, and
the direct path ran exactly for the tables whose every column ``arrowtext`` prints and whose dates/timestamps lie
in its range."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.direct import ENV_SWITCH
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.hooks import PgLogicalHook
from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, initial_snapshot
from scripts.harness.pgserver import execute, make_target, query
from tests.support.snapshot import SNAP_SCHEMA_SQL

SCALARS = "(id int PRIMARY KEY, d date, t timestamp, tz timestamptz, f float8, r real, b boolean, n numeric(20,6), " \
          "s text, i2 smallint, i8 bigint, tags text[])"
EXTRA_SQL = f"""
CREATE TABLE scalars {SCALARS};
CREATE TABLE wild {SCALARS};
INSERT INTO scalars SELECT g, date '2000-01-01' + g, timestamp '1999-12-31 23:59:59.999999' + g * interval '1 h',
  timestamptz '0001-01-01 00:00:00+00' + g * interval '1000 days', CASE g % 5 WHEN 0 THEN 'NaN' WHEN 1 THEN '-0'
  WHEN 2 THEN 'Infinity' ELSE g / 7.0 END, g / 3.0, g % 2 = 0, g * 1.000001 - 1000, E'tab\\there\\\\ and \\n ' || g,
  (g % 30000)::smallint, g * 1000000007::bigint,
  CASE g % 4 WHEN 0 THEN ARRAY['a"b' || g, E'c\\\\d{{,}}', NULL, 'NULL', ''] WHEN 1 THEN '{{}}' WHEN 2 THEN NULL
  ELSE ARRAY[' sp ', E'tab\there\n', 'é' || g] END FROM generate_series(1, 2500) g;
INSERT INTO scalars VALUES (0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO wild SELECT * FROM scalars;
INSERT INTO wild VALUES (-1, 'infinity', '0044-03-15 BC', '-infinity', 1, 1, true, 1, 'x', 1, 1, '{{x}}');
ALTER PUBLICATION pub ADD TABLE scalars, wild;
"""
TABLES = ("parents", "children", "wide", "scalars", "wild")


def _rows(dsn: str, table: str) -> list[tuple]:
    """Rows as PostgreSQL's record text: every stored value shows exactly (NaN, -0, infinities included)."""
    return query(dsn, f"SELECT t::text FROM {table} t ORDER BY id")  # noqa: S608 - the module's own names


def test_snapshot_rows_printed_from_the_staged_files_load_what_the_spark_path_loads(
        pg_dsn, pg_server, spark, tmp_path, monkeypatch, caplog):
    source = pg_dsn
    execute(source, SNAP_SCHEMA_SQL)
    execute(source, EXTRA_SQL)
    uri = str(tmp_path / "stage")
    slot = "snapdirect"  # slots are server-wide
    initial_snapshot(SnapshotJob(dsn=source, slot=slot, publication="pub", staging_uri=uri,
                                 tables={f"public.{t}": (None, None) for t in TABLES},
                                 settings=SnapshotSettings(initial=True, parallelism=2, chunk_bytes=1 << 18)))
    try:
        targets = {}
        for direct in (True, False):
            monkeypatch.setenv(ENV_SWITCH, "1" if direct else "0")
            _, target = make_target(pg_server)
            execute(target, SNAP_SCHEMA_SQL.split("INSERT INTO")[0])
            execute(target, EXTRA_SQL.split("INSERT INTO")[0])
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="airflow_provider_pglogical.apply.targets.postgres.snapshot"):
                reports = apply_slot(spark, ApplyConfig(slot=slot, staging_root=uri, tables={}), target)
            assert [r.applied for r in reports] == [True]
            straight = {m.split()[2] for m in (r.getMessage() for r in caplog.records)
                        if "printed straight from the staged files" in m}
            # not vacuous: the plain tables took the direct path, arrays of text and ints too (wide, scalars);
            # values beyond Arrow's printable range (BC, ±infinity) keep the Spark path
            assert straight == ({"public.parents", "public.children", "public.wide", "public.scalars"}
                                if direct else set())
            targets[direct] = target
        for table in TABLES:
            expected = _rows(source, table)
            assert expected, table
            assert _rows(targets[True], table) == expected, table
            assert _rows(targets[False], table) == expected, table
    finally:
        PgLogicalHook.from_dsn(source).drop_slot(slot)


@pytest.mark.parametrize("columns", [("id", "name"), ("id",)])
def test_plan_rows_refuses_a_column_with_a_target_type_tree(columns, tmp_path):
    """A column the target stores as another type tree (``describe_types`` names it) needs the JVM's text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_pglogical.apply.targets.postgres import arrownet

    path = str(tmp_path / "f.parquet")
    new = pa.StructArray.from_arrays([pa.array([1, 2], pa.int32()), pa.array(["a", None])], names=["id", "name"])
    pq.write_table(pa.table({"new": new}), path)
    plan = arrownet.plan_rows([path], columns, {})
    assert plan is not None and plan.tasks == ((path, 0),)
    assert b"".join(arrownet.row_text(plan, 1 << 20)(plan.tasks)) == (
        b"1\ta\n2\t\\N\n" if columns == ("id", "name") else b"1\n2\n")
    from airflow_provider_pglogical.apply.targets.postgres.target_types import ARRAY, MONEY, RANGE, SCALAR, PgType

    for tree in (PgType(MONEY), PgType(RANGE), PgType(ARRAY, element=PgType(RANGE))):
        assert arrownet.plan_rows([path], columns, {columns[-1]: tree}) is None
    assert arrownet.plan_rows([path], columns, {columns[-1]: PgType(ARRAY, element=PgType(SCALAR))}) == plan


def test_streamed_text_prints_every_row_group_in_file_order_and_stops_when_the_copy_does(tmp_path):
    """``StreamedText``: row groups printed on several threads come back in file order, whatever thread
    finishes first; a COPY that stops reading (an error, a closed connection) leaves no printing behind."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_pglogical.apply.targets.postgres import arrownet
    from airflow_provider_pglogical.apply.targets.postgres.snapshot import StreamedText

    paths = []
    for f in range(3):
        path = str(tmp_path / f"f{f}.parquet")
        ids = pa.array(range(f * 1000, (f + 1) * 1000), pa.int64())
        names = pa.array([f"n\t{i}" if i % 7 else None for i in range(f * 1000, (f + 1) * 1000)])
        pq.write_table(pa.table({"new": pa.StructArray.from_arrays([ids, names], names=["id", "name"])}), path,
                       row_group_size=97)  # uneven row groups, several per file
        paths.append(path)
    plan = arrownet.plan_rows(paths, ("id", "name"), {})
    assert plan is not None and len(plan.tasks) == 3 * 11
    expected = b"".join(f"{i}\t{f'n{chr(92)}t{i}' if i % 7 else chr(92) + 'N'}\n".encode() for i in range(3000))
    assert b"".join(arrownet.row_text(plan, 1 << 20)(plan.tasks)) == expected
    for threads in (1, 2, 4):
        assert b"".join(StreamedText(plan, threads).chunks()) == expected
    chunks = StreamedText(plan, 2).chunks()
    assert next(chunks).startswith(b"0\t\\N\n1\tn\\t1\n")
    chunks.close()  # what copy_expert's failure does to the feed: the pool shuts down, nothing is left running
    import threading
    assert not [t for t in threading.enumerate() if t.name.startswith("snapshot-text")]
