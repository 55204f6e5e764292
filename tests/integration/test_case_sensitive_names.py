"""Names that differ only by case, as PostgreSQL keeps them apart: a table with columns ``"Val"`` and ``val`` (UPDATEs
changing one of them, a row filter over ``val``, a column list of ``"Val"``) and ``"a.b"`` (Spark reads a bare
``a.b`` as a struct field) and tables ``"T"`` and ``t`` of one
schema, applied by ``pglogical run`` through Spark's transforms (``PGLOGICAL_APPLY_DIRECT=0``) and without a JVM,
into PostgreSQL and Iceberg, each ending equal to a native subscriber of the same publication. Spark resolves names
case-insensitively unless ``spark.sql.caseSensitive`` is set (the apply sets it); the row filter names ``"Val"``
quoted, as PostgreSQL's publication needs it (a spec refused it before quoted names were read). A Delta target, whose
protocol refuses two columns differing only by case, stops before anything commits, and applies once ``columns:``
leaves one out; a later batch writing ``"Val"`` to the Delta table that holds ``val`` is refused before any table of
the batch commits (before, delta-rs stopped it with a plain "Schema error: Duplicate field name"). All pipelines read one source, each from a
slot of its own, created before the changes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_provider_pglogical.apply.targets.iceberg.catalog import IcebergLocation
from airflow_provider_pglogical.apply.targets.iceberg.target import IcebergTarget
from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import subscribe, unsubscribe, wait_for_subscriber
from tests.integration.test_cli import pglogical
from tests.integration.test_cli_no_spark import run
from tests.support.spark import TEST_SPARK_CONF

TABLES = """
CREATE TABLE mixed (id int PRIMARY KEY, "Val" int, val text, "a.b" int);
CREATE TABLE mixed_f (id int PRIMARY KEY, "Val" int, val text);
ALTER TABLE mixed_f REPLICA IDENTITY FULL;
CREATE TABLE "T" (id int PRIMARY KEY, v text);
CREATE TABLE t (id int PRIMARY KEY, v text);
"""
LISTED = 'CREATE TABLE mixed_c (id int PRIMARY KEY, "Val" int{rest});'
FILTER = """val IS DISTINCT FROM 'hidden' AND "Val" IS DISTINCT FROM 99"""  # "Val" quoted, as PostgreSQL needs
SPEC_TABLES: dict[str, Any] = {"public.mixed": {}, "public.mixed_f": {"row_filter": FILTER},
                               "public.mixed_c": {"columns": ["id", "Val"]}, "public.T": {}, "public.t": {}}
ROWS = {"mixed": 'SELECT id, "Val", val, "a.b" FROM mixed ORDER BY id', "mixed_f": 'SELECT id, "Val", val FROM mixed_f ORDER BY id',
        "mixed_c": 'SELECT id, "Val" FROM mixed_c ORDER BY id', "T": 'SELECT id, v FROM "T" ORDER BY id',
        "t": "SELECT id, v FROM t ORDER BY id"}
# Two transactions, one batch: keys changed more than once (netted), UPDATEs changing only "Val" or only val,
# rows entering and leaving the filter, an UPDATE of the column the list leaves out, both tables "T" and t.
CHANGES = ["""BEGIN;
    INSERT INTO mixed VALUES (1, 10, 'a', 5), (2, 20, 'b', 6), (3, NULL, 'c', 7), (4, 40, NULL, 8);
    INSERT INTO mixed_f VALUES (1, 10, 'a'), (2, 20, 'hidden'), (3, 30, 'c'), (4, 40, 'd');
    INSERT INTO mixed_c VALUES (1, 10, 'a'), (2, 20, 'b'), (3, 30, 'c');
    INSERT INTO "T" VALUES (1, 'upper one'), (2, 'upper two');
    INSERT INTO t VALUES (1, 'lower one'), (3, 'lower three');
    COMMIT;""", """BEGIN;
    UPDATE mixed SET "Val" = 11 WHERE id = 1;
    UPDATE mixed SET val = 'bb' WHERE id = 2;
    UPDATE mixed SET "a.b" = 66 WHERE id = 2;
    UPDATE mixed SET "Val" = 33 WHERE id = 3;
    UPDATE mixed SET val = 'cc' WHERE id = 3;
    DELETE FROM mixed WHERE id = 4;
    UPDATE mixed_f SET val = 'hidden' WHERE id = 1;
    UPDATE mixed_f SET val = 'shown' WHERE id = 2;
    UPDATE mixed_f SET "Val" = 99 WHERE id = 3;
    UPDATE mixed_f SET "Val" = 41 WHERE id = 4;
    UPDATE mixed_c SET val = 'not listed' WHERE id = 1;
    UPDATE mixed_c SET "Val" = 22 WHERE id = 2;
    DELETE FROM mixed_c WHERE id = 3;
    UPDATE "T" SET v = 'upper changed' WHERE id = 1;
    DELETE FROM t WHERE id = 1;
    INSERT INTO t VALUES (2, 'lower two');
    UPDATE t SET v = 'lower changed' WHERE id = 3;
    COMMIT;"""]


LAKE_TABLES = ("mixed", "T", "t")  # mixed_f and mixed_c: their row filter and column list are PostgreSQL's above


def _write_spec(tmp: Path, name: str, source_uri: str, target: dict[str, Any], tables: dict[str, Any]) -> str:
    doc = {"source": {"dsn": source_uri, "publication": f"{name}_pub", "slot": f"{name}_slot", "create": True},
           "staging": {"uri": str(tmp / f"staging-{name}")}, "target": target, "tables": tables,
           "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(doc))))
    return str(path)


def _drop(server: Any, name: str) -> None:
    execute(server.dsn(name), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                              "WHERE database = current_database() AND NOT active")
    execute(server.dsn(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def staged(pg_server, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The source after ``CHANGES``, the native subscriber caught up with it (its rows by table), and the specs of
    every pipeline: PostgreSQL targets (``pg-spark``, ``pg-direct``), Iceberg catalogs (``ice-spark``,
    ``ice-direct``) and a Delta root (``delta``), each slot created before the changes."""
    tmp = tmp_path_factory.mktemp("case")
    source, native, pg_spark, pg_direct = (make_database(pg_server) for _ in range(4))
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, TABLES + LISTED.format(rest=", val text")
            + f'CREATE PUBLICATION pub_native FOR TABLE mixed, mixed_f WHERE ({FILTER}), mixed_c (id, "Val"), "T", t;')
    execute(native_dsn, TABLES + LISTED.format(rest=""))
    subscribe(source_dsn, native_dsn)
    lake_tables = {f"public.{t}": {} for t in LAKE_TABLES}
    targets = {"pg-spark": ({"kind": "postgres", "dsn": pg_server.uri(pg_spark)}, SPEC_TABLES),
               "pg-direct": ({"kind": "postgres", "dsn": pg_server.uri(pg_direct)}, SPEC_TABLES),
               "delta": ({"kind": "delta", "uri": str(tmp / "delta")}, lake_tables)}
    for name in ("ice-spark", "ice-direct"):
        catalog = {"type": "sql", "uri": f"sqlite:///{tmp}/{name}.db", "warehouse": str(tmp / f"{name}-warehouse")}
        targets[name] = ({"kind": "iceberg", "catalog": catalog, "namespace": "lake"}, lake_tables)
    specs = {name: _write_spec(tmp, name.replace("-", "_"), pg_server.uri(source), target, tables)
             for name, (target, tables) in targets.items()}
    try:
        for spec in specs.values():  # creates publication and slot: nothing to apply yet
            assert run(spec, tmp, java=False)[0]["apply"]["batches_seen"] == 0
        for sql in CHANGES:
            execute(source_dsn, sql)
        wait_for_subscriber(source_dsn, native_dsn)
        expected = {table: query(native_dsn, sql) for table, sql in ROWS.items()}
        # Not vacuous: only "Val" or only val changed on rows of each table, rows left and entered the filter.
        assert expected["mixed"] == [(1, 11, "a", 5), (2, 20, "bb", 66), (3, 33, "cc", 7)]
        assert expected["mixed_f"] == [(2, 20, "shown"), (4, 41, "d")]
        assert expected["T"] == [(1, "upper changed"), (2, "upper two")]
        yield {"tmp": tmp, "specs": specs, "expected": expected, "targets": {"pg-spark": pg_spark, "pg-direct": pg_direct},
               "server": pg_server, "source": source}
    finally:
        unsubscribe(native_dsn)
        for name in (native, pg_spark, pg_direct, source):
            _drop(pg_server, name)


def _run(staged: dict[str, Any], name: str) -> dict[str, Any]:
    """``pglogical run`` of pipeline ``name``: ``-spark`` through Spark's transforms, the others with no Java."""
    through_spark = name.endswith("-spark")
    env = {"PGLOGICAL_APPLY_DIRECT": "0"} if through_spark else None
    summary, logs = run(staged["specs"][name], staged["tmp"], java=through_spark, env=env)
    assert summary["apply"]["batches_applied"] == 1 and summary["apply"]["spark_started"] is through_spark
    return summary


@pytest.mark.parametrize("name", ["pg-spark", "pg-direct"])
def test_postgres_targets_hold_names_differing_by_case_as_a_native_subscriber(staged, name):
    _run(staged, name)
    dsn = staged["server"].dsn(staged["targets"][name])
    assert {table: query(dsn, sql) for table, sql in ROWS.items()} == staged["expected"]


@pytest.mark.parametrize("name", ["ice-spark", "ice-direct"])
def test_iceberg_targets_hold_names_differing_by_case_as_a_native_subscriber(staged, name):
    _run(staged, name)
    doc = yaml.safe_load(Path(staged["specs"][name]).read_text())
    target = IcebergTarget(IcebergLocation(doc["target"]["catalog"], "lake"), doc["source"]["slot"])
    for table in LAKE_TABLES:
        tbl = target.open(f"public.{table}")
        assert tbl is not None, table
        rows = [tuple(r.values()) for r in tbl.scan().to_arrow().sort_by("id").to_pylist()]
        assert rows == staged["expected"][table], table


def test_a_delta_table_needing_columns_differing_by_case_is_refused_until_columns_leave_one_out(staged):
    spec = staged["specs"]["delta"]
    refused = pglogical("run", "--spec", spec, extra={"JAVA_HOME": str(staged["tmp"] / "no-java-here")})
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()[-1:]
    assert line.startswith("pglogical run: error: ") and '"Val" and "val"' in line and "columns:" in line
    status = json.loads(pglogical("status", "--spec", spec).stdout)
    assert not status["target"]["watermarks"], "a table committed before the refusal"
    # The way out the error names: the table's columns leaving one of them out.
    doc = yaml.safe_load(Path(spec).read_text())
    doc["tables"]["public.mixed"] = {"columns": ["id", "val", "a.b"]}
    Path(spec).write_text(yaml.safe_dump(doc))
    _run(staged, "delta")
    from deltalake import DeltaTable

    def rows(table: str) -> list[tuple]:
        found = DeltaTable(str(staged["tmp"] / "delta" / "public" / table)).to_pyarrow_table().sort_by("id")
        return [tuple(r.values()) for r in found.to_pylist()]

    assert rows("mixed") == [(i, v, ab) for i, _, v, ab in staged["expected"]["mixed"]]
    assert (rows("T"), rows("t")) == (staged["expected"]["T"], staged["expected"]["t"])

    # The table now holds val: a batch writing "Val" instead would need both. Refused before "T" (first in the batch's
    # order) commits, however the clash arose: here by the column list, as by a source dropping val and adding "Val".
    watermarks = json.loads(pglogical("status", "--spec", spec).stdout)["target"]["watermarks"]
    doc["tables"]["public.mixed"] = {"columns": ["id", "Val"]}
    Path(spec).write_text(yaml.safe_dump(doc))
    execute(staged["server"].dsn(staged["source"]), """UPDATE mixed SET "Val" = 12 WHERE id = 1;
        UPDATE "T" SET v = 'upper again' WHERE id = 2;""")
    refused = pglogical("run", "--spec", spec, extra={"JAVA_HOME": str(staged["tmp"] / "no-java-here")})
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()[-1:]
    assert line.startswith("pglogical run: error: ") and '"Val" and "val"' in line and "case-insensitive" in line
    assert json.loads(pglogical("status", "--spec", spec).stdout)["target"]["watermarks"] == watermarks
    assert rows("T") == staged["expected"]["T"]


def test_a_column_named_like_the_applys_own_is_refused_until_columns_leave_it_out(pg_server, tmp_path):
    """A source column ``_pgl_after`` shared Spark's net-changes frame with the apply's own column of that name, which
    overwrote its value (7 arrived as true). Refused before anything commits, naming ``columns:``; with the column
    left out the table ends equal to a native subscriber of a publication listing the same columns, with a row filter
    too, through this process and through Spark's transforms (whose filter evaluation dropped a staged ``_pgl_op``
    along with the change's own ``_pgl_op`` when it sat beside it)."""
    source, native, target = (make_database(pg_server) for _ in range(3))
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, 'CREATE TABLE odd (id int PRIMARY KEY, "_pgl_after" int, "_pgl_op" text, v text);'
                        "CREATE PUBLICATION pub_internal FOR TABLE odd (id, v) WHERE (id <> 3);")
    execute(native_dsn, "CREATE TABLE odd (id int PRIMARY KEY, v text)")
    subscribe(source_dsn, native_dsn, "pub_internal", "sub_internal")
    spec = _write_spec(tmp_path, "internal", pg_server.uri(source), {"kind": "postgres", "dsn": pg_server.uri(target)},
                       {"public.odd": {}})
    try:
        assert run(spec, tmp_path, java=False)[0]["apply"]["batches_seen"] == 0
        execute(source_dsn, "INSERT INTO odd VALUES (1, 7, 'x', 'a'), (2, 8, 'y', 'b'), (3, 9, 'z', 'filtered');"
                            "UPDATE odd SET v = 'c' WHERE id = 2;")
        # Refused when planned, before a session starts for the Spark path (the one that overwrote it; this process's
        # own path kept it, but a batch it does not cover falls back to Spark's).
        refused = pglogical("run", "--spec", spec, extra={"JAVA_HOME": str(tmp_path / "no-java-here"),
                                                          "PGLOGICAL_APPLY_DIRECT": "0"})
        assert refused.returncode == 1
        (line,) = refused.stderr.strip().splitlines()[-1:]
        assert line.startswith("pglogical run: error: ") and '"_pgl_after", "_pgl_op"' in line and "columns:" in line, line
        assert not json.loads(pglogical("status", "--spec", spec).stdout)["target"]["watermarks"]
        # The way out the error names: the table's columns leaving them out (here with the publication's filter).
        doc = yaml.safe_load(Path(spec).read_text())
        doc["tables"]["public.odd"] = {"columns": ["id", "v"], "row_filter": "id <> 3"}
        Path(spec).write_text(yaml.safe_dump(doc))
        assert run(spec, tmp_path, java=False)[0]["apply"]["batches_applied"] == 1
        execute(source_dsn, "INSERT INTO odd VALUES (4, 10, 'w', 'd'); UPDATE odd SET v = 'e' WHERE id = 1;"
                            "UPDATE odd SET v = 'still filtered' WHERE id = 3; DELETE FROM odd WHERE id = 2;")
        through_spark = run(spec, tmp_path, java=True, env={"PGLOGICAL_APPLY_DIRECT": "0"})[0]["apply"]
        assert through_spark["batches_applied"] == 1 and through_spark["spark_started"] is True
        wait_for_subscriber(source_dsn, native_dsn, "sub_internal")
        expected = query(native_dsn, "SELECT id, v FROM odd ORDER BY id")
        assert expected == [(1, "e"), (4, "d")]
        assert query(pg_server.dsn(target), "SELECT id, v FROM odd ORDER BY id") == expected
    finally:
        unsubscribe(native_dsn, "sub_internal")
        for name in (native, target, source):
            _drop(pg_server, name)
