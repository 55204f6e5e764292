"""Source schema changes through drain → stage → Spark apply: followed in the batch's transaction, or a clear stop."""

from __future__ import annotations

from contextlib import ExitStack
from decimal import Decimal

import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.exceptions import SchemaChangeError
from tests.integration.parity_support import source_with_slot
from tests.pgserver import execute, query
from tests.subscriber import drain_all, run_script
from tests.unit.apply.targetdb import make_target

TABLES = ("t_between", "t_inside", "t_default", "t_narrow", "t_rename")


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
    src, slot, ours, uri = pipeline("""
        CREATE TABLE t_between (id int PRIMARY KEY, a int, v varchar(5));
        CREATE TABLE t_inside (id int PRIMARY KEY, x text NOT NULL, n numeric(6,2));
        CREATE TABLE t_default (id int PRIMARY KEY);
        CREATE TABLE t_narrow (id int PRIMARY KEY, big bigint);
        CREATE TABLE t_rename (id int PRIMARY KEY, a text);
        CREATE PUBLICATION pub_all FOR TABLE t_between, t_inside, t_default, t_narrow, t_rename;""")
    # Created by hand with NOT NULL (a table the apply creates has no NOT NULL but its key).
    execute(ours, "CREATE TABLE t_inside (id int PRIMARY KEY, x text NOT NULL, n numeric(6,2))")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={f"public.{t}": TableApplyConfig() for t in TABLES})
    run_script(src, [
        "INSERT INTO t_between VALUES (1, 10, 'abc'); INSERT INTO t_inside VALUES (1, 'x1', 1.5);"
        "INSERT INTO t_default VALUES (1); INSERT INTO t_narrow VALUES (1, 5); INSERT INTO t_rename VALUES (1, 'r1');",
    ])
    assert drain_all(src, uri, slot=slot) == 1
    apply_slot(spark, config, ours)
    # Between batches: new column, widening of two columns; nothing else in the batch changes them.
    # Inside one batch: rows before and after ADD COLUMN, DROP COLUMN of a NOT NULL column, widening.
    run_script(src, [
        "ALTER TABLE t_between ADD COLUMN b numeric(10,3); ALTER TABLE t_between ALTER a TYPE bigint;"
        "ALTER TABLE t_between ALTER v TYPE text;",
        "INSERT INTO t_between VALUES (2, 5000000000, 'longer than five', 1.25);",
        "INSERT INTO t_inside VALUES (2, 'x2', 2.5);",
        "ALTER TABLE t_inside ADD COLUMN c text;",
        "INSERT INTO t_inside VALUES (3, 'x3', 3.5, 'c3'); UPDATE t_inside SET c = 'c1' WHERE id = 1;",
        "ALTER TABLE t_inside DROP COLUMN x;",
        "INSERT INTO t_inside VALUES (4, 4.5, 'c4');",
        "ALTER TABLE t_inside ALTER n TYPE numeric(12,4);",
        "INSERT INTO t_inside VALUES (5, 12345678.1234, 'c5'); UPDATE t_inside SET n = 0.0001 WHERE id = 2;",
        # Narrowing: the target keeps its wider column, every value fits.
        "ALTER TABLE t_narrow ALTER big TYPE int; INSERT INTO t_narrow VALUES (2, 7);",
        # ADD COLUMN ... DEFAULT: existing rows read the default on the source; the stream does not carry it.
        "ALTER TABLE t_default ADD COLUMN d int DEFAULT 7; INSERT INTO t_default VALUES (2);",
        # A rename is followed as drop + add.
        "ALTER TABLE t_rename RENAME a TO a2; INSERT INTO t_rename VALUES (2, 'r2');",
    ])
    assert drain_all(src, uri, slot=slot) == 1
    assert [r.applied for r in apply_slot(spark, config, ours)] == [False, True]
    assert columns(ours, "t_between") == [("id", "integer", True), ("a", "bigint", False), ("v", "text", False),
                                          ("b", "numeric(10,3)", False)]
    assert table_rows(ours, "t_between", "*") == table_rows(src, "t_between", "*") == [
        (1, 10, "abc", None), (2, 5000000000, "longer than five", Decimal("1.250"))]
    # x is kept in the target, nullable, no longer written.
    assert columns(ours, "t_inside") == [("id", "integer", True), ("x", "text", False), ("n", "numeric(12,4)", False),
                                         ("c", "text", False)]
    assert table_rows(ours, "t_inside", "id, n, c") == table_rows(src, "t_inside", "id, n, c")
    # Written up to the batch before the drop; the batch that drops it writes no value there.
    assert table_rows(ours, "t_inside", "id, x") == [(1, "x1"), (2, None), (3, None), (4, None), (5, None)]
    assert columns(ours, "t_narrow")[1] == ("big", "bigint", False)
    assert table_rows(ours, "t_narrow", "*") == table_rows(src, "t_narrow", "*") == [(1, 5), (2, 7)]
    # Documented: the pre-existing row has the default on the source, NULL in the target.
    assert table_rows(src, "t_default", "*") == [(1, 7), (2, 7)]
    assert table_rows(ours, "t_default", "*") == [(1, None), (2, 7)]
    # Documented: rename = drop + add; the old column keeps the values written before.
    assert table_rows(ours, "t_rename", "id, a, a2") == [(1, "r1", None), (2, None, "r2")]


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
    src, slot, ours, uri = pipeline("CREATE TABLE t (id int PRIMARY KEY, c int); CREATE PUBLICATION pub_all FOR TABLE t;")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.t": TableApplyConfig()})
    run_script(src, ["INSERT INTO t VALUES (1, 1);", "INSERT INTO t VALUES (2, 2);"])
    drain_all(src, uri, slot=slot)
    apply_slot(spark, config, ours)
    run_script(src, ["ALTER TABLE t ALTER c TYPE text USING 'v' || c;", "INSERT INTO t VALUES (3, 'v3');"])
    drain_all(src, uri, slot=slot)
    with pytest.raises(SchemaChangeError) as info:
        apply_slot(spark, config, ours)
    err = info.value
    assert (err.table, err.column, err.old_type, err.new_type) == ("public.t", "c", "integer", "text")
    assert err.lsn is not None and "ALTER TABLE public.t ALTER COLUMN c TYPE text" in str(err)
    assert table_rows(ours, "t", "*") == [(1, 1), (2, 2)]  # nothing of the batch
    # The user converts the target as the source did, and runs again.
    execute(ours, "ALTER TABLE t ALTER c TYPE text USING 'v' || c")
    assert [r.applied for r in apply_slot(spark, config, ours)] == [False, True]
    assert table_rows(ours, "t", "*") == table_rows(src, "t", "*") == [(1, "v1"), (2, "v2"), (3, "v3")]


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
