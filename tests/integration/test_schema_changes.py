"""Source schema changes through drain → stage → Spark apply: followed in the batch's transaction, or a clear stop."""

from __future__ import annotations

from contextlib import ExitStack
from datetime import date
from decimal import Decimal

import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.exceptions import SchemaChangeError
from scripts.harness.pgserver import execute, make_target, query
from scripts.harness.subscriber import drain_all, run_script, wait_for_subscriber
from tests.support.parity import source_with_slot
from tests.support.schema import (
    REPRO_BATCH,
    REPRO_EXPECTED,
    REPRO_FIRST,
    REPRO_NATIVE,
    REPRO_SETUP,
    added_and_dropped,
    native_rows,
    random_interleaving,
    source_and_native,
)

TABLES = ("t_between", "t_inside", "t_default", "t_default_in", "t_narrow", "t_rename")


def columns(dsn: str, table: str) -> list[tuple]:
    return query(dsn, "SELECT column_name, format_type(atttypid, atttypmod), attnotnull FROM information_schema.columns "
                      "JOIN pg_attribute ON attrelid = (table_schema || '.' || table_name)::regclass "
                      "AND attname = column_name WHERE table_name = %s ORDER BY ordinal_position", params=(table,))


def table_rows(dsn: str, table: str, cols: str) -> list[tuple]:
    return query(dsn, f"SELECT {cols} FROM {table} ORDER BY 1")  # module constants only


@pytest.fixture
def pipeline(pg_server, tmp_path):
    """``start(sql)`` → (source DSN, slot, target DSN, staging URI); ``sql`` runs on the source before the slot."""
    with ExitStack() as stack:
        def start(sql: str) -> tuple[str, str, str, str]:
            src, slot = stack.enter_context(source_with_slot(pg_server, sql))
            return src, slot, make_target(pg_server)[1], str(tmp_path / "staging")

        yield start


def test_add_drop_widen_narrow_and_rename_are_followed_between_and_inside_batches(spark, pipeline):
    """Each change between batches (the ALTER before the batch's rows) and inside one (rows before and after)."""
    src, slot, ours, uri = pipeline("""
        CREATE TABLE t_between (id int PRIMARY KEY, a int, v varchar(5), z int);
        CREATE TABLE t_inside (id int PRIMARY KEY, x text NOT NULL, n numeric(6,2));
        CREATE TABLE t_default (id int PRIMARY KEY);
        CREATE TABLE t_default_in (id int PRIMARY KEY, s text);
        CREATE TABLE t_narrow (id int PRIMARY KEY, big bigint, wide numeric(10,2));
        CREATE TABLE t_rename (id int PRIMARY KEY, a text, b int);
        CREATE PUBLICATION pub_all FOR TABLE t_between, t_inside, t_default, t_default_in, t_narrow, t_rename;""")
    # Created by hand with NOT NULL (a table the apply creates has no NOT NULL but its key).
    execute(ours, "CREATE TABLE t_inside (id int PRIMARY KEY, x text NOT NULL, n numeric(6,2))")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={f"public.{t}": TableApplyConfig() for t in TABLES})
    run_script(src, [
        "INSERT INTO t_between VALUES (1, 10, 'abc', 1); INSERT INTO t_inside VALUES (1, 'x1', 1.5);"
        "INSERT INTO t_default VALUES (1); INSERT INTO t_narrow VALUES (1, 5, 1.25); INSERT INTO t_rename VALUES (1, 'r1', 1);"
        "INSERT INTO t_default_in VALUES (1, 's1');",
        # Between batches: nothing of t_between changes after these in the first batch.
        "ALTER TABLE t_between ADD COLUMN b numeric(10,3); ALTER TABLE t_between ALTER a TYPE bigint;"
        "ALTER TABLE t_between ALTER v TYPE text; ALTER TABLE t_between DROP COLUMN z;",
    ])
    assert drain_all(src, uri, slot=slot) == 1
    apply_slot(spark, config, ours)
    # Inside one batch: rows before and after ADD COLUMN, DROP COLUMN of a NOT NULL column, widening.
    run_script(src, [
        "INSERT INTO t_between VALUES (2, 5000000000, 'longer than five', 1.25);",
        "INSERT INTO t_inside VALUES (2, 'x2', 2.5);",
        "ALTER TABLE t_inside ADD COLUMN c text;",
        "INSERT INTO t_inside VALUES (3, 'x3', 3.5, 'c3'); UPDATE t_inside SET c = 'c1' WHERE id = 1;",
        "ALTER TABLE t_inside DROP COLUMN x;",
        "INSERT INTO t_inside VALUES (4, 4.5, 'c4');",
        # A column that lives only inside the batch: added, written, dropped, then rows after it.
        "ALTER TABLE t_inside ADD COLUMN tmp int; UPDATE t_inside SET tmp = 7 WHERE id = 2;",
        "ALTER TABLE t_inside DROP COLUMN tmp; UPDATE t_inside SET c = 'c4b' WHERE id = 4;",
        "ALTER TABLE t_inside ALTER n TYPE numeric(12,4);",
        "INSERT INTO t_inside VALUES (5, 12345678.1234, 'c5'); UPDATE t_inside SET n = 0.0001 WHERE id = 2;",
        # Narrowing that keeps every value (or fails on the source): the target keeps its wider column.
        # big: between (first in the batch), wide: inside (a row before and after). Narrowings that
        # round stop (test_a_rounding_narrowing_stops...).
        "ALTER TABLE t_narrow ALTER big TYPE int; INSERT INTO t_narrow VALUES (2, 7, 2.5);",
        "ALTER TABLE t_narrow ALTER wide TYPE numeric(8,2); INSERT INTO t_narrow VALUES (3, 8, 3.5);",
        # ADD COLUMN ... DEFAULT between batches: row 1 is in the target already.
        "ALTER TABLE t_default ADD COLUMN d int DEFAULT 7; INSERT INTO t_default VALUES (2); "
        "INSERT INTO t_default VALUES (3, 8);",
        # ... and inside one batch: rows 2 and 3 are staged before the ALTER, under the old schema.
        "INSERT INTO t_default_in VALUES (2, 's2'); UPDATE t_default_in SET s = 's1b' WHERE id = 1;",
        "INSERT INTO t_default_in VALUES (3, 's3');",
        """ALTER TABLE t_default_in ADD COLUMN d numeric(5,2) DEFAULT 1.5, ADD COLUMN e text DEFAULT 'say "hi" \\ ok',
           ADD COLUMN f boolean DEFAULT true, ADD COLUMN g date DEFAULT '2024-02-29', ADD COLUMN h int;""",
        "INSERT INTO t_default_in VALUES (4, 's4', 2.25, 'e4', false, '2020-01-01', 4); "
        "UPDATE t_default_in SET s = 's3b' WHERE id = 3;",
        # A rename is followed as drop + add: between (a, first in the batch) and inside (b, a row before).
        "ALTER TABLE t_rename RENAME a TO a2; INSERT INTO t_rename VALUES (2, 'r2', 2);",
        "ALTER TABLE t_rename RENAME b TO b2; INSERT INTO t_rename VALUES (3, 'r3', 3);",
    ])
    assert drain_all(src, uri, slot=slot) == 1
    assert [r.applied for r in apply_slot(spark, config, ours)] == [False, True]
    # z is kept in the target, nullable, no longer written.
    assert columns(ours, "t_between") == [("id", "integer", True), ("a", "bigint", False), ("v", "text", False),
                                          ("z", "integer", False), ("b", "numeric(10,3)", False)]
    assert table_rows(ours, "t_between", "id, a, v, b") == table_rows(src, "t_between", "*") == [
        (1, 10, "abc", None), (2, 5000000000, "longer than five", Decimal("1.250"))]
    assert table_rows(ours, "t_between", "id, z") == [(1, 1), (2, None)]
    # x is kept in the target, nullable; tmp, added and dropped inside the batch, is created.
    assert columns(ours, "t_inside") == [("id", "integer", True), ("x", "text", False), ("n", "numeric(12,4)", False),
                                         ("c", "text", False), ("tmp", "integer", False)]
    assert table_rows(ours, "t_inside", "id, n, c") == table_rows(src, "t_inside", "id, n, c")
    # Each change wrote the columns of its own schema version (a native subscriber keeping the columns
    # does the same): rows 1-3 got x before the drop, rows inserted after it have none, and the UPDATEs
    # after a drop left the dropped column alone (row 2 keeps x2 and tmp 7).
    assert table_rows(ours, "t_inside", "id, x, tmp") == [(1, "x1", None), (2, "x2", 7), (3, "x3", None),
                                                         (4, None, None), (5, None, None)]
    assert columns(ours, "t_narrow")[1:] == [("big", "bigint", False), ("wide", "numeric(10,2)", False)]
    assert table_rows(ours, "t_narrow", "*") == table_rows(src, "t_narrow", "*") == [
        (1, 5, Decimal("1.25")), (2, 7, Decimal("2.5")), (3, 8, Decimal("3.5"))]
    # The source's default reaches rows older than the ADD COLUMN: in the target before the batch
    # (t_default) and staged before it in the same batch (t_default_in); the target keeps no default.
    assert table_rows(ours, "t_default", "*") == table_rows(src, "t_default", "*") == [(1, 7), (2, 7), (3, 8)]
    assert table_rows(ours, "t_default_in", "*") == table_rows(src, "t_default_in", "*") == [
        (1, "s1b", Decimal("1.50"), 'say "hi" \\ ok', True, date(2024, 2, 29), None),
        (2, "s2", Decimal("1.50"), 'say "hi" \\ ok', True, date(2024, 2, 29), None),
        (3, "s3b", Decimal("1.50"), 'say "hi" \\ ok', True, date(2024, 2, 29), None),
        (4, "s4", Decimal("2.25"), "e4", False, date(2020, 1, 1), 4)]
    assert query(ours, "SELECT count(*) FROM pg_attrdef WHERE adrelid = 't_default_in'::regclass") == [(0,)]
    # Documented: rename = drop + add; the old column keeps the values written before (row 2's b too,
    # written in the batch before the rename).
    assert table_rows(ours, "t_rename", "id, a, a2, b, b2") == [
        (1, "r1", None, 1, None), (2, None, "r2", 2, None), (3, None, "r3", None, 3)]


def test_a_default_added_on_the_target_first_makes_add_column_default_exact(spark, pipeline):
    src, slot, ours, uri = pipeline("CREATE TABLE t_default (id int PRIMARY KEY); CREATE PUBLICATION pub_all FOR TABLE t_default;")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.t_default": TableApplyConfig()})
    run_script(src, ["INSERT INTO t_default VALUES (1);"])
    drain_all(src, uri, slot=slot)
    apply_slot(spark, config, ours)
    run_script(src, ["ALTER TABLE t_default ADD COLUMN d int DEFAULT 7; INSERT INTO t_default VALUES (2);"])
    drain_all(src, uri, slot=slot)
    execute(ours, "ALTER TABLE t_default ADD COLUMN d int DEFAULT 7")
    apply_slot(spark, config, ours)
    assert table_rows(ours, "t_default", "*") == table_rows(src, "t_default", "*") == [(1, 7), (2, 7)]


def test_an_unfollowable_type_change_stops_with_a_typed_error_and_resumes_after_the_target_is_fixed(
        spark, pipeline):
    """Inside one batch (a row staged before the change, one after): the documented stop and resume."""
    src, slot, ours, uri = pipeline("CREATE TABLE t (id int PRIMARY KEY, c int); CREATE PUBLICATION pub_all FOR TABLE t;")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.t": TableApplyConfig()})
    run_script(src, ["INSERT INTO t VALUES (1, 1);", "INSERT INTO t VALUES (2, 2);"])
    drain_all(src, uri, slot=slot)
    apply_slot(spark, config, ours)
    run_script(src, ["INSERT INTO t VALUES (3, 3);", "ALTER TABLE t ALTER c TYPE text USING 'v' || c;",
                     "INSERT INTO t VALUES (4, 'v4');"])
    drain_all(src, uri, slot=slot)
    with pytest.raises(SchemaChangeError) as info:
        apply_slot(spark, config, ours)
    err = info.value
    assert (err.table, err.column, err.old_type, err.new_type) == ("public.t", "c", "integer", "text")
    assert err.lsn is not None and "ALTER TABLE public.t ALTER COLUMN c TYPE text" in str(err)
    assert "pglogical resync --table public.t" in str(err)
    assert table_rows(ours, "t", "*") == [(1, 1), (2, 2)]  # nothing of the batch
    # The user converts the target as the source did, and runs again.
    execute(ours, "ALTER TABLE t ALTER c TYPE text USING 'v' || c")
    assert [r.applied for r in apply_slot(spark, config, ours)] == [False, True]
    # Documented: row 3 was staged as the integer 3 before the change; the source converted it to 'v3'.
    assert table_rows(src, "t", "*") == [(1, "v1"), (2, "v2"), (3, "v3"), (4, "v4")]
    assert table_rows(ours, "t", "*") == [(1, "v1"), (2, "v2"), (3, "3"), (4, "v4")]


def test_a_rounding_narrowing_between_batches_stops_and_resumes_after_the_target_is_rounded(spark, pipeline):
    """numeric(10,2) → numeric(6,1) rounds the source's rows; seen across batches through the relation state."""
    src, slot, ours, uri = pipeline("CREATE TABLE t (id int PRIMARY KEY, n numeric(10,2)); "
                                    "CREATE PUBLICATION pub_all FOR TABLE t;")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.t": TableApplyConfig()})
    run_script(src, ["INSERT INTO t VALUES (1, 1.25), (2, 2.5);"])
    drain_all(src, uri, slot=slot)
    apply_slot(spark, config, ours)
    run_script(src, ["ALTER TABLE t ALTER n TYPE numeric(6,1);", "INSERT INTO t VALUES (3, 3.5);"])
    drain_all(src, uri, slot=slot)
    with pytest.raises(SchemaChangeError, match=r"from numeric\(10,2\) to numeric\(6,1\)") as info:
        apply_slot(spark, config, ours)
    assert (info.value.table, info.value.column) == ("public.t", "n")
    execute(ours, "ALTER TABLE t ALTER n TYPE numeric(6,1)")
    assert [r.applied for r in apply_slot(spark, config, ours)] == [False, True]
    assert table_rows(ours, "t", "*") == table_rows(src, "t", "*") == [
        (1, Decimal("1.3")), (2, Decimal("2.5")), (3, Decimal("3.5"))]


def test_schema_changes_fail_stops_at_a_new_column(spark, pipeline):
    src, slot, ours, uri = pipeline("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub_all FOR TABLE t;")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.t": TableApplyConfig(schema_changes="fail")})
    run_script(src, ["INSERT INTO t VALUES (1);"])
    drain_all(src, uri, slot=slot)
    apply_slot(spark, config, ours)
    run_script(src, ["ALTER TABLE t ADD COLUMN b int; INSERT INTO t VALUES (2, 2);"])
    drain_all(src, uri, slot=slot)
    with pytest.raises(SchemaChangeError, match=r"public\.t changed: new column b \(integer\)") as info:
        apply_slot(spark, config, ours)
    assert (info.value.column, info.value.new_type) == ("b", "integer")
    assert table_rows(ours, "t", "*") == [(1,)]


def test_values_written_before_a_drop_and_between_add_and_drop_in_one_batch_match_a_native_subscriber(
        pg_server, spark, tmp_path):
    """Each change is written with its own schema version's columns: the dropped c keeps the value written
    before the drop, x (added and dropped inside the batch) is created with its value; rows after a drop leave
    the column alone (UPDATE) or NULL (INSERT) — as a native subscriber whose table keeps the columns."""
    with source_and_native(pg_server, REPRO_SETUP, REPRO_NATIVE, "t") as (src, slot, native):
        ours, uri = make_target(pg_server)[1], str(tmp_path / "staging")
        config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.t": TableApplyConfig()})
        run_script(src, REPRO_FIRST)
        assert drain_all(src, uri, slot=slot) == 1
        apply_slot(spark, config, ours)
        run_script(src, REPRO_BATCH)
        assert drain_all(src, uri, slot=slot) == 1
        assert [r.applied for r in apply_slot(spark, config, ours)] == [False, True]
        wait_for_subscriber(src, native, name=f"n_{slot}")
        assert native_rows(native, "t", "id, a, c, x") == REPRO_EXPECTED
        assert table_rows(ours, "t", "id, a, c, x") == REPRO_EXPECTED
        assert [c[:2] for c in columns(ours, "t")] == [("id", "integer"), ("a", "integer"), ("c", "integer"),
                                                      ("x", "text")]


@pytest.mark.parametrize("seed", [1, 7, 8])
def test_random_add_drop_and_widen_interleavings_inside_one_batch_match_a_native_subscriber(
        pg_server, spark, tmp_path, seed):
    setup, native_sql, first, script = random_interleaving(seed)
    assert added_and_dropped(script)  # not vacuous: a column lives and dies inside the batch
    with source_and_native(pg_server, setup, native_sql, "r") as (src, slot, native):
        ours, uri = make_target(pg_server)[1], str(tmp_path / "staging")
        config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.r": TableApplyConfig()})
        run_script(src, first)
        assert drain_all(src, uri, slot=slot) == 1
        apply_slot(spark, config, ours)
        run_script(src, script)
        assert drain_all(src, uri, slot=slot) == 1
        apply_slot(spark, config, ours)
        wait_for_subscriber(src, native, name=f"n_{slot}")
        cols = ", ".join(c for c, *_ in columns(native, "r"))
        assert table_rows(ours, "r", cols) == native_rows(native, "r", cols), script
