"""Native-subscriber equivalence: the same scripted changes through CREATE SUBSCRIPTION and through drain → stage → Spark apply."""

from __future__ import annotations

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database, make_target, query
from scripts.harness.subscriber import drain_all, run_script, subscribe, unsubscribe, wait_for_subscriber

TABLES_SQL = """
CREATE TABLE rf_full (id int PRIMARY KEY, grp int, note text);
ALTER TABLE rf_full REPLICA IDENTITY FULL;
CREATE TABLE rf_key (id int PRIMARY KEY, grp int, note text);
CREATE TABLE rf_null (id int PRIMARY KEY, flag boolean, v text);
ALTER TABLE rf_null REPLICA IDENTITY FULL;
CREATE TABLE cols (id int PRIMARY KEY, a text, secret text, b int);
CREATE TABLE toasty (id int PRIMARY KEY, n int, body text);
ALTER TABLE toasty ALTER body SET STORAGE EXTERNAL;
CREATE TABLE toast_rf (id int PRIMARY KEY, n int, body text);
ALTER TABLE toast_rf ALTER body SET STORAGE EXTERNAL;
CREATE TABLE parent (id int PRIMARY KEY, name text);
CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent, v text);
CREATE TABLE seqd (id bigserial PRIMARY KEY, v text);
"""
TABLES = ("rf_full", "rf_key", "rf_null", "cols", "toasty", "toast_rf", "parent", "child", "seqd")
PUBLICATIONS_SQL = """
CREATE PUBLICATION pub_native FOR TABLE rf_full WHERE (grp >= 5), rf_key WHERE (id > 100), rf_null WHERE (flag),
    cols (id, a, b), toasty, toast_rf WHERE (id > 100), parent, child, seqd;
CREATE PUBLICATION pub_all FOR TABLE rf_full, rf_key, rf_null, cols, toasty, toast_rf, parent, child, seqd;
"""
# The same publication semantics as apply configs.
APPLY_TABLES = {
    "public.rf_full": TableApplyConfig(row_filter="grp >= 5"),
    "public.rf_key": TableApplyConfig(row_filter="id > 100"),
    "public.rf_null": TableApplyConfig(row_filter="flag"),
    "public.cols": TableApplyConfig(columns=("id", "a", "b")),
    "public.toasty": TableApplyConfig(),
    "public.toast_rf": TableApplyConfig(row_filter="id > 100", unchanged_toast="reject_and_continue"),
    "public.parent": TableApplyConfig(),
    "public.child": TableApplyConfig(),
    "public.seqd": TableApplyConfig(),
}


def table_rows(dsn: str, table: str) -> list[tuple]:
    return query(dsn, f"SELECT * FROM {table} ORDER BY 1")  # table names are this module's constants


PRE_EXISTING_SQL = """
INSERT INTO rf_key VALUES (500, 1, 'only on the source');
INSERT INTO parent VALUES (900, 'only on the source');
"""
# Each string is one source transaction; comments say which semantics it exercises.
BATCH_ONE = [
    # multi-table interleaved transaction
    """INSERT INTO rf_full VALUES (1, 1, 'a'), (2, 1, 'b'), (3, 7, 'c'), (4, 8, 'd');
       INSERT INTO parent VALUES (1, 'p1'), (2, 'p2');
       INSERT INTO rf_key VALUES (50, 1, 'x'), (150, 1, 'y'), (200, 1, 'z');
       INSERT INTO child VALUES (10, 1, 'c1'), (20, 2, 'c2');
       INSERT INTO rf_null VALUES (1, NULL, 'n'), (2, true, 't'), (3, false, 'f');
       INSERT INTO cols VALUES (1, 'a1', 's1', 1), (2, 'a2', 's2', 2);
       INSERT INTO toasty VALUES (1, 1, repeat('x', 9000)), (2, 1, repeat('y', 9000));
       INSERT INTO toast_rf VALUES (50, 1, repeat('z', 9000)), (120, 1, repeat('w', 9000));
       INSERT INTO seqd (v) VALUES ('s1'), ('s2'), ('s3');""",
    # the four UPDATE transform cases, REPLICA IDENTITY FULL, filter on a non-key column
    """UPDATE rf_full SET grp = 2 WHERE id = 1; UPDATE rf_full SET grp = 6 WHERE id = 2;
       UPDATE rf_full SET grp = 1 WHERE id = 3; UPDATE rf_full SET grp = 9, note = 'd2' WHERE id = 4;""",
    # REPLICA IDENTITY DEFAULT, filter on the key: transforms through key changes, and no old image
    """UPDATE rf_key SET id = 120 WHERE id = 50; UPDATE rf_key SET id = 60 WHERE id = 150;
       UPDATE rf_key SET id = 300 WHERE id = 200; UPDATE rf_key SET grp = 5 WHERE id = 120;
       UPDATE rf_key SET id = 70 WHERE id = 60;""",
    # NULL-valued filter results count as false
    """UPDATE rf_null SET flag = true WHERE id = 1; UPDATE rf_null SET flag = NULL WHERE id = 2;
       UPDATE rf_null SET v = 'f2' WHERE id = 3; INSERT INTO rf_null VALUES (4, NULL, 'dropped');""",
]
BATCH_TWO = [
    # column list: a change to an unlisted column still sends the listed ones
    """UPDATE cols SET secret = 's1b' WHERE id = 1; UPDATE cols SET a = 'a2b', b = 22 WHERE id = 2;
       DELETE FROM cols WHERE id = 1;""",
    # unchanged TOAST: plain update keeps the value, a key change carries it along
    """UPDATE toasty SET n = 2 WHERE id = 1; UPDATE toasty SET id = 3 WHERE id = 2;
       UPDATE toast_rf SET n = 2 WHERE id = 120;""",
    # updates and deletes of rows the targets never had (inserted before the slots existed)
    """UPDATE rf_key SET grp = 9 WHERE id = 500; DELETE FROM rf_key WHERE id = 500; DELETE FROM parent WHERE id = 900;""",
    # FK order within one transaction
    """DELETE FROM child WHERE id = 20; DELETE FROM parent WHERE id = 2;
       INSERT INTO parent VALUES (3, 'p3'); INSERT INTO child VALUES (30, 3, 'c3');""",
    # TRUNCATE ... CASCADE positioned among DML of the same transaction
    """INSERT INTO parent VALUES (4, 'void'); TRUNCATE parent CASCADE;
       INSERT INTO parent VALUES (5, 'p5'); INSERT INTO child VALUES (50, 5, 'c5');""",
    # TRUNCATE ... RESTART IDENTITY, then more rows
    """TRUNCATE seqd RESTART IDENTITY; INSERT INTO seqd (v) VALUES ('after');""",
]
# The stated deviation: a filtered UPDATE→INSERT whose unchanged TOAST value exists nowhere.
DEVIATION_SQL = "UPDATE toast_rf SET id = 150 WHERE id = 50;"


def test_spark_apply_matches_a_native_subscriber(pg_server, spark, tmp_path):
    source, native = make_database(pg_server), make_database(pg_server)
    _, ours = make_target(pg_server)
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, TABLES_SQL + PUBLICATIONS_SQL + PRE_EXISTING_SQL)
    execute(native_dsn, TABLES_SQL)
    # rf_full and rf_key are left to the apply to create from the staged relation schema.
    execute(ours, "".join(s + ";" for s in TABLES_SQL.split(";") if s.strip() and "rf_full" not in s
                          and "rf_key" not in s))
    subscribe(source_dsn, native_dsn)
    PgLogicalHook.from_dsn(source_dsn).create_slot("ours")
    uri = str(tmp_path / "staging")
    config = ApplyConfig(slot="ours", staging_root=uri, tables=APPLY_TABLES)
    try:
        run_script(source_dsn, BATCH_ONE)
        assert drain_all(source_dsn, uri) == 1
        run_script(source_dsn, BATCH_TWO + [DEVIATION_SQL])
        assert drain_all(source_dsn, uri) == 1
        assert [r.applied for r in apply_slot(spark, config, ours)] == [True, True]
        assert [r.applied for r in apply_slot(spark, config, ours)] == [False, False]  # re-apply: no-op
        wait_for_subscriber(source_dsn, native_dsn)
        for table in TABLES:
            if table == "toast_rf":
                continue
            assert table_rows(ours, table) == table_rows(native_dsn, table), table
        # Not vacuous: the transforms really happened on both sides.
        assert table_rows(native_dsn, "rf_full") == [(2, 6, "b"), (4, 9, "d2")]
        assert table_rows(native_dsn, "rf_key") == [(120, 5, "x"), (300, 1, "z")]
        assert table_rows(native_dsn, "rf_null") == [(1, True, "n")]
        assert table_rows(native_dsn, "toasty") == [(1, 2, "x" * 9000), (3, 1, "y" * 9000)]
        assert table_rows(native_dsn, "child") == [(50, 5, "c5")]
        seq = "SELECT last_value, is_called FROM seqd_id_seq"
        assert query(ours, seq) == query(native_dsn, seq)
        # The stated difference: native writes NULL for the value that exists nowhere, we reject.
        assert table_rows(native_dsn, "toast_rf") == [(120, 2, "w" * 9000), (150, 1, None)]
        assert table_rows(ours, "toast_rf") == [(120, 2, "w" * 9000)]
        assert query(ours, "SELECT table_name, key FROM pglogical_rejects") == [("public.toast_rf", {"id": 150})]
    finally:
        unsubscribe(native_dsn)
        execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{native}" WITH (FORCE)')
        execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{source}" WITH (FORCE)')
