"""Order-dependent batches against a native subscriber: FK re-pointing, freed/swapped unique values, key-change chains
with unchanged TOAST values, and a batch that fails even in commit order (test_native_equivalence.py's helpers)."""

from __future__ import annotations

import posixpath

import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.apply.batches import list_batches
from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.exceptions import ConstraintViolationError, format_lsn
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database, make_target, query
from scripts.harness.subscriber import drain_all, run_script, subscribe, unsubscribe, wait_for_subscriber

# 12.8 kB of md5 hex: not compressible enough to stay inline, and STORAGE EXTERNAL keeps it out of line anyway.
BIG = "(SELECT string_agg(md5('{seed}' || i), '') FROM generate_series(1, 400) i)"

TABLES_SQL = """
CREATE TABLE o_parent (id int PRIMARY KEY, name text);
CREATE TABLE o_child (id int PRIMARY KEY, parent_id int REFERENCES o_parent, v text);
CREATE TABLE o_uniq (id int PRIMARY KEY, email text UNIQUE, n int);
CREATE TABLE o_toast (id int PRIMARY KEY, n int, body text);
ALTER TABLE o_toast ALTER COLUMN body SET STORAGE EXTERNAL;
"""
PUBLICATIONS_SQL = """
CREATE PUBLICATION pub_native FOR TABLE o_parent, o_child, o_uniq, o_toast;
CREATE PUBLICATION pub_all FOR TABLE o_parent, o_child, o_uniq, o_toast;
"""
# Rows only the source has (written before any slot exists): changes to them are skipped natively.
SOURCE_ONLY_SQL = f"INSERT INTO o_toast VALUES (500, 0, {BIG.format(seed='s500')});"
CHAIN = 20  # o_uniq rows 1..CHAIN; a unique value handed down a chain that only one processing order satisfies
SETUP = [
    f"""INSERT INTO o_parent VALUES (1, 'p1'), (2, 'p2');
        INSERT INTO o_child VALUES (10, 1, 'c10'), (20, 2, 'c20');
        INSERT INTO o_uniq SELECT i, 'u' || i, 0 FROM generate_series(1, {CHAIN}) i;
        INSERT INTO o_uniq VALUES (100, 'x', 0), (101, 'y', 0);
        INSERT INTO o_toast VALUES (1, 0, {BIG.format(seed='t1')}), (10, 0, {BIG.format(seed='t10')});""",
]
# (a) one batch re-points a child to a new parent and deletes the old parent (interleaved across tables).
REPOINT = [
    "INSERT INTO o_parent VALUES (3, 'p3');",
    "UPDATE o_child SET parent_id = 3 WHERE id = 10;",
    "DELETE FROM o_parent WHERE id = 1;",
    "INSERT INTO o_child VALUES (30, 3, 'c30'); DELETE FROM o_child WHERE id = 20; DELETE FROM o_parent WHERE id = 2;",
]
# (b) unique values freed by an update or a delete and reused by another row in a later transaction: the top row
# frees its value first and each row below takes the one freed above it, so only one order of a set-based UPDATE works.
FREED = [
    f"UPDATE o_uniq SET email = 'free' WHERE id = {CHAIN};",
    *[f"UPDATE o_uniq SET email = 'u{i + 1}', n = n + 1 WHERE id = {i};" for i in range(CHAIN - 1, 0, -1)],
    "DELETE FROM o_uniq WHERE id = 2;",
    "INSERT INTO o_uniq VALUES (50, 'u3', 5);",
]
# (c) two rows swap unique values across transactions.
SWAP = [
    "UPDATE o_uniq SET email = 'tmp' WHERE id = 100;",
    "UPDATE o_uniq SET email = 'x' WHERE id = 101;",
    "UPDATE o_uniq SET email = 'y' WHERE id = 100;",
]
# (d) key-change chains whose unchanged (TOASTed, 'u') body lives in an earlier change of the batch, at the chain's
# first key in the target, or nowhere the targets have (a source-only row: natively both updates find no row).
CHAINS = [
    f"INSERT INTO o_toast VALUES (100, 0, {BIG.format(seed='t100')});",
    "UPDATE o_toast SET id = 101 WHERE id = 100;",
    "UPDATE o_toast SET n = 1 WHERE id = 101;",
    "UPDATE o_toast SET id = 102 WHERE id = 101;",
    "UPDATE o_toast SET id = 2 WHERE id = 1; UPDATE o_toast SET id = 3 WHERE id = 2;",
    "UPDATE o_toast SET id = 501 WHERE id = 500; UPDATE o_toast SET id = 502 WHERE id = 501;",
]
# (d') a single move of a target row whose body changed earlier in the batch: the target's body is stale.
MOVED_AFTER_UPDATE = [
    f"UPDATE o_toast SET body = {BIG.format(seed='t10b')} WHERE id = 10;",
    "UPDATE o_toast SET id = 11 WHERE id = 10;",
]


def lsn_now(dsn: str) -> int:
    return query(dsn, "SELECT (pg_current_wal_lsn() - '0/0')::bigint")[0][0]


def unchanged_toast_marks(uri: str, batch: int) -> int:
    """How many staged o_toast changes of a batch carry body as unchanged TOAST ('u')."""
    staged = list_batches(uri, "ours")[batch]
    files = [posixpath.join(staged.ref.path, f) for f in staged.table_files["public.o_toast"]]
    return sum("body" in r["new_unchanged_toast"] for f in files for r in pq.read_table(f).to_pylist())


def snapshot(dsn: str) -> dict[str, list[tuple]]:
    return {
        "o_parent": query(dsn, "SELECT * FROM o_parent ORDER BY id"),
        "o_child": query(dsn, "SELECT * FROM o_child ORDER BY id"),
        "o_uniq": query(dsn, "SELECT * FROM o_uniq ORDER BY id"),
        "o_toast": query(dsn, "SELECT id, n, md5(body), length(body) FROM o_toast ORDER BY id"),
    }


@pytest.fixture
def databases(pg_server):
    source, native = make_database(pg_server), make_database(pg_server)
    _, ours = make_target(pg_server)
    try:
        yield pg_server.dsn(source), pg_server.dsn(native), ours
    finally:
        for name in (native, source):
            execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_order_dependent_batches_match_a_native_subscriber(databases, spark, tmp_path):
    source_dsn, native_dsn, ours = databases
    execute(source_dsn, TABLES_SQL + PUBLICATIONS_SQL + SOURCE_ONLY_SQL)
    execute(native_dsn, TABLES_SQL)
    execute(ours, TABLES_SQL)
    subscribe(source_dsn, native_dsn)
    PgLogicalHook.from_dsn(source_dsn).create_slot("ours")
    uri = str(tmp_path / "staging")
    try:
        for script in (SETUP, REPOINT, FREED, SWAP, CHAINS, MOVED_AFTER_UPDATE):  # one batch each
            run_script(source_dsn, script)
            assert drain_all(source_dsn, uri) == 1
        assert (unchanged_toast_marks(uri, 4), unchanged_toast_marks(uri, 5)) == (7, 1)  # really TOASTed
        reports = apply_slot(spark, ApplyConfig(slot="ours", staging_root=uri), ours)
        assert [r.applied for r in reports] == [True] * 6
        wait_for_subscriber(source_dsn, native_dsn)
        got, want = snapshot(ours), snapshot(native_dsn)
        for table in want:
            assert got[table] == want[table], table
        # Not vacuous: the native results are the interesting ones, and every scenario but the setup needed order.
        assert want["o_child"] == [(10, 3, "c10"), (30, 3, "c30")] and want["o_parent"] == [(3, "p3")]
        assert [r for r in want["o_uniq"] if r[0] in (1, 3, 50, 100, 101, CHAIN)] == [
            (1, "u2", 1), (3, "u4", 1), (CHAIN, "free", 0), (50, "u3", 5), (100, "y", 0), (101, "x", 0)]
        bodies = {r[0]: r[2] for r in want["o_toast"]}
        assert sorted(bodies) == [3, 11, 102] and len(set(bodies.values())) == 3
        assert query(source_dsn, "SELECT id, md5(body) FROM o_toast WHERE id IN (11, 102) ORDER BY id") == \
            [(11, bodies[11]), (102, bodies[102])]
        assert [r.ordered for r in reports] == [False, True, True, True, True, True]
        assert query(ours, "SELECT count(*) FROM pglogical_rejects") == [(0,)]
        assert query(ours, "SELECT count(*) FROM pg_tables WHERE tablename LIKE '\\_pglogical\\_stg\\_%'") == [(0,)]
        assert [r.applied for r in apply_slot(spark, ApplyConfig(slot="ours", staging_root=uri), ours)] == [False] * 6
    finally:
        unsubscribe(native_dsn)


def test_a_batch_that_fails_even_in_commit_order_changes_nothing(databases, spark, tmp_path):
    source_dsn, _, ours = databases
    execute(source_dsn, TABLES_SQL + PUBLICATIONS_SQL)
    execute(ours, TABLES_SQL, "CREATE UNIQUE INDEX o_uniq_n_target_only ON o_uniq (n)")  # the source has no such rule
    PgLogicalHook.from_dsn(source_dsn).create_slot("ours")
    uri = str(tmp_path / "staging")
    run_script(source_dsn, ["INSERT INTO o_uniq VALUES (1, 'a', 1), (2, 'b', 2);"])
    drain_all(source_dsn, uri)
    (first,) = list_batches(uri, "ours")
    run_script(source_dsn, ["UPDATE o_uniq SET n = 9 WHERE id = 1;", "UPDATE o_uniq SET email = 'c' WHERE id = 2;"])
    before = lsn_now(source_dsn)
    run_script(source_dsn, ["UPDATE o_uniq SET n = 9 WHERE id = 2;"])  # the change that breaks the target-only rule
    after = lsn_now(source_dsn)
    drain_all(source_dsn, uri)
    with pytest.raises(ConstraintViolationError) as info:
        apply_slot(spark, ApplyConfig(slot="ours", staging_root=uri), ours)
    err = info.value
    assert (err.table, err.constraint, err.sqlstate) == ("public.o_uniq", "o_uniq_n_target_only", "23505")
    assert before <= err.lsn < after and format_lsn(err.lsn) in str(err) and "o_uniq_n_target_only" in str(err)
    assert "'c'" not in str(err) and "(9)" not in str(err)  # no row values
    assert err.__cause__ is None and err.__suppress_context__
    assert query(ours, "SELECT * FROM o_uniq ORDER BY id") == [(1, "a", 1), (2, "b", 2)]
    assert query(ours, "SELECT (end_lsn - '0/0')::bigint FROM pglogical_progress") == [(first.end_lsn,)]
    assert query(ours, "SELECT count(*) FROM pg_tables WHERE tablename LIKE '\\_pglogical\\_stg\\_%'") == [(0,)]
