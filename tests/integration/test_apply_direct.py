"""The direct path (``apply/direct.py`` + ``apply/targets/postgres/arrownet.py``) and the Spark transforms give the
same target: random workloads drained in batches, applied once with the direct path allowed and once with
``PGLOGICAL_APPLY_DIRECT=0``, both compared with the source's tables (every column published, no filter)."""

from __future__ import annotations

import logging
import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import psycopg2
import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.direct import ENV_SWITCH, ROWS_SWITCH
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database, make_target, query
from scripts.harness.subscriber import drain_all

SCHEMA = """
CREATE TABLE plain (id int PRIMARY KEY, a int, b text, c numeric(12,2), d timestamptz, e float8, f boolean, g date,
                    h timestamp, i bigint);
CREATE TABLE full_id (id int PRIMARY KEY, v text, w numeric(10,3));
ALTER TABLE full_id REPLICA IDENTITY FULL;
CREATE TABLE arr (id int PRIMARY KEY, tags int[], t text);
CREATE TABLE pk2 (k1 int, k2 text, v int, PRIMARY KEY (k1, k2));
CREATE PUBLICATION pub_all FOR TABLE plain, full_id, arr, pk2;
"""
TEXTS = ["", "plain", "back\\slash", "tab\there", "line\nbreak", "cr\rx", "\\N", "quote'\"", "ünïcødé €", None]
FLOATS = [0.0, -0.0, 1.5, -2.25e-300, 1e20, 5e-324, float("nan"), float("inf"), float("-inf"), None]


def _plain_values(rng: random.Random, wild: bool) -> tuple:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    d = start + timedelta(seconds=rng.randint(-10**9, 10**9), microseconds=rng.randint(0, 999999))
    return (rng.choice([None, rng.randint(-2**31, 2**31 - 1)]), rng.choice(TEXTS),
            rng.choice([None, Decimal(rng.randint(-10**11, 10**11)) / 100]),
            "infinity" if wild else rng.choice([None, d]), rng.choice(FLOATS), rng.choice([None, True, False]),
            rng.choice([None, date(1, 1, 1) + timedelta(days=rng.randint(0, 3_000_000))]),
            rng.choice([None, d.replace(tzinfo=None)]), rng.choice([None, rng.randint(-2**63, 2**63 - 1)]))


def _round(cur, rng: random.Random, live: dict[str, set], next_id: list[int], *, wild: bool, repeat: bool) -> None:
    """One drained batch's worth of changes; every key changed at most once unless ``repeat``."""
    touched: dict[str, set] = {t: set() for t in live}

    def pick(table: str):
        free = sorted(live[table] - touched[table], key=repr)
        return rng.choice(free) if free else None

    def fresh() -> int:
        next_id[0] += 1
        return next_id[0]

    for _ in range(60):
        table = rng.choice(["plain", "full_id", "arr", "pk2"])
        action = rng.choice(["insert", "insert", "update", "update_key", "delete"])
        key = pick(table)
        if action != "insert" and key is None:
            action = "insert"
        if table == "pk2":
            if action == "insert":
                new = (fresh(), rng.choice(["a", "b\tc", "ü"]))
                cur.execute("INSERT INTO pk2 VALUES (%s, %s, %s)", (*new, rng.randint(0, 9)))
            elif action == "update":
                cur.execute("UPDATE pk2 SET v = v + 1 WHERE k1 = %s AND k2 = %s", key)
                new = key
            elif action == "update_key":
                new = (key[0], key[1] + "x")
                cur.execute("UPDATE pk2 SET k2 = %s WHERE k1 = %s AND k2 = %s", (new[1], *key))
            else:
                cur.execute("DELETE FROM pk2 WHERE k1 = %s AND k2 = %s", key)
                new = None
        else:
            if action == "insert":
                new = fresh()
                if table == "plain":
                    cur.execute("INSERT INTO plain VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                                (new, *_plain_values(rng, wild and rng.random() < 0.3)))
                elif table == "full_id":
                    cur.execute("INSERT INTO full_id VALUES (%s, %s, %s)",
                                (new, rng.choice(TEXTS), Decimal(rng.randint(-10**6, 10**6)) / 1000))
                else:
                    cur.execute("INSERT INTO arr VALUES (%s, %s, %s)", (new, [rng.randint(0, 9), None], rng.choice(TEXTS)))
            elif action in ("update", "update_key"):
                new = fresh() if action == "update_key" else key
                if table == "plain":
                    cur.execute("UPDATE plain SET id = %s, a = %s, b = %s, c = %s, d = %s, e = %s, f = %s, g = %s, "
                                "h = %s, i = %s WHERE id = %s", (new, *_plain_values(rng, False), key))
                else:
                    cur.execute(f"UPDATE {table} SET id = %s, {'v' if table == 'full_id' else 't'} = %s "  # noqa: S608
                                "WHERE id = %s", (new, rng.choice(TEXTS), key))
            else:
                cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,))  # noqa: S608 - the module's own names
                new = None
        if key is not None and action != "insert":
            live[table].discard(key)
            touched[table].add(key)
        if new is not None:
            live[table].add(new)
            if not repeat:
                touched[table].add(new)


def _rows(dsn: str, table: str) -> list[tuple]:
    """Rows as PostgreSQL's record text: NaN equals NaN there, and every stored value shows exactly."""
    order = "k1, k2" if table == "pk2" else "id"
    return query(dsn, f"SELECT t::text FROM {table} t ORDER BY {order}")  # noqa: S608 - the module's own names


@pytest.mark.parametrize("seed", [1, 2])
def test_direct_and_spark_paths_give_the_source_s_rows(pg_server, spark, tmp_path, monkeypatch, caplog, seed):
    rng = random.Random(seed)
    source = make_database(pg_server)
    source_dsn = pg_server.dsn(source)
    execute(source_dsn, SCHEMA)
    slot = f"direct{seed}"  # slots are server-wide
    PgLogicalHook.from_dsn(source_dsn).create_slot(slot)
    uri = str(tmp_path / "staging")
    try:
        live: dict[str, set] = {t: set() for t in ("plain", "full_id", "arr", "pk2")}
        next_id = [0]
        # Rounds: unique keys (direct), unique keys with out-of-range timestamps (plain falls back), repeated keys
        # (compaction: in process by apply/kernels.py, or Spark when the direct path is off), unique keys again.
        for wild, repeat in ((False, False), (True, False), (False, True), (False, False)):
            conn = psycopg2.connect(source_dsn)
            with conn, conn.cursor() as cur:
                _round(cur, rng, live, next_id, wild=wild, repeat=repeat)
            conn.close()
            assert drain_all(source_dsn, uri, slot=slot) == 1
        targets = {}
        for direct in (True, False):
            monkeypatch.setenv(ENV_SWITCH, "1" if direct else "0")
            _, dsn = make_target(pg_server)
            execute(dsn, SCHEMA.split("CREATE PUBLICATION")[0])
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="airflow_provider_pglogical.apply.targets.postgres.target"):
                reports = apply_slot(spark, ApplyConfig(slot=slot, staging_root=uri), dsn)
            assert [r.applied for r in reports] == [True] * 4
            straight = [r.getMessage() for r in caplog.records if "straight from the staged files" in r.getMessage()]
            if direct:  # not vacuous: the direct path ran, and not for the array table
                assert any("public.plain" in m for m in straight) and any("public.pk2" in m for m in straight)
                assert any("public.full_id" in m for m in straight)
                assert not any("public.arr" in m for m in straight)
            else:
                assert straight == []
            targets[direct] = dsn
        for table in live:
            expected = _rows(source_dsn, table)
            assert expected, table
            assert _rows(targets[True], table) == expected, table
            assert _rows(targets[False], table) == expected, table
    finally:
        PgLogicalHook.from_dsn(source_dsn).drop_slot(slot)


def test_batches_the_direct_path_covers_apply_without_spark_and_a_later_one_starts_it(pg_server, spark, tmp_path,
                                                                                      caplog, monkeypatch):
    """With the session on demand, the direct path's batches are printed and COPYed by this process (no session is
    started for them); the first batch that needs Spark's transforms (keys repeat, with netting in process switched
    off) starts it mid-run. Every table ends equal to the source. ``arr`` (arrays: Spark's text) is left out of the
    configuration."""
    monkeypatch.setenv(ROWS_SWITCH, "0")
    rng = random.Random(3)
    source = make_database(pg_server)
    source_dsn = pg_server.dsn(source)
    execute(source_dsn, SCHEMA)
    slot = "direct_on_demand"
    PgLogicalHook.from_dsn(source_dsn).create_slot(slot)
    uri = str(tmp_path / "staging")
    try:
        live: dict[str, set] = {t: set() for t in ("plain", "full_id", "arr", "pk2")}
        next_id = [0]
        for repeat in (False, False, True):
            conn = psycopg2.connect(source_dsn)
            with conn, conn.cursor() as cur:
                _round(cur, rng, live, next_id, wild=False, repeat=repeat)
            conn.close()
            assert drain_all(source_dsn, uri, slot=slot) == 1
        _, dsn = make_target(pg_server)
        execute(dsn, SCHEMA.split("CREATE PUBLICATION")[0])
        committed: list[int] = []
        started_after: list[int] = []

        def start():
            started_after.append(len(committed))
            return spark

        config = ApplyConfig(slot=slot, staging_root=uri,
                             tables={f"public.{t}": TableApplyConfig() for t in ("plain", "full_id", "pk2")})
        with caplog.at_level(logging.DEBUG, logger="airflow_provider_pglogical.apply.targets.postgres.target"):
            reports = apply_slot(SparkOnDemand(start), config, dsn, on_batch=lambda r: committed.append(r.end_lsn))
        assert [r.applied for r in reports] == [True] * 3
        assert started_after == [2]  # the two plain batches ran without a session; the third started it
        here = [r.getMessage() for r in caplog.records if "in this process" in r.getMessage()]
        assert {m.split(" of ")[1].split(" ")[0] for m in here} == {"public.plain", "public.full_id", "public.pk2"}
        for table in ("plain", "full_id", "pk2"):
            expected = _rows(source_dsn, table)
            assert expected, table
            assert _rows(dsn, table) == expected, table
    finally:
        PgLogicalHook.from_dsn(source_dsn).drop_slot(slot)
