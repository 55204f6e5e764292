"""The lake mirrors' direct path (``apply/targets/lake/direct.py``) and Spark's net frame give the same Delta and
Iceberg tables: random workloads drained in batches, applied once with the direct path allowed and once with
``PGLOGICAL_APPLY_DIRECT=0`` (the reference), both read back with the lake's own reader (deltalake, pyiceberg) and
compared with each other — rows bit for bit, column types — and with the source. One loop (``both_ways``) serves
both lakes; each test runs for each."""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_pglogical.apply import partitioned
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.direct import ENV_SWITCH
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.targets.base import DirectNet
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from airflow_provider_pglogical.apply.targets.lake import parts as lake_parts
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import drain_all, wait_for_subscriber
from tests.integration.test_apply_direct import SCHEMA, _round
from tests.support.exact import exact

TABLES = ("plain", "full_id", "arr", "pk2")
KEYS = {"pk2": ("k1", "k2")}
LOGGER = "airflow_provider_pglogical.apply.targets.lake.net"
STRAIGHT = "straight from the staged files"


@dataclass(frozen=True)
class Lake:
    """One lake target as these tests make and read it."""

    name: str
    make: Callable[[Path, str], Any]  # (root, slot) → the target
    read: Callable[[Any, str], pa.Table]  # (target, "public.<table>") → its rows
    types: Callable[[Any, str], list[tuple[str, str]]]  # (target, "public.<table>") → (column, type) in order


def _delta(root: Path, slot: str) -> DeltaTarget:
    return DeltaTarget(DeltaLocation(str(root)), slot)


def _delta_table(target: DeltaTarget, table: str) -> DeltaTable:
    return DeltaTable(target.location.table_uri(table))


def _iceberg(root: Path, slot: str) -> IcebergTarget:
    root.mkdir(parents=True, exist_ok=True)
    return IcebergTarget(IcebergLocation({"type": "sql", "uri": f"sqlite:///{root}/catalog.db",
                                          "warehouse": str(root / "warehouse")}), slot)


def _iceberg_table(target: IcebergTarget, table: str) -> Any:
    found = target.open(table)
    assert found is not None, table
    return found


LAKES = {
    "delta": Lake("delta", _delta, lambda t, n: _delta_table(t, n).to_pyarrow_table(),
                  lambda t, n: [(f.name, str(f.type)) for f in _delta_table(t, n).schema().to_arrow()]),
    "iceberg": Lake("iceberg", _iceberg, lambda t, n: _iceberg_table(t, n).scan().to_arrow(),
                    lambda t, n: [(f.name, f"{f.field_type} {f.doc}") for f in _iceberg_table(t, n).schema().fields]),
}


@pytest.fixture(params=sorted(LAKES))
def lake(request) -> Lake:
    return LAKES[request.param]


def lake_rows(lake: Lake, target: Any, table: str) -> list[tuple]:
    return sorted((tuple(exact(v) for v in r.values()) for r in lake.read(target, f"public.{table}").to_pylist()),
                  key=repr)


def lake_keys(lake: Lake, target: Any, table: str) -> list[tuple]:
    data = lake.read(target, f"public.{table}")
    return sorted((tuple(r[k] for k in KEYS.get(table, ("id",))) for r in data.to_pylist()), key=repr)


def source_keys(dsn: str, table: str) -> list[tuple]:
    key = ", ".join(KEYS.get(table, ("id",)))
    return sorted(query(dsn, f"SELECT {key} FROM {table}"), key=repr)  # noqa: S608 - the module's own names


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
def _source(pg_server, tmp_path, slot: str, schema: str = SCHEMA,
            publication: str = "pub_all") -> Iterator[tuple[str, str]]:
    """A source database with ``schema`` and a slot; yields its DSN and the staging root."""
    source_dsn = pg_server.dsn(make_database(pg_server))
    execute(source_dsn, schema)
    PgLogicalHook.from_dsn(source_dsn).create_slot(slot)
    try:
        yield source_dsn, str(tmp_path / "staging")
    finally:
        PgLogicalHook.from_dsn(source_dsn).drop_slot(slot)


@pytest.fixture(scope="module")
def staged(pg_server, tmp_path_factory) -> Iterator[Callable[..., tuple[str, str]]]:
    """``(slot, schema, fill, tmp_path)`` → the source's DSN and a copy (under ``tmp_path``) of the batches ``fill``
    staged from a source with ``schema``: each workload is made and drained once per module, and every lake's test
    of it applies its own copy (an apply records its targets in the staging root)."""
    made: dict[str, tuple[str, str]] = {}
    with ExitStack() as stack:
        def get(slot: str, schema: str, fill: Callable[[str, str], None], tmp_path: Path) -> tuple[str, str]:
            if slot not in made:  # cached once filled: a failed fill fails every test of the workload
                filled = stack.enter_context(_source(pg_server, tmp_path_factory.mktemp(slot), slot, schema))
                fill(*filled)
                made[slot] = filled
            source_dsn, uri = made[slot]
            return source_dsn, shutil.copytree(uri, tmp_path / "staging").as_posix()

        yield get


@dataclass
class BothWays:
    """The two applies of one staged workload: the targets and the tables whose net rows came straight from the
    staged files, by whether the direct path was allowed."""

    targets: dict[bool, Any]
    straight: dict[bool, set[str]]


def both_ways(lake: Lake, spark, tmp_path: Path, monkeypatch, caplog, config: ApplyConfig, batches: int) -> BothWays:
    """``config``'s staged batches applied into two new ``lake`` targets: with the direct path allowed, then with
    ``PGLOGICAL_APPLY_DIRECT=0`` (Spark's net frame for every table-batch)."""
    out = BothWays({}, {})
    for direct in (True, False):
        monkeypatch.setenv(ENV_SWITCH, "1" if direct else "0")
        target = lake.make(tmp_path / f"{lake.name}-{direct}", config.slot)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            reports = apply_slot(spark, config, target=target)
        assert [r.applied for r in reports] == [True] * batches
        messages = [r.getMessage() for r in caplog.records if STRAIGHT in r.getMessage()]
        out.straight[direct] = {m.split(":", 1)[0].removeprefix("public.") for m in messages}
        if direct and any("netted in this process" in m for m in messages):
            out.straight[direct].add("(netted in this process)")
        out.targets[direct] = target
    assert out.straight[False] == set()  # the reference never reads the staged files itself
    return out


def test_direct_and_spark_paths_give_the_same_lake_tables(lake, staged, spark, tmp_path, monkeypatch, caplog):
    slot = "direct"
    # Unique keys (direct), repeated keys (netted in process by the Arrow kernels), unique keys again.
    source_dsn, uri = staged(slot, SCHEMA, lambda dsn, root: _workload(dsn, root, slot, random.Random(7),
                                                                       (False, True, False)), tmp_path)
    got = both_ways(lake, spark, tmp_path, monkeypatch, caplog, ApplyConfig(slot=slot, staging_root=uri), 3)
    # Not vacuous: the direct path ran, netting in process too, and not for the array table.
    assert got.straight[True] == {"plain", "full_id", "pk2", "(netted in this process)"}
    for table in TABLES:
        assert lake_keys(lake, got.targets[True], table) == source_keys(source_dsn, table), table
        assert lake_rows(lake, got.targets[True], table) == lake_rows(lake, got.targets[False], table), table
        assert lake.types(got.targets[True], f"public.{table}") == lake.types(got.targets[False],
                                                                              f"public.{table}"), table


def test_a_lake_mirror_of_batches_the_direct_path_covers_starts_no_spark(lake, staged, spark, tmp_path):
    slot = "direct_nojvm"
    source_dsn, uri = staged(slot, SCHEMA, lambda dsn, root: _workload(dsn, root, slot, random.Random(11),
                                                                       (False, True)), tmp_path)
    started: list[bool] = []

    def start():
        started.append(True)
        return spark

    config = ApplyConfig(slot=slot, staging_root=uri,
                         tables={f"public.{t}": TableApplyConfig() for t in ("plain", "full_id", "pk2")})
    target = lake.make(tmp_path / "lake", slot)
    reports = apply_slot(SparkOnDemand(start), config, target=target)
    assert [r.applied for r in reports] == [True, True]
    assert started == []
    for table in ("plain", "full_id", "pk2"):
        assert lake_keys(lake, target, table) == source_keys(source_dsn, table), table


def test_a_lake_mirror_applies_a_table_batch_wholly_before_its_truncate_without_spark(lake, staged, spark, tmp_path):
    """A batch of rows, then one whose every change of the table precedes its TRUNCATE: no change counts, the net
    frame is empty but typed, and the lake empties the table in its commit without starting Spark."""
    slot = "direct_truncated"

    def fill(source_dsn: str, uri: str) -> None:
        for statements in ("INSERT INTO plain (id, a, b) VALUES (1, 1, 'a'), (2, 2, 'b')",
                           "BEGIN; INSERT INTO plain (id, a, b) VALUES (3, 3, 'c'); UPDATE plain SET a = 4 WHERE id = 1; "
                           "TRUNCATE plain; COMMIT"):
            execute(source_dsn, statements)
            assert drain_all(source_dsn, uri, slot=slot) == 1

    source_dsn, uri = staged(slot, SCHEMA, fill, tmp_path)
    started: list[bool] = []

    def start():
        started.append(True)
        return spark

    target = lake.make(tmp_path / "lake", slot)
    config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.plain": TableApplyConfig()})
    reports = apply_slot(SparkOnDemand(start), config, target=target)
    assert [r.applied for r in reports] == [True, True]
    assert started == []
    assert lake_keys(lake, target, "plain") == source_keys(source_dsn, "plain") == []


def test_a_lake_mirror_starts_spark_mid_run_for_a_batch_the_direct_path_does_not_cover(lake, staged, spark,
                                                                                       tmp_path):
    """Two batches the direct path covers, then one of an array table (a type only Spark reads): Spark starts once,
    for the third batch, after the first two were applied without it, and every table matches the source."""
    slot = "direct_then_spark"

    def fill(source_dsn: str, uri: str) -> None:
        for statements in ("INSERT INTO plain (id, a, b) VALUES (1, 1, 'a'), (2, 2, 'b'); "
                           "INSERT INTO full_id VALUES (1, 'x', 1.5); INSERT INTO pk2 VALUES (1, 'a', 1)",
                           "UPDATE plain SET a = 3 WHERE id = 1; DELETE FROM full_id WHERE id = 1; "
                           "INSERT INTO full_id VALUES (2, 'y', 2.5); UPDATE pk2 SET k2 = 'b' WHERE k1 = 1",
                           "INSERT INTO arr VALUES (1, '{1,NULL}', 't'), (2, '{}', NULL)"):
            execute(source_dsn, statements)
            assert drain_all(source_dsn, uri, slot=slot) == 1

    source_dsn, uri = staged(slot, SCHEMA, fill, tmp_path)
    target = lake.make(tmp_path / "lake", slot)
    started: list[bool] = []
    plain_when_started: list[list[tuple]] = []

    def start():
        started.append(True)
        plain_when_started.append(lake_keys(lake, target, "plain"))
        return spark

    config = ApplyConfig(slot=slot, staging_root=uri, tables={f"public.{t}": TableApplyConfig() for t in TABLES})
    reports = apply_slot(SparkOnDemand(start), config, target=target)
    assert [r.applied for r in reports] == [True, True, True]
    assert started == [True]
    assert plain_when_started == [[(1,), (2,)]]  # the direct batches were applied before Spark started
    for table in TABLES:
        assert lake_keys(lake, target, table) == source_keys(source_dsn, table), table


def test_a_filtered_lake_mirror_takes_the_same_rows_and_types_on_both_paths(lake, staged, spark, tmp_path,
                                                                            monkeypatch, caplog):
    """Row filters (UPDATEs crossing them become INSERTs and DELETEs) and an unpublished action, applied per change
    in this process before the direct path's netting, give Spark's rows and the lake's column types."""
    slot = "direct_filtered"
    tables = {"public.plain": TableApplyConfig(row_filter="id % 3 <> 0 AND id > 5"),
              "public.full_id": TableApplyConfig(row_filter="id % 2 = 0", actions=("insert", "update")),
              "public.pk2": TableApplyConfig(row_filter="k1 > 3 OR k2 LIKE 'a%'")}
    _, uri = staged(slot, SCHEMA, lambda dsn, root: _workload(dsn, root, slot, random.Random(13), (False, True)),
                    tmp_path)
    got = both_ways(lake, spark, tmp_path, monkeypatch, caplog,
                    ApplyConfig(slot=slot, staging_root=uri, tables=tables), 2)
    assert {"plain", "full_id", "pk2"} <= got.straight[True]  # not vacuous: every filtered table went direct
    for table in ("plain", "full_id", "pk2"):
        assert lake_rows(lake, got.targets[True], table) == lake_rows(lake, got.targets[False], table), table
        assert lake.types(got.targets[True], f"public.{table}") == lake.types(got.targets[False],
                                                                              f"public.{table}"), table
    assert lake_rows(lake, got.targets[True], "plain"), "the filter must leave rows"


# Per source type: (SQL type, three values as SQL literals). The first group's staged Arrow types are
# ``lake/direct.flat_type`` (read straight from the staged files): they share one table, a column per type
# (``v_<type>``), so the direct path reading that table shows it reads every one of them, and one Spark table-batch
# per batch gives the reference values of all of them (each column is compared on its own). The second group's go
# through Spark: a table per type, each showing that its type alone sends its table to Spark.
DIRECT_TYPES: Mapping[str, tuple[str, tuple[str, str, str]]] = {
    "t_int2": ("smallint", ("-32768", "32767", "NULL")),
    "t_int4": ("integer", ("-2147483648", "7", "NULL")),
    "t_int8": ("bigint", ("-9223372036854775808", "9223372036854775807", "NULL")),
    "t_oid": ("oid", ("'4294967295'", "'0'", "NULL")),
    "t_float4": ("real", ("'NaN'", "'-0'", "'-Infinity'")),
    "t_float8": ("double precision", ("5e-324", "'-0'", "'Infinity'")),
    "t_bool": ("boolean", ("true", "false", "NULL")),
    "t_text": ("text", ("'ünïcødé €'", "''", "NULL")),
    "t_varchar": ("varchar(5)", ("'abcde'", "'tab\t'", "NULL")),
    "t_char": ('"char"', ("'a'", "' '", "NULL")),
    "t_bytea": ("bytea", ("'\\x00ff'::bytea", "''::bytea", "NULL")),
    "t_numeric": ("numeric(12,2)", ("-9999999999.99", "0.01", "NULL")),
    "t_numeric38": ("numeric(38,10)", ("1234567890123456789012345678.0123456789", "-1e-10", "NULL")),
    "t_numeric_free": ("numeric", ("123456789012345678901234567890.123456789", "-0.5", "NULL")),
    "t_date": ("date", ("'0001-01-01'", "'9999-12-31'", "NULL")),
    "t_timestamp": ("timestamp", ("'1900-01-01 00:00:00.000001'", "'2026-11-27 05:25:00'", "NULL")),
    "t_timestamptz": ("timestamptz", ("'1970-01-01 00:00:00+00'", "'2026-11-27 05:25:00.5+05:30'", "NULL")),
    "t_pg_lsn": ("pg_lsn", ("'FFFFFFFF/FFFFFFFF'", "'16/B374D848'", "NULL")),
    "t_money": ("money", ("'-92233720368547758.08'", "'12.34'", "NULL")),
    "t_uuid": ("uuid", ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'", "NULL")),
    "t_jsonb": ("jsonb", ("'{\"a\": [1, null]}'", "'null'", "NULL")),
    "t_inet": ("inet", ("'10.0.0.1/8'", "'::1'", "NULL")),
}
SPARK_TYPES: Mapping[str, tuple[str, tuple[str, str, str]]] = {
    "t_time": ("time", ("'24:00:00'", "'12:34:56.789'", "NULL")),
    "t_timetz": ("timetz", ("'12:00:00+05:30'", "'00:00:00-12'", "NULL")),
    "t_interval": ("interval", ("'1 day 2 hours'", "'-1 month'", "NULL")),
    "t_numeric50": ("numeric(50,2)", ("123456789012345678901234567890123456789012345678.99", "0", "NULL")),
    "t_int_array": ("int[]", ("'{1,2,NULL}'", "'{}'", "NULL")),
    "t_text_array": ("text[]", ("'{a,\"b c\"}'", "'{NULL}'", "NULL")),
}
DIRECT_TABLE = "t_direct"


def _column(name: str) -> str:
    return f"v_{name.removeprefix('t_')}"


TYPE_TABLES = (DIRECT_TABLE, *SPARK_TYPES)
TYPES_SCHEMA = (f"CREATE TABLE {DIRECT_TABLE} (id int PRIMARY KEY, "
                + ", ".join(f"{_column(name)} {sql}" for name, (sql, _) in DIRECT_TYPES.items()) + ");\n"
                + "".join(f"CREATE TABLE {name} (id int PRIMARY KEY, v {sql});\n"
                          for name, (sql, _) in SPARK_TYPES.items())
                + f"CREATE PUBLICATION pub_all FOR TABLE {', '.join(TYPE_TABLES)};\n")


def _per_table(which: int) -> dict[str, str]:
    """Each type table's ``which``-th value of each of its columns, as ``col = value, ...`` (or a VALUES list)."""
    out = {DIRECT_TABLE: ", ".join(f"{_column(n)} = {values[which]}" for n, (_, values) in DIRECT_TYPES.items())}
    out.update({name: f"v = {values[which]}" for name, (_, values) in SPARK_TYPES.items()})
    return out


def _values(which: int) -> dict[str, str]:
    """Each type table's ``which``-th values in column order, for an INSERT."""
    out = {DIRECT_TABLE: ", ".join(values[which] for _, values in DIRECT_TYPES.values())}
    out.update({name: values[which] for name, (_, values) in SPARK_TYPES.items()})
    return out


def type_columns(lake: Lake, target: Any) -> dict[str, tuple[list[tuple], str]]:
    """Per source type: its column's (id, value) pairs, bit for bit, and the column's lake type."""
    out = {}
    for table in TYPE_TABLES:
        data = lake.read(target, f"public.{table}").to_pylist()
        types = dict(lake.types(target, f"public.{table}"))
        names = {_column(n): n for n in DIRECT_TYPES} if table == DIRECT_TABLE else {"v": table}
        for column, name in names.items():
            out[name] = (sorted(((r["id"], exact(r[column])) for r in data), key=lambda pair: pair[0]), types[column])
    return out


def test_each_type_the_direct_path_reads_gives_spark_s_values_and_lake_type(lake, staged, spark, tmp_path,
                                                                            monkeypatch, caplog):
    """Per source type: inserts, an update, a key change and a delete, then repeated changes of one key ending in a
    key change (netted in this process), applied both ways give the same values and the same lake column type;
    exactly the types whose staged Arrow values are what Spark's read gives after the lake's conversion
    (``lake/direct.flat_type``) are read straight from the staged files."""
    slot = "direct_types"
    first, second, third = _values(0), _values(1), _values(2)

    def fill(source_dsn: str, uri: str) -> None:
        conn = psycopg2.connect(source_dsn)
        with conn, conn.cursor() as cur:
            for name in TYPE_TABLES:
                cur.execute(f"INSERT INTO {name} VALUES (1, {first[name]}), (2, {second[name]}), "
                            f"(3, {third[name]}), (4, {first[name]})")
        conn.close()
        assert drain_all(source_dsn, uri, slot=slot) == 1
        conn = psycopg2.connect(source_dsn)
        with conn, conn.cursor() as cur:
            for name in TYPE_TABLES:
                cur.execute(f"UPDATE {name} SET {_per_table(1)[name]} WHERE id = 1")
                cur.execute(f"UPDATE {name} SET id = 30 WHERE id = 3")
                cur.execute(f"DELETE FROM {name} WHERE id = 2")
                cur.execute(f"INSERT INTO {name} VALUES (5, {third[name]})")
        conn.close()
        assert drain_all(source_dsn, uri, slot=slot) == 1
        conn = psycopg2.connect(source_dsn)
        with conn, conn.cursor() as cur:  # repeated keys: netted in this process; the key change carries a value
            for name in TYPE_TABLES:
                cur.execute(f"UPDATE {name} SET {_per_table(1)[name]} WHERE id = 4")
                cur.execute(f"UPDATE {name} SET {_per_table(0)[name]} WHERE id = 4")
                cur.execute(f"UPDATE {name} SET id = 40 WHERE id = 4")
        conn.close()
        assert drain_all(source_dsn, uri, slot=slot) == 1

    _, uri = staged(slot, TYPES_SCHEMA, fill, tmp_path)
    got = both_ways(lake, spark, tmp_path, monkeypatch, caplog, ApplyConfig(slot=slot, staging_root=uri), 3)
    assert got.straight[True] == {DIRECT_TABLE, "(netted in this process)"}
    direct, reference = type_columns(lake, got.targets[True]), type_columns(lake, got.targets[False])
    assert sorted(direct) == sorted(reference) == sorted({**DIRECT_TYPES, **SPARK_TYPES})
    for table in TYPE_TABLES:  # every column's lake type, in order, the key's too
        assert lake.types(got.targets[True], f"public.{table}") == lake.types(got.targets[False],
                                                                              f"public.{table}"), table
    for name in direct:
        assert direct[name] == reference[name], name
        assert [i for i, _ in direct[name][0]] == [1, 5, 30, 40], name


def test_a_batch_above_the_bounds_reaches_each_lake_in_key_partitions_like_a_native_subscriber(
        pg_server, tmp_path, monkeypatch) -> None:
    """``test_partitioned_inprocess_native``'s filtered REPLICA IDENTITY FULL batch (UPDATEs crossing the filter, rows
    updated twice, key changes moved twice, deletes), netted in this process in key partitions (the bounds set low)
    and streamed into one commit of each lake without a JVM: each lake holds the native subscriber's rows."""
    from tests.integration.test_native_parity import native_and_ours
    from tests.integration.test_partitioned_inprocess_native import BOUNDS, SCHEMA, SETUP, WORKLOAD
    from tests.support.parity import source_with_slot

    for name, value in BOUNDS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(partitioned.SPILL_SWITCH, str(tmp_path / "spill"))
    (tmp_path / "spill").mkdir()
    streamed: list[int] = []
    spilled = lake_parts.spilled

    @contextmanager
    def counting(net: DirectNet, columns: Sequence[str]) -> Iterator[lake_parts.SpilledNet]:
        with spilled(net, columns) as parts:
            streamed.append(len(parts.paths) if not parts.summary.needs_collected else 0)
            yield parts

    monkeypatch.setattr(lake_parts, "spilled", counting)

    def no_spark() -> object:
        pytest.fail("the lake asked for Spark")

    columns = ["id", "a", "b", "c", "d", "u"]
    with source_with_slot(pg_server, SETUP) as (src, slot), \
            native_and_ours(pg_server, src, slot, SCHEMA, "pub_native") as (native_db, _):
        execute(src, ";".join(WORKLOAD))  # one session: the temporary table lives through the statements
        uri = str(tmp_path / "staging")
        assert drain_all(src, uri, slot=slot) == 1
        config = ApplyConfig(slot=slot, staging_root=uri,
                             tables={"public.big": TableApplyConfig(row_filter="a % 2 = 0")})
        targets = {}
        for name, lake in LAKES.items():
            targets[name] = lake.make(tmp_path / name, slot)
            (report,) = apply_slot(SparkOnDemand(no_spark), config, target=targets[name])
            assert report.applied
        wait_for_subscriber(src, native_db, name=f"n_{slot}")
        native = query(native_db, f"SELECT {', '.join(columns)} FROM big ORDER BY id")  # noqa: S608 - own names
        assert len(native) > 2_000
        for name, lake in LAKES.items():
            data = lake.read(targets[name], "public.big").select(columns).sort_by("id")
            assert [tuple(r.values()) for r in data.to_pylist()] == native, name
    assert len(streamed) == 2 and min(streamed) >= 6  # both lakes took the batch in key partitions
    assert list((tmp_path / "spill").iterdir()) == []
