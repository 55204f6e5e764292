"""The Delta mirror's direct path (``apply/targets/lake/direct.py``) and Spark's net frame give the same Delta tables:
random workloads drained in batches, applied once with the direct path allowed and once with
``PGLOGICAL_APPLY_DIRECT=0``, both read back with deltalake and compared with each other and with the source."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
from deltalake import DeltaTable

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.direct import ENV_SWITCH
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import drain_all
from tests.integration.test_apply_direct import SCHEMA, _round

TABLES = ("plain", "full_id", "arr", "pk2")
KEYS = {"pk2": ("k1", "k2")}
LOGGER = "airflow_provider_pglogical.apply.targets.lake.net"


def _exact(value: object) -> object:
    """Floats bit for bit (-0.0 is not 0.0, NaN equals NaN)."""
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else (value, math.copysign(1.0, value))
    return value


def lake_rows(location: DeltaLocation, table: str) -> list[tuple]:
    data = DeltaTable(location.table_uri(f"public.{table}")).to_pyarrow_table()
    return sorted((tuple(_exact(v) for v in r.values()) for r in data.to_pylist()), key=repr)


def source_keys(dsn: str, table: str) -> list[tuple]:
    key = ", ".join(KEYS.get(table, ("id",)))
    return sorted(query(dsn, f"SELECT {key} FROM {table}"), key=repr)  # noqa: S608 - the module's own names


def lake_keys(location: DeltaLocation, table: str) -> list[tuple]:
    data = DeltaTable(location.table_uri(f"public.{table}")).to_pyarrow_table()
    return sorted((tuple(r[k] for k in KEYS.get(table, ("id",))) for r in data.to_pylist()), key=repr)


def _workload(source_dsn: str, uri: str, slot: str, rng: random.Random, steps: tuple[bool, ...]) -> None:
    live: dict[str, set] = {t: set() for t in TABLES}
    next_id = [0]
    for repeat in steps:
        conn = psycopg2.connect(source_dsn)
        with conn, conn.cursor() as cur:
            _round(cur, rng, live, next_id, wild=False, repeat=repeat)
        conn.close()
        assert drain_all(source_dsn, uri, slot=slot) == 1


@contextmanager
def _source(pg_server, tmp_path, slot: str) -> Iterator[tuple[str, str]]:
    """A source database with the module's tables and a slot; yields its DSN and the staging root."""
    source_dsn = pg_server.dsn(make_database(pg_server))
    execute(source_dsn, SCHEMA)
    PgLogicalHook.from_dsn(source_dsn).create_slot(slot)
    try:
        yield source_dsn, str(tmp_path / "staging")
    finally:
        PgLogicalHook.from_dsn(source_dsn).drop_slot(slot)


def test_direct_and_spark_paths_give_the_same_delta_tables(pg_server, spark, tmp_path, monkeypatch, caplog):
    rng = random.Random(7)
    slot = "delta_direct"
    with _source(pg_server, tmp_path, slot) as (source_dsn, uri):
        # Unique keys (direct), repeated keys (netted in process by the Arrow kernels), unique keys again.
        _workload(source_dsn, uri, slot, rng, (False, True, False))
        locations = {}
        for direct in (True, False):
            monkeypatch.setenv(ENV_SWITCH, "1" if direct else "0")
            location = DeltaLocation(str(tmp_path / f"lake-{direct}"))
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger=LOGGER):
                reports = apply_slot(spark, ApplyConfig(slot=slot, staging_root=uri), target=DeltaTarget(location, slot))
            assert [r.applied for r in reports] == [True] * 3
            straight = [r.getMessage() for r in caplog.records if "straight from the staged files" in r.getMessage()]
            if direct:  # not vacuous: the direct path ran, netting in process too, and not for the array table
                for table in ("plain", "full_id", "pk2"):
                    assert any(f"public.{table}:" in m for m in straight), table
                assert any("netted in this process" in m for m in straight)
                assert not any("public.arr:" in m for m in straight)
            else:
                assert straight == []
            locations[direct] = location
        for table in TABLES:
            assert lake_keys(locations[True], table) == source_keys(source_dsn, table), table
            assert lake_rows(locations[True], table) == lake_rows(locations[False], table), table


def test_a_delta_mirror_of_batches_the_direct_path_covers_starts_no_spark(pg_server, spark, tmp_path):
    rng = random.Random(11)
    slot = "delta_direct_nojvm"
    with _source(pg_server, tmp_path, slot) as (source_dsn, uri):
        _workload(source_dsn, uri, slot, rng, (False, False))
        started: list[bool] = []

        def start():
            started.append(True)
            return spark

        config = ApplyConfig(slot=slot, staging_root=uri,
                             tables={f"public.{t}": TableApplyConfig() for t in ("plain", "full_id", "pk2")})
        location = DeltaLocation(str(tmp_path / "lake"))
        reports = apply_slot(SparkOnDemand(start), config, target=DeltaTarget(location, slot))
        assert [r.applied for r in reports] == [True, True]
        assert started == []
        for table in ("plain", "full_id", "pk2"):
            assert lake_keys(location, table) == source_keys(source_dsn, table), table


def _schema(location: DeltaLocation, table: str) -> list[tuple[str, str]]:
    fields = DeltaTable(location.table_uri(f"public.{table}")).schema().to_arrow()
    return [(f.name, str(f.type)) for f in fields]


def test_a_filtered_delta_mirror_takes_the_same_rows_and_types_on_both_paths(pg_server, spark, tmp_path,
                                                                            monkeypatch, caplog):
    """Row filters (UPDATEs crossing them become INSERTs and DELETEs) and an unpublished action, applied per change
    in this process before the direct path's netting, give Spark's rows and Delta column types."""
    rng = random.Random(13)
    slot = "delta_direct_filtered"
    tables = {"public.plain": TableApplyConfig(row_filter="id % 3 <> 0 AND id > 5"),
              "public.full_id": TableApplyConfig(row_filter="id % 2 = 0", actions=("insert", "update")),
              "public.pk2": TableApplyConfig(row_filter="k1 > 3 OR k2 LIKE 'a%'")}
    with _source(pg_server, tmp_path, slot) as (source_dsn, uri):
        _workload(source_dsn, uri, slot, rng, (False, True))
        locations = {}
        for direct in (True, False):
            monkeypatch.setenv(ENV_SWITCH, "1" if direct else "0")
            location = DeltaLocation(str(tmp_path / f"lake-{direct}"))
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger=LOGGER):
                reports = apply_slot(spark, ApplyConfig(slot=slot, staging_root=uri, tables=tables),
                                     target=DeltaTarget(location, slot))
            assert [r.applied for r in reports] == [True] * 2
            straight = [r.getMessage() for r in caplog.records if "straight from the staged files" in r.getMessage()]
            if direct:  # not vacuous: every filtered table took the direct path
                for table in ("plain", "full_id", "pk2"):
                    assert any(f"public.{table}:" in m for m in straight), table
            locations[direct] = location
        for table in ("plain", "full_id", "pk2"):
            assert lake_rows(locations[True], table) == lake_rows(locations[False], table), table
            assert _schema(locations[True], table) == _schema(locations[False], table), table
        assert lake_rows(locations[True], "plain"), "the filter must leave rows"
