"""Delta target equivalence: the scripted workloads of test_native_equivalence through drain → stage → Spark →
Delta (local disk and a real S3 server), read back with deltalake and compared with a native subscriber."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal

import numpy as np
import pytest
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, initial_snapshot
from scripts.harness.pgserver import execute, make_target, query
from tests.integration.test_native_equivalence import (
    APPLY_TABLES,
    TABLES,
)
from tests.support.exact import exact
from tests.support.lake_chunks import streamed_chunks
from tests.support.lake_workload import replay_feed

NATIVE_COLUMNS = {"cols": ("id", "a", "b")}  # the column list: the subscriber's table has every column


def delta_rows(location: DeltaLocation, table: str, columns: Sequence[str] | None = None) -> list[tuple]:
    data = DeltaTable(location.table_uri(f"public.{table}"), storage_options=location.options).to_pyarrow_table()
    names = list(columns or data.column_names)
    return sorted(tuple(r[c] for c in names) for r in data.to_pylist())


def replay_changelog(location: DeltaLocation, table: str) -> list[tuple]:
    """The Delta change feed replayed in order (``replay_feed``)."""
    return replay_feed(DeltaTable(location.table_uri(f"public.{table}"), storage_options=location.options)
                       .to_pyarrow_table())


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_delta_mirror_matches_a_native_subscriber_and_the_changelog_rebuilds_it(native_workload, spark, tmp_path,
                                                                                request, storage, monkeypatch):
    """The workload's staged batches (copied to local disk or S3) applied into a Delta mirror and change feed, equal
    to what the native subscriber of the same source holds."""
    split = streamed_chunks(monkeypatch)  # chunks per streamed table-batch (Spark's buckets or spill files)
    if storage == "s3":
        server = request.getfixturevalue("s3")
        staging = native_workload.copy_to(f"s3://{server.bucket}/staging", server)
        lake = f"s3://{server.bucket}/lake"
    else:
        staging, lake = native_workload.copy_to(str(tmp_path / "staging")), str(tmp_path / "lake")
    config = ApplyConfig(slot="ours", staging_root=staging, tables=APPLY_TABLES)
    mirror_loc, feed_loc = DeltaLocation(lake + "/mirror"), DeltaLocation(lake + "/feed")
    # On local disk the MERGE sources stream in chunks of two net changes (several per table: Spark's buckets,
    # stream.py, or spill files of the net rows read in this process, lake/parts.py).
    mirror = DeltaTarget(mirror_loc, "ours", **({"chunk_rows": 2} if storage == "local" else {}))
    feed = DeltaTarget(feed_loc, "ours", mode="changelog")
    assert [r.applied for r in apply_slot(spark, config, target=mirror)] == [True, True]
    assert [r.applied for r in apply_slot(spark, config, target=mirror)] == [False, False]  # re-run: no-op
    assert [r.applied for r in apply_slot(spark, config, target=feed)] == [True, True]
    assert [r.applied for r in apply_slot(spark, config, target=feed)] == [False, False]
    if storage == "local":  # merged in one commit per bucket of two net changes (max_merge_rows): the same tables
        bucketed_loc = DeltaLocation(lake + "/bucketed")
        bucketed = DeltaTarget(bucketed_loc, "ours", max_merge_rows=2)
        assert [r.applied for r in apply_slot(spark, config, target=bucketed)] == [True, True]
        assert [r.applied for r in apply_slot(spark, config, target=bucketed)] == [False, False]
        for table in TABLES:
            assert delta_rows(bucketed_loc, table) == delta_rows(mirror_loc, table), table
        assert any("pglogical.bucket" in c for table in TABLES  # not vacuous: some batch took several commits
                   for c in DeltaTable(bucketed_loc.table_uri(f"public.{table}")).history())
    for table in TABLES:
        if table == "toast_rf":
            continue
        native_rows = native_equivalent(native_workload.native, table)
        assert delta_rows(mirror_loc, table) == native_rows, table
        assert replay_changelog(feed_loc, table) == native_rows, table
    # Not vacuous: on local disk the MERGE sources streamed in several buckets; on S3, with the default bucket,
    # every table-batch's staged changes fit one bucket, so each was collected whole (nothing streamed).
    assert (bool(split) and max(n for _, n in split) > 1) if storage == "local" else not split, split
    assert delta_rows(mirror_loc, "rf_key") == [(120, 5, "x"), (300, 1, "z")]
    assert delta_rows(mirror_loc, "toasty") == [(1, 2, "x" * 9000), (3, 1, "y" * 9000)]
    assert delta_rows(mirror_loc, "child") == [(50, 5, "c5")]
    # The stated deviation, as in the PostgreSQL target: the value that exists nowhere is rejected.
    assert native_workload.native["toast_rf"] == [(120, 2, "w" * 9000), (150, 1, None)]
    assert delta_rows(mirror_loc, "toast_rf") == [(120, 2, "w" * 9000)]
    assert replay_changelog(feed_loc, "toast_rf") == [(120, 2, "w" * 9000)]
    ops = DeltaTable(feed_loc.table_uri("public.parent"), storage_options=feed_loc.options).to_pyarrow_table()
    assert "truncate" in ops.column("_op").to_pylist()
    if storage == "s3":
        assert any(k.startswith("lake/mirror/public/toasty/_delta_log/") for k in server.keys("lake/"))


def native_equivalent(native: Mapping[str, list[tuple]], table: str) -> list[tuple]:
    """The native subscriber's rows of ``table`` in the lake's columns (``cols`` without its unpublished column)."""
    return [tuple(r[i] for i in range(len(NATIVE_COLUMNS.get(table, r)))) if table != "cols" else (r[0], r[1], r[3])
            for r in native[table]]


# Every built-in type at its extremes (docs/types.md, "Delta Lake"): maxima, minima, the special values, all NULL.
# money's maximum sits in a column that also holds a NULL; numeric(76,10) is wider than any Delta or Spark decimal.
EXTREMES_SQL = """
CREATE TABLE extremes (id int PRIMARY KEY, b bool, i2 int2, i4 int4, i8 int8, o oid, f4 float4, f8 float8,
  n38 numeric(38,0), n76 numeric(76,10), nu numeric, m money, lsn pg_lsn, d date, tm time, ttz timetz,
  ts timestamp, tstz timestamptz, iv interval, tx text, bp char(3), bt bytea, u uuid, ai int8[],
  an numeric(50,5)[]);
CREATE PUBLICATION pub_all FOR TABLE extremes;
"""
N76_MAX = "9" * 66 + "." + "9" * 10
EXTREMES_ONE = [
    f"""INSERT INTO extremes VALUES (1, true, 32767, 2147483647, 9223372036854775807, 4294967295, '3.4028235e38',
      '1.7976931348623157e308', {"9" * 38}, '{N76_MAX}', '1e-100', '92233720368547758.07', 'FFFFFFFF/FFFFFFFF',
      '9999-12-31', '24:00:00', '24:00:00-15:59', '9999-12-31 23:59:59.999999', '9999-12-31 23:59:59.999999+00',
      '178956970 years 7 mons 2147483647 days 2562047788:00:54.775807', 'héllo ✓', 'ab', '\\xff00',
      'ffffffff-ffff-ffff-ffff-ffffffffffff', '{{9223372036854775807,NULL}}', '{{{"9" * 45}.99999,-0.00001}}');
    INSERT INTO extremes VALUES (2, false, -32768, -2147483648, -9223372036854775808, 0, '1.4e-45', '4.9e-324',
      -{"9" * 38}, '-{N76_MAX}', '-1e100', '-92233720368547758.08', '0/0', '0001-01-01', '00:00:00',
      '00:00:00+15:59', '0001-01-01 00:00:00', '0001-01-01 00:00:00+00',
      '-178956970 years -8 mons -2147483648 days -2562047788:00:54.775807', '', '', '',
      '00000000-0000-0000-0000-000000000000', '{{-9223372036854775808}}', '{{}}');
    INSERT INTO extremes (id, f4, f8, n38, n76, nu, tm, ttz, m) VALUES (3, 'NaN', '-0', 0, 'NaN', 'NaN',
      '23:59:59.999999', '23:59:59.999999-15:59:59', NULL);
    INSERT INTO extremes (id) VALUES (4);""",
]
EXTREMES_TWO = [
    """INSERT INTO extremes (id, f4, f8, n76, nu, m) VALUES (5, '-0', 'NaN', '0.0000000001', 'Infinity', '-0.01'),
      (6, 'Infinity', '-Infinity', 0, '-Infinity', 0);
    UPDATE extremes SET m = NULL, tx = 'changed' WHERE id = 1; UPDATE extremes SET m = '92233720368547758.07' WHERE id = 4;
    UPDATE extremes SET i2 = i2 WHERE id = 2;""",
]
# What each column holds in Delta, computed by PostgreSQL itself from the source values (docs/types.md, "Delta Lake").
EXTREMES_ORACLE = """SELECT id, b, i2, i4, i8, o::bigint, f4, f8, n38, n76::text, nu::text, m::numeric,
  lsn - '0/0'::pg_lsn, d, (extract(epoch FROM tm) * 1000000)::bigint,
  CASE WHEN ttz IS NOT NULL THEN ((extract(epoch FROM ttz::time) * 1000000)::bigint, extract(timezone FROM ttz)::int)::text END,
  ts, tstz,
  CASE WHEN iv IS NOT NULL THEN ((extract(year FROM iv) * 12 + extract(month FROM iv))::int, extract(day FROM iv)::int,
    (extract(hour FROM iv) * 3600000000 + extract(minute FROM iv) * 60000000 + extract(microsecond FROM iv))::bigint)::text
  END,
  tx, rpad(bp, 3), bt, u::text, ai, an::text[]
  FROM extremes ORDER BY id"""


EXTREMES_COLUMNS = ("id", "b", "i2", "i4", "i8", "o", "f4", "f8", "n38", "n76", "nu", "m", "lsn", "d", "tm", "ttz", "ts",
                    "tstz", "iv", "tx", "bp", "bt", "u", "ai", "an")


def _delta_extremes(location: DeltaLocation) -> list[tuple]:
    """The Delta table's rows in the oracle's shape (structs as PostgreSQL prints a row, float4 as stored)."""
    data = DeltaTable(location.table_uri("public.extremes"), storage_options=location.options).to_pyarrow_table()
    out = []
    for r in sorted(data.to_pylist(), key=lambda r: r["id"]):
        ttz = None if r["ttz"] is None else f"({r['ttz']['time']},{r['ttz']['utc_offset']})"
        iv = None if r["iv"] is None else f"({r['iv']['months']},{r['iv']['days']},{r['iv']['microseconds']})"
        out.append((r["id"], r["b"], r["i2"], r["i4"], r["i8"], r["o"], r["f4"], r["f8"], r["n38"], r["n76"],
                    r["nu"], r["m"], r["lsn"], r["d"], r["tm"], ttz, r["ts"], r["tstz"], iv, r["tx"], r["bp"],
                    r["bt"], r["u"], r["ai"], r["an"]))
    return out


def _as_stored(rows: list[tuple]) -> list[tuple]:
    """PostgreSQL's rows with float4 as the float32 it stores, bytea as bytes, floats compared exactly."""
    out = []
    for r in rows:
        values = list(r)
        if values[6] is not None:
            values[6] = float(np.float32(values[6]))
        if isinstance(values[21], memoryview):
            values[21] = bytes(values[21])
        out.append(tuple(exact(v) for v in values))
    return out


def assert_extremes(source_dsn: str, location: DeltaLocation, ours: str) -> None:
    """The Delta table as PostgreSQL computes the source's values map (``EXTREMES_ORACLE``), and the PostgreSQL
    target's rows as ``::text`` equal to the source's."""
    expected = _as_stored(query(source_dsn + " options='-c TimeZone=UTC'", EXTREMES_ORACLE))
    got = _as_stored(_delta_extremes(location))
    assert [r[0] for r in got] == [r[0] for r in expected]
    for row, want in zip(got, expected, strict=True):
        for name, value, oracle in zip(EXTREMES_COLUMNS, row, want, strict=True):
            assert value == oracle, (row[0], name)
    # Not vacuous: the values that went wrong are there.
    by_id = {r[0]: r for r in expected}
    assert by_id[4][11] == Decimal("92233720368547758.07") and by_id[1][11] is None
    assert by_id[1][9] == N76_MAX and by_id[3][9] == "NaN" and by_id[1][12] == Decimal(2**64 - 1)
    assert by_id[1][14] == 86_400_000_000 and by_id[3][7] == (-0.0, -1.0)
    columns = [c for (c,) in query(source_dsn, "SELECT attname FROM pg_attribute WHERE attrelid = "
                                   "'extremes'::regclass AND attnum > 0 ORDER BY attnum")]
    texts = f"SELECT {', '.join(f'{c}::text' for c in columns)} FROM extremes ORDER BY id"
    assert query(ours, texts) == query(source_dsn, texts)


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_every_builtin_type_extreme_reads_back_from_delta_as_postgres_holds_it(extremes_workload, pg_server, spark,
                                                                                 tmp_path, request, storage):
    """Delta mirror (read back with deltalake) and the PostgreSQL target (as ``::text``) against the source."""
    if storage == "s3":
        server = request.getfixturevalue("s3")  # moto keeps its buckets per process: a prefix of this test's own
        root = f"s3://{server.bucket}/{tmp_path.name}"
        staging, lake = extremes_workload.copy_to(f"{root}/staging", server), f"{root}/lake"
    else:
        staging, lake = extremes_workload.copy_to(str(tmp_path / "staging")), str(tmp_path / "lake")
    _, ours = make_target(pg_server)
    config = ApplyConfig(slot="ours", staging_root=staging, tables={})
    location = DeltaLocation(lake)
    assert [r.applied for r in apply_slot(spark, config, target=DeltaTarget(location, "ours"))] == [True, True]
    assert [r.applied for r in apply_slot(spark, config, ours)] == [True, True]
    assert_extremes(extremes_workload.source_dsn, location, ours)
    # The change feed holds the same values: replayed, it rebuilds the mirror.
    feed = DeltaLocation(lake + "/feed")
    assert [r.applied for r in apply_slot(spark, config, target=DeltaTarget(feed, "ours", mode="changelog"))] \
        == [True, True]
    compared = [[tuple(exact(v) for v in r) for r in rows]
                for rows in (replay_changelog(feed, "extremes"), delta_rows(location, "extremes"))]
    assert compared[0] == compared[1] and len(compared[0]) == 6


def test_a_snapshot_of_every_builtin_type_extreme_loads_as_postgres_holds_it(extremes_workload, pg_server, spark,
                                                                            tmp_path):
    """The same extremes taken by an initial snapshot (staged locally, a slot of its own on the workload's source)
    into Delta and PostgreSQL targets."""
    staging, location = str(tmp_path / "staging"), DeltaLocation(str(tmp_path / "lake"))
    _, ours = make_target(pg_server)
    source_dsn = extremes_workload.source_dsn
    job = SnapshotJob(dsn=source_dsn, slot="snap", publication="pub_all", staging_uri=staging,
                      tables={"public.extremes": (None, None)}, settings=SnapshotSettings(initial=True))
    config = ApplyConfig(slot="snap", staging_root=staging, tables={})
    try:
        initial_snapshot(job)
        assert any(r.applied for r in apply_slot(spark, config, target=DeltaTarget(location, "snap")))
        assert any(r.applied for r in apply_slot(spark, config, ours))
        assert_extremes(source_dsn, location, ours)
    finally:
        execute(source_dsn, "SELECT pg_drop_replication_slot('snap') FROM pg_replication_slots WHERE slot_name = 'snap'")
