"""Iceberg target equivalence: the scripted workloads of test_native_equivalence through drain → stage → Spark →
Iceberg (embedded SQL catalog, local warehouse and a real S3 server), read back with pyiceberg and with DuckDB, and
compared with a native subscriber; the change feed replayed in order rebuilds the mirror."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from tests.integration.test_delta_equivalence import native_equivalent
from tests.integration.test_native_equivalence import (
    APPLY_TABLES,
    TABLES,
)
from tests.support.exact import exact
from tests.support.lake_chunks import streamed_chunks
from tests.support.lake_workload import replay_feed


def location(root: str, catalog_dir: str, namespace: str) -> IcebergLocation:
    return IcebergLocation({"type": "sql", "uri": f"sqlite:///{catalog_dir}/catalog.db", "warehouse": root},
                           namespace=namespace)


def iceberg_rows(target: IcebergTarget, table: str, columns: Sequence[str] | None = None) -> list[tuple]:
    """The table's rows as pyiceberg reads them (data files, delete files applied)."""
    tbl = target.open(f"public.{table}")
    assert tbl is not None, table
    data = tbl.scan().to_arrow()
    names = list(columns or data.column_names)
    return sorted(tuple(r[c] for c in names) for r in data.to_pylist())


def duckdb_rows(target: IcebergTarget, table: str) -> list[tuple]:
    """The table's rows as DuckDB reads its current data files — plain Parquet, exact only because the mirror is
    copy-on-write (no delete files: asserted). DuckDB's own iceberg extension cannot be installed offline."""
    tbl = target.open(f"public.{table}")
    assert tbl is not None, table
    tasks = list(tbl.scan().plan_files())
    assert all(not t.delete_files for t in tasks), table
    if not tasks:
        return []
    con = duckdb.connect()
    paths = [t.file.file_path for t in tasks]
    columns = ", ".join(f'"{f.name}"' for f in tbl.schema().fields)
    return sorted(con.execute(f"SELECT {columns} FROM read_parquet(?)",
                              [[p.removeprefix("file://") for p in paths]]).fetchall())


def replay_changelog(target: IcebergTarget, table: str) -> list[tuple]:
    """The Iceberg change feed replayed in order (``replay_feed``)."""
    tbl = target.open(f"public.{table}")
    assert tbl is not None, table
    return replay_feed(tbl.scan().to_arrow())


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_iceberg_mirror_matches_a_native_subscriber_and_the_changelog_rebuilds_it(native_workload, spark, tmp_path,
                                                                                  request, storage, monkeypatch):
    """The workload's staged batches (copied to local disk or S3; the Delta tests apply the same ones) applied into
    an Iceberg mirror and change feed, equal to what the native subscriber of the same source holds."""
    split = streamed_chunks(monkeypatch)  # chunks per streamed table-batch (Spark's buckets or spill files)
    if storage == "s3":
        server = request.getfixturevalue("s3")
        staging = native_workload.copy_to(f"s3://{server.bucket}/staging", server)
        lake = f"s3://{server.bucket}/lake"
    else:
        staging, lake = native_workload.copy_to(str(tmp_path / "staging")), str(tmp_path / "lake")
    config = ApplyConfig(slot="ours", staging_root=staging, tables=APPLY_TABLES)
    # On local disk the net changes stream in buckets of two (several per table: IcebergTarget.apply_net_stream).
    mirror = IcebergTarget(location(lake, str(tmp_path), "mirror"), "ours",
                           **({"chunk_rows": 2} if storage == "local" else {}))
    feed = IcebergTarget(location(lake, str(tmp_path), "feed"), "ours", mode="changelog")
    assert [r.applied for r in apply_slot(spark, config, target=mirror)] == [True, True]
    assert [r.applied for r in apply_slot(spark, config, target=mirror)] == [False, False]  # re-run: no-op
    assert [r.applied for r in apply_slot(spark, config, target=feed)] == [True, True]
    assert [r.applied for r in apply_slot(spark, config, target=feed)] == [False, False]
    # Not vacuous: on local disk some table-batch streamed in several buckets; on S3 none streamed (default bucket).
    assert (bool(split) and max(n for _, n in split) > 1) if storage == "local" else not split, split
    for table in TABLES:
        if table == "toast_rf":
            continue
        native_rows = native_equivalent(native_workload.native, table)
        assert iceberg_rows(mirror, table) == native_rows, table
        if storage == "local":  # DuckDB's httpfs extension (for s3://) cannot be installed offline either
            assert duckdb_rows(mirror, table) == native_rows, table
        assert replay_changelog(feed, table) == native_rows, table
    # Not vacuous: the transforms really happened.
    assert iceberg_rows(mirror, "rf_key") == [(120, 5, "x"), (300, 1, "z")]
    assert iceberg_rows(mirror, "toasty") == [(1, 2, "x" * 9000), (3, 1, "y" * 9000)]
    assert iceberg_rows(mirror, "child") == [(50, 5, "c5")]
    # The stated deviation, as in the PostgreSQL and Delta targets: the value that exists nowhere is rejected.
    assert native_workload.native["toast_rf"] == [(120, 2, "w" * 9000), (150, 1, None)]
    assert iceberg_rows(mirror, "toast_rf") == [(120, 2, "w" * 9000)]
    assert replay_changelog(feed, "toast_rf") == [(120, 2, "w" * 9000)]
    parent = feed.open("public.parent")
    assert parent is not None and "truncate" in parent.scan().to_arrow().column("_op").to_pylist()
    assert mirror.watermarks("ours", {f"public.{t}" for t in TABLES}).keys() <= {f"public.{t}" for t in TABLES}
    if storage == "s3":
        assert any(k.startswith("lake/mirror/toasty/data/") and k.endswith(".parquet") for k in server.keys("lake/"))


def test_every_builtin_type_extreme_reads_back_from_iceberg_as_from_delta(extremes_workload, tmp_path, spark):
    """The Delta target's type mapping holds in Iceberg too (docs/iceberg.md): the same extremes, read back with
    pyiceberg, equal the Delta table's values (checked against PostgreSQL by test_delta_equivalence), smallint as int."""
    from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
    from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
    from tests.integration.test_delta_equivalence import delta_rows

    staging = extremes_workload.copy_to(str(tmp_path / "staging"))
    config = ApplyConfig(slot="ours", staging_root=staging, tables={})
    ice = IcebergTarget(location(str(tmp_path / "lake"), str(tmp_path), "public"), "ours")
    delta = DeltaLocation(str(tmp_path / "delta"))
    assert [r.applied for r in apply_slot(spark, config, target=ice)] == [True, True]
    assert [r.applied for r in apply_slot(spark, config, target=DeltaTarget(delta, "ours"))] == [True, True]
    got = [tuple(exact(v) for v in r) for r in iceberg_rows(ice, "extremes")]
    want = [tuple(exact(v) for v in r) for r in delta_rows(delta, "extremes", _columns(ice))]
    assert got == want and len(got) == 6
    tbl = ice.open("public.extremes")
    assert tbl is not None
    types = {f.name: str(f.field_type) for f in tbl.schema().fields}
    assert (types["i2"], types["n38"], types["lsn"], types["m"], types["tstz"], types["ts"], types["n76"]) == \
        ("int", "decimal(38, 0)", "decimal(20, 0)", "decimal(19, 2)", "timestamptz", "timestamp", "string")


def _columns(target: IcebergTarget) -> list[str]:
    tbl = target.open("public.extremes")
    assert tbl is not None
    return [f.name for f in tbl.schema().fields]
