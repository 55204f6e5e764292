"""Source schema changes into the Delta target (the scenarios of test_schema_changes): new columns added to the
Delta table, dropped ones kept and no longer written, widenings Delta holds recorded, the others a typed stop."""

from __future__ import annotations

from contextlib import ExitStack
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import TYPE_KEY, DeltaTarget
from airflow_provider_pglogical.exceptions import SchemaChangeError
from scripts.harness.pgserver import query
from scripts.harness.subscriber import drain_all, run_script, wait_for_subscriber
from tests.support.parity import source_with_slot
from tests.support.schema import (
    REPRO_BATCH,
    REPRO_EXPECTED,
    REPRO_FIRST,
    REPRO_NATIVE,
    REPRO_SETUP,
    native_rows,
    source_and_native,
)

TABLES = ("t_between", "t_inside", "t_narrow", "t_rename")


def delta_rows(location: DeltaLocation, table: str, cols: str) -> list[tuple]:
    data = DeltaTable(location.table_uri(f"public.{table}")).to_pyarrow_table()
    names = [c.strip() for c in cols.split(",")]
    return sorted(tuple(r[c] for c in names) for r in data.to_pylist())


def source_rows(dsn: str, table: str, cols: str) -> list[tuple]:
    return query(dsn, f"SELECT {cols} FROM {table} ORDER BY 1")  # module constants only


def fields(location: DeltaLocation, table: str) -> dict[str, tuple[pa.DataType, str | None]]:
    schema = DeltaTable(location.table_uri(f"public.{table}")).schema()
    arrow = pa.schema(schema.to_arrow())
    return {f.name: (arrow.field(f.name).type, (f.metadata or {}).get(TYPE_KEY)) for f in schema.fields}


@pytest.fixture
def pipeline(pg_server, tmp_path):
    with ExitStack() as stack:
        def start(sql: str) -> tuple[str, str, str]:
            src, slot = stack.enter_context(source_with_slot(pg_server, sql))
            return src, slot, str(tmp_path / "staging")

        yield start


def test_new_dropped_widened_narrowed_and_renamed_columns_are_followed_in_mirror_and_changelog(spark, pipeline,
                                                                                                 tmp_path):
    src, slot, uri = pipeline("""
        CREATE TABLE t_between (id int PRIMARY KEY, a int, v varchar(5));
        CREATE TABLE t_inside (id int PRIMARY KEY, x text NOT NULL, n numeric(6,2));
        CREATE TABLE t_narrow (id int PRIMARY KEY, big bigint);
        CREATE TABLE t_rename (id int PRIMARY KEY, a text);
        CREATE PUBLICATION pub_all FOR TABLE t_between, t_inside, t_narrow, t_rename;""")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={f"public.{t}": TableApplyConfig() for t in TABLES})
    mirror_loc, feed_loc = DeltaLocation(str(tmp_path / "mirror")), DeltaLocation(str(tmp_path / "feed"))
    mirror, feed = DeltaTarget(mirror_loc, slot), DeltaTarget(feed_loc, slot, mode="changelog")
    run_script(src, ["INSERT INTO t_between VALUES (1, 10, 'abc'); INSERT INTO t_inside VALUES (1, 'x1', 1.5);"
                     "INSERT INTO t_narrow VALUES (1, 5); INSERT INTO t_rename VALUES (1, 'r1');"])
    assert drain_all(src, uri, slot=slot) == 1
    apply_slot(spark, config, target=mirror)
    assert fields(mirror_loc, "t_between")["v"] == (pa.string(), "character varying(5)")
    # Between batches: a new column, a widening Delta's string holds already. Inside one batch: rows before
    # and after ADD COLUMN and DROP COLUMN (of a NOT NULL column). Narrowing, rename (= drop + add).
    run_script(src, [
        "ALTER TABLE t_between ADD COLUMN b numeric(10,3); ALTER TABLE t_between ALTER v TYPE text;"
        "ALTER TABLE t_between ADD COLUMN d int DEFAULT 7, ADD COLUMN e numeric(6,2) DEFAULT 2.5,"
        " ADD COLUMN f text DEFAULT 'it''s';",
        "INSERT INTO t_between VALUES (2, 5, 'longer than five', 1.25);",
        "INSERT INTO t_inside VALUES (2, 'x2', 2.5);",
        "ALTER TABLE t_inside ADD COLUMN c text;",
        "INSERT INTO t_inside VALUES (3, 'x3', 3.5, 'c3'); UPDATE t_inside SET c = 'c1' WHERE id = 1;",
        "ALTER TABLE t_inside DROP COLUMN x;",
        "INSERT INTO t_inside VALUES (4, 4.5, 'c4'); UPDATE t_inside SET n = 9.25 WHERE id = 2;",
        "ALTER TABLE t_inside ADD COLUMN tmp int; UPDATE t_inside SET tmp = 7 WHERE id = 2;",
        "ALTER TABLE t_inside DROP COLUMN tmp; UPDATE t_inside SET c = 'c4b' WHERE id = 4;",
        "ALTER TABLE t_narrow ALTER big TYPE int; INSERT INTO t_narrow VALUES (2, 7);",
        "ALTER TABLE t_rename RENAME a TO a2; INSERT INTO t_rename VALUES (2, 'r2');",
    ])
    assert drain_all(src, uri, slot=slot) == 1
    assert [r.applied for r in apply_slot(spark, config, target=mirror)] == [False, True]
    assert [r.applied for r in apply_slot(spark, config, target=feed)] == [True, True]

    between = fields(mirror_loc, "t_between")
    assert between["b"] == (pa.decimal128(10, 3), "numeric(10,3)") and between["v"] == (pa.string(), "text")
    assert delta_rows(mirror_loc, "t_between", "id, a, v, b") == source_rows(src, "t_between", "id, a, v, b") == [
        (1, 10, "abc", None), (2, 5, "longer than five", Decimal("1.250"))]
    # Row 1 is older than ADD COLUMN … DEFAULT: on the source it reads the defaults, so in the mirror.
    assert delta_rows(mirror_loc, "t_between", "id, d, e, f") == source_rows(src, "t_between", "id, d, e, f") == [
        (1, 7, Decimal("2.50"), "it's"), (2, 7, Decimal("2.50"), "it's")]
    # x is kept; each change wrote its own schema version's columns: rows 1-3 got x before the drop, row 4
    # (inserted after it) has none, and the UPDATE of row 2 after the drop left x2 alone. tmp lived only
    # inside the batch: created, with its value.
    assert set(fields(mirror_loc, "t_inside")) == {"id", "x", "n", "c", "tmp"}
    assert delta_rows(mirror_loc, "t_inside", "id, n, c") == source_rows(src, "t_inside", "id, n, c")
    assert delta_rows(mirror_loc, "t_inside", "id, x, tmp") == [(1, "x1", None), (2, "x2", 7), (3, "x3", None),
                                                                (4, None, None)]
    assert fields(mirror_loc, "t_narrow")["big"] == (pa.int64(), "bigint")  # the wider column holds every value
    assert delta_rows(mirror_loc, "t_narrow", "id, big") == [(1, 5), (2, 7)]
    assert delta_rows(mirror_loc, "t_rename", "id, a, a2") == [(1, "r1", None), (2, None, "r2")]
    # The change feed gained the new column (and its old-image struct the new field); every change is there.
    feed_inside = DeltaTable(feed_loc.table_uri("public.t_inside")).to_pyarrow_table()
    assert {"c", "x", "n"} <= set(feed_inside.column_names)
    assert sorted(feed_inside.column("_op").to_pylist()) == ["insert"] * 4 + ["update"] * 4
    assert sorted(r for r in feed_inside.column("c").to_pylist() if r) == ["c1", "c3", "c4", "c4b"]


def test_a_widening_delta_cannot_hold_stops_with_a_typed_error_and_resumes_after_the_table_is_rewritten(
        spark, pipeline, tmp_path):
    src, slot, uri = pipeline("CREATE TABLE t (id int PRIMARY KEY, c int); CREATE PUBLICATION pub_all FOR TABLE t;")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.t": TableApplyConfig()})
    location = DeltaLocation(str(tmp_path / "lake"))
    target = DeltaTarget(location, slot)
    run_script(src, ["INSERT INTO t VALUES (1, 1);"])
    drain_all(src, uri, slot=slot)
    apply_slot(spark, config, target=target)
    mark = target.watermark("public.t")
    run_script(src, ["ALTER TABLE t ALTER c TYPE bigint;", "INSERT INTO t VALUES (2, 5000000000);"])
    drain_all(src, uri, slot=slot)
    with pytest.raises(SchemaChangeError) as info:
        apply_slot(spark, config, target=target)
    err = info.value
    assert (err.table, err.column, err.old_type, err.new_type) == ("public.t", "c", "integer", "bigint")
    assert err.lsn is not None and f"{err.lsn >> 32:X}/{err.lsn & 0xFFFFFFFF:X}" in str(err)
    assert "5000000000" not in str(err)
    assert target.watermark("public.t") == mark and delta_rows(location, "t", "id, c") == [(1, 1)]
    # The user rewrites the table with the wider type (the watermark, an app transaction of the log, stays).
    table_uri = location.table_uri("public.t")
    data = DeltaTable(table_uri).to_pyarrow_table()
    i = data.schema.get_field_index("c")
    data = data.set_column(i, pa.field("c", pa.int64(), metadata={TYPE_KEY: "bigint"}), data.column(i).cast(pa.int64()))
    write_deltalake(table_uri, data, mode="overwrite", schema_mode="overwrite")
    assert target.watermark("public.t") == mark
    assert [r.applied for r in apply_slot(spark, config, target=target)] == [False, True]
    assert delta_rows(location, "t", "id, c") == source_rows(src, "t", "id, c") == [(1, 1), (2, 5000000000)]


def test_values_written_before_a_drop_and_between_add_and_drop_in_one_batch_match_a_native_subscriber(
        pg_server, spark, tmp_path):
    """As in the PostgreSQL target: each change with its own schema version's columns. The mirror equals a native
    subscriber whose table keeps the columns; the change feed shows each change with the values it carried."""
    with source_and_native(pg_server, REPRO_SETUP, REPRO_NATIVE, "t") as (src, slot, native):
        uri = str(tmp_path / "staging")
        config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.t": TableApplyConfig()})
        mirror_loc, feed_loc = DeltaLocation(str(tmp_path / "mirror")), DeltaLocation(str(tmp_path / "feed"))
        mirror, feed = DeltaTarget(mirror_loc, slot), DeltaTarget(feed_loc, slot, mode="changelog")
        run_script(src, REPRO_FIRST)
        assert drain_all(src, uri, slot=slot) == 1
        apply_slot(spark, config, target=mirror)
        run_script(src, REPRO_BATCH)
        assert drain_all(src, uri, slot=slot) == 1
        assert [r.applied for r in apply_slot(spark, config, target=mirror)] == [False, True]
        assert [r.applied for r in apply_slot(spark, config, target=feed)] == [True, True]
        wait_for_subscriber(src, native, name=f"n_{slot}")
        assert native_rows(native, "t", "id, a, c, x") == REPRO_EXPECTED
        assert delta_rows(mirror_loc, "t", "id, a, c, x") == REPRO_EXPECTED
        assert fields(mirror_loc, "t")["c"] == (pa.int32(), "integer")
        assert fields(mirror_loc, "t")["x"] == (pa.string(), "text")
        feed_rows = DeltaTable(feed_loc.table_uri("public.t")).to_pyarrow_table().to_pylist()
        assert sorted(((r["_op"], r["id"], r["c"], r["x"]) for r in feed_rows), key=repr) == sorted([
            ("insert", 1, 1, None), ("insert", 2, 2, None), ("insert", 3, None, "hello"), ("insert", 4, None, None),
            ("update", 1, None, None), ("update", 1, 50, None)], key=repr)
