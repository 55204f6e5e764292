"""Source schema changes into the Iceberg target (the scenarios of test_delta_schema_changes): new columns added by
Iceberg's schema evolution (defaults filled in the mirror), dropped ones kept, widenings Iceberg promotes promoted
in place (which Delta cannot), the ones it cannot (a decimal's scale) a typed stop."""

from __future__ import annotations

from contextlib import ExitStack
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from airflow_provider_pglogical.exceptions import SchemaChangeError
from scripts.harness.pgserver import query
from scripts.harness.subscriber import drain_all, run_script
from tests.support.parity import source_with_slot

TABLES = ("t_between", "t_inside", "t_narrow", "t_rename", "t_widen")


def location(tmp_path, namespace: str) -> IcebergLocation:
    return IcebergLocation({"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                            "warehouse": str(tmp_path / "warehouse")}, namespace=namespace)


def ice_rows(target: IcebergTarget, table: str, cols: str) -> list[tuple]:
    tbl = target.open(f"public.{table}")
    assert tbl is not None
    names = [c.strip() for c in cols.split(",")]
    return sorted(tuple(r[c] for c in names) for r in tbl.scan().to_arrow().to_pylist())


def source_rows(dsn: str, table: str, cols: str) -> list[tuple]:
    return query(dsn, f"SELECT {cols} FROM {table} ORDER BY 1")  # module constants only


def fields(target: IcebergTarget, table: str) -> dict[str, tuple[str, str | None]]:
    tbl = target.open(f"public.{table}")
    assert tbl is not None
    return {f.name: (str(f.field_type), f.doc) for f in tbl.schema().fields}


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
        CREATE TABLE t_widen (id int PRIMARY KEY, c int, r real, m numeric(10,2));
        CREATE PUBLICATION pub_all FOR TABLE t_between, t_inside, t_narrow, t_rename, t_widen;""")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={f"public.{t}": TableApplyConfig() for t in TABLES})
    mirror = IcebergTarget(location(tmp_path, "mirror"), slot)
    feed = IcebergTarget(location(tmp_path, "feed"), slot, mode="changelog")
    run_script(src, ["INSERT INTO t_between VALUES (1, 10, 'abc'); INSERT INTO t_inside VALUES (1, 'x1', 1.5);"
                     "INSERT INTO t_narrow VALUES (1, 5); INSERT INTO t_rename VALUES (1, 'r1');"
                     "INSERT INTO t_widen VALUES (1, 1, 1.5, 1.25);"])
    assert drain_all(src, uri, slot=slot) == 1
    apply_slot(spark, config, target=mirror)
    assert fields(mirror, "t_between")["v"] == ("string", "pglogical.type=character varying(5)")
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
        "ALTER TABLE t_narrow ALTER big TYPE int; INSERT INTO t_narrow VALUES (2, 7);",
        "ALTER TABLE t_rename RENAME a TO a2; INSERT INTO t_rename VALUES (2, 'r2');",
        "ALTER TABLE t_widen ALTER c TYPE bigint, ALTER r TYPE double precision, ALTER m TYPE numeric(14,2);"
        "INSERT INTO t_widen VALUES (2, 5000000000, 1e300, 123456789012.34);",
    ])
    assert drain_all(src, uri, slot=slot) == 1
    assert [r.applied for r in apply_slot(spark, config, target=mirror)] == [False, True]
    assert [r.applied for r in apply_slot(spark, config, target=feed)] == [True, True]

    between = fields(mirror, "t_between")
    assert between["b"] == ("decimal(10, 3)", "pglogical.type=numeric(10,3)")
    assert between["v"] == ("string", "pglogical.type=text")
    assert ice_rows(mirror, "t_between", "id, a, v, b") == source_rows(src, "t_between", "id, a, v, b") == [
        (1, 10, "abc", None), (2, 5, "longer than five", Decimal("1.250"))]
    # Row 1 is older than ADD COLUMN … DEFAULT: on the source it reads the defaults, so in the mirror.
    assert ice_rows(mirror, "t_between", "id, d, e, f") == source_rows(src, "t_between", "id, d, e, f") == [
        (1, 7, Decimal("2.50"), "it's"), (2, 7, Decimal("2.50"), "it's")]
    assert set(fields(mirror, "t_inside")) == {"id", "x", "n", "c"}
    assert ice_rows(mirror, "t_inside", "id, n, c") == source_rows(src, "t_inside", "id, n, c")
    assert ice_rows(mirror, "t_inside", "id, x") == [(1, "x1"), (2, "x2"), (3, "x3"), (4, None)]
    assert fields(mirror, "t_narrow")["big"][0] == "long"  # the wider column holds every value
    assert ice_rows(mirror, "t_narrow", "id, big") == [(1, 5), (2, 7)]
    assert ice_rows(mirror, "t_rename", "id, a, a2") == [(1, "r1", None), (2, None, "r2")]
    # Iceberg promotes in place what Delta cannot: int → long, float → double, a decimal's precision.
    widen = fields(mirror, "t_widen")
    assert (widen["c"][0], widen["r"][0], widen["m"][0]) == ("long", "double", "decimal(14, 2)")
    assert widen["c"][1] == "pglogical.type=bigint"
    assert ice_rows(mirror, "t_widen", "id, c, r, m") == source_rows(src, "t_widen", "id, c, r, m")
    feed_inside = feed.open("public.t_inside")
    assert feed_inside is not None
    data = feed_inside.scan().to_arrow()
    assert {"c", "x", "n"} <= set(data.column_names)
    assert sorted(data.column("_op").to_pylist()) == ["insert"] * 4 + ["update"] * 2
    assert sorted(r for r in data.column("c").to_pylist() if r) == ["c1", "c3", "c4"]
    feed_widen = feed.open("public.t_widen")
    assert feed_widen is not None and str(feed_widen.schema().find_field("c").field_type) == "long"


def test_a_widening_iceberg_cannot_promote_stops_with_a_typed_error_before_anything_is_written(spark, pipeline,
                                                                                             tmp_path):
    src, slot, uri = pipeline("CREATE TABLE t (id int PRIMARY KEY, m numeric(10,2));"
                              "CREATE PUBLICATION pub_all FOR TABLE t;")
    config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.t": TableApplyConfig()})
    target = IcebergTarget(location(tmp_path, "lake"), slot)
    run_script(src, ["INSERT INTO t VALUES (1, 1.25);"])
    drain_all(src, uri, slot=slot)
    apply_slot(spark, config, target=target)
    mark = target.watermark("public.t")
    run_script(src, ["ALTER TABLE t ALTER m TYPE numeric(12,4);", "INSERT INTO t VALUES (2, 99999999.1234);"])
    drain_all(src, uri, slot=slot)
    with pytest.raises(SchemaChangeError) as info:
        apply_slot(spark, config, target=target)
    err = info.value
    assert (err.table, err.column, err.old_type, err.new_type) == ("public.t", "m", "numeric(10,2)", "numeric(12,4)")
    assert "Iceberg cannot promote its type decimal(10, 2)" in str(err)
    assert "99999999" not in str(err)
    assert target.watermark("public.t") == mark and ice_rows(target, "t", "id, m") == [(1, Decimal("1.25"))]
    # The way out the error names: the table written anew with the wider type and the same properties (the
    # watermark among them), then the run again.
    table = target.open("public.t")
    assert table is not None
    data, properties = table.scan().to_arrow(), dict(table.properties)
    i = data.schema.get_field_index("m")
    data = data.set_column(i, pa.field("m", pa.decimal128(12, 4), metadata={"doc": "pglogical.type=numeric(12,4)"}),
                           data.column(i).cast(pa.decimal128(12, 4)))
    identifier = target.location.identifier("public.t")
    target.catalog.drop_table(identifier)
    target.catalog.create_table(identifier, schema=data.schema, properties=properties).append(data)
    assert target.watermark("public.t") == mark
    assert [r.applied for r in apply_slot(spark, config, target=target)] == [False, True]
    assert ice_rows(target, "t", "id, m") == source_rows(src, "t", "id, m") == [
        (1, Decimal("1.2500")), (2, Decimal("99999999.1234"))]
