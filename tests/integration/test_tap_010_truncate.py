"""PostgreSQL's src/test/subscription/t/010_truncate.pl, ported to one pipeline (drain → stage → Spark apply).

The TAP test's subscriber rows are inserted into our target directly, its publications become the
pipeline's per-table ``actions`` and table selection, and its expected results are asserted as
written there. Its two subscriptions of one table (tab5, no primary key) become one pipeline, so
the insert is expected once instead of twice.
"""

from __future__ import annotations

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from scripts.harness.pgserver import execute, make_target, query
from scripts.harness.subscriber import drain_all, run_script
from tests.support.parity import source_with_slot

SCHEMA = """
CREATE TABLE tab1 (a int PRIMARY KEY);
CREATE TABLE tab2 (a int PRIMARY KEY);
CREATE TABLE tab3 (a int PRIMARY KEY);
CREATE TABLE tab4 (x int PRIMARY KEY, y int REFERENCES tab3);
CREATE TABLE tab5 (a int);
"""
ALL = ("insert", "update", "delete", "truncate")


def test_010_truncate(pg_server, spark, tmp_path):
    with source_with_slot(pg_server, SCHEMA + "CREATE PUBLICATION pub_all FOR TABLE tab1, tab2, tab3, tab4, tab5;") \
            as (src, slot):
        run_010(spark, src, slot, make_target(pg_server)[1], str(tmp_path / "staging"))


def run_010(spark, src: str, slot: str, ours: str, uri: str) -> None:
    execute(ours, SCHEMA + "CREATE SEQUENCE seq1 OWNED BY tab1.a; ALTER SEQUENCE seq1 START 101;")

    def step(transactions: list[str], **tables: TableApplyConfig) -> None:
        run_script(src, transactions)
        drain_all(src, uri, slot=slot)
        apply_slot(spark, ApplyConfig(slot=slot, staging_root=uri,
                                      tables={f"public.{t}": c for t, c in tables.items()}), ours)

    def result(sql: str) -> str:
        return "|".join("" if v is None else str(v) for v in query(ours, sql)[0])

    sub1 = {"tab1": TableApplyConfig()}
    execute(ours, "INSERT INTO tab1 VALUES (1), (2), (3)")
    step(["TRUNCATE tab1;"], **sub1)
    assert result("SELECT count(*), min(a), max(a) FROM tab1") == "0||", "truncate replicated"
    assert result("SELECT nextval('seq1')") == "1", "sequence not restarted"

    step(["TRUNCATE tab1 RESTART IDENTITY;"], **sub1)
    assert result("SELECT nextval('seq1')") == "101", "truncate restarted identities"

    # pub2: publish = insert
    execute(ours, "INSERT INTO tab2 VALUES (1), (2), (3)")
    step(["TRUNCATE tab2;"], tab2=TableApplyConfig(actions=("insert",)))
    assert result("SELECT count(*), min(a), max(a) FROM tab2") == "3|1|3", "truncate not replicated"
    step(["TRUNCATE tab2;"], tab2=TableApplyConfig(actions=("insert", "truncate")))
    assert result("SELECT count(*), min(a), max(a) FROM tab2") == "0||", "truncate replicated after publication change"

    # pub3: tables connected by foreign keys
    execute(ours, "INSERT INTO tab3 VALUES (1), (2), (3)", "INSERT INTO tab4 VALUES (11, 1), (111, 1), (22, 2)")
    step(["TRUNCATE tab3, tab4;"], tab3=TableApplyConfig(), tab4=TableApplyConfig())
    assert result("SELECT count(*), min(a), max(a) FROM tab3") == "0||", "truncate of multiple tables replicated"
    assert result("SELECT count(*), min(x), max(x) FROM tab4") == "0||", "truncate of multiple tables replicated"

    # tab2 no longer published
    execute(ours, "INSERT INTO tab1 VALUES (1), (2), (3)", "INSERT INTO tab2 VALUES (1), (2), (3)")
    step(["TRUNCATE tab1, tab2;"], **sub1)
    assert result("SELECT count(*), min(a), max(a) FROM tab1") == "0||", "truncate of multiple tables some not published"
    assert result("SELECT count(*), min(a), max(a) FROM tab2") == "3|1|3", \
        "truncate of multiple tables some not published"

    # tab5 has no primary key (no replica identity): its INSERTs and TRUNCATE replicate.
    step(["INSERT INTO tab5 VALUES (1), (2), (3);"], tab5=TableApplyConfig(actions=ALL))
    assert result("SELECT count(*), min(a), max(a) FROM tab5") == "3|1|3", "insert replicated"
    step(["TRUNCATE tab5;"], tab5=TableApplyConfig(actions=ALL))
    assert result("SELECT count(*), min(a), max(a) FROM tab5") == "0||", "truncate replicated"
