"""Table selection like publications (``schemas:``, ``"*"``, ``schema.*`` with named overrides) through
``decode_pending`` and the apply: tables added to the publication are picked up by the next run, with
their initial copy when ``snapshot.initial`` is on."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.pipeline.runs import apply_config, decode_pending
from airflow_provider_pglogical.pipeline.source import resolved
from airflow_provider_pglogical.pipeline.spec import parse_spec
from scripts.harness.pgserver import execute, make_database, make_target, query


def rows(dsn: str, table: str) -> list[tuple]:
    return query(dsn, f"SELECT * FROM {table} ORDER BY 1")  # module constants only


@pytest.fixture
def source(pg_server):
    database = make_database(pg_server)
    dsn = pg_server.dsn(database)
    yield dsn, f"sel_{database}".lower()
    execute(pg_server.dsn(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                             "WHERE database = %s AND NOT active", params=(database,))
    execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_a_schema_selection_with_an_override_picks_up_a_new_table_with_its_initial_copy(
        spark, pg_server, source, tmp_path):
    src, slot = source
    execute(src, """
        CREATE SCHEMA sales;
        CREATE TABLE sales.orders (id int PRIMARY KEY, amount int);
        CREATE TABLE sales.items (id int PRIMARY KEY, x text);
        CREATE TABLE public.other (id int PRIMARY KEY);
        INSERT INTO sales.orders VALUES (1, 5), (2, 50); INSERT INTO sales.items VALUES (1, 'a');
        INSERT INTO public.other VALUES (1);""")
    _, ours = make_target(pg_server)
    execute(ours, "CREATE SCHEMA sales")
    spec = parse_spec({
        "source": {"dsn": src, "publication": "sel_pub", "slot": slot, "create": True},
        "staging": {"uri": str(tmp_path / "staging")}, "target": {"kind": "postgres", "dsn": ours},
        "schemas": ["sales"],
        "tables": {"sales.orders": {"row_filter": "amount > 10", "target": "public.big_orders"}},
        "snapshot": {"initial": True}}, env={})
    decode_pending(spec)  # creates FOR TABLES IN SCHEMA sales, the slot and the initial copy
    assert query(src, "SELECT puballtables FROM pg_publication WHERE pubname = 'sel_pub'") == [(False,)]
    assert query(src, "SELECT nspname FROM pg_publication_namespace JOIN pg_namespace n ON n.oid = pnnspid") \
        == [("sales",)]
    execute(src, "INSERT INTO sales.orders VALUES (3, 30), (4, 4); UPDATE sales.items SET x = 'b' WHERE id = 1;"
                 "INSERT INTO public.other VALUES (2);")
    decode_pending(spec)
    apply_slot(spark, apply_config(resolved(spec)), ours)
    assert rows(ours, "public.big_orders") == [(2, 50), (3, 30)]
    assert rows(ours, "sales.items") == rows(src, "sales.items") == [(1, "b")]
    assert query(ours, "SELECT to_regclass('public.other')") == [(None,)]
    # A table created in the schema joins the publication; the next run copies it and follows it.
    execute(src, "CREATE TABLE sales.late (id int PRIMARY KEY, v text); INSERT INTO sales.late VALUES (1, 'old');")
    execute(src, "INSERT INTO sales.late VALUES (2, 'new'); UPDATE sales.late SET v = 'old2' WHERE id = 1;")
    result = decode_pending(spec)
    assert result["snapshot"]["tables"]["added"] == ["sales.late"]
    execute(src, "INSERT INTO sales.late VALUES (3, 'after'); DELETE FROM sales.late WHERE id = 2;")
    decode_pending(spec)
    apply_slot(spark, apply_config(resolved(spec)), ours)
    assert rows(ours, "sales.late") == rows(src, "sales.late") == [(1, "old2"), (3, "after")]
    assert rows(ours, "public.big_orders") == [(2, 50), (3, 30)]


def test_every_table_of_an_existing_publication_and_a_clear_error_for_a_target_clash(
        spark, pg_server, source, tmp_path):
    src, slot = source
    execute(src, """
        CREATE TABLE a (id int PRIMARY KEY, v int); CREATE TABLE b (id int PRIMARY KEY, v int);
        CREATE PUBLICATION all_pub FOR TABLE a, b;""")
    _, ours = make_target(pg_server)
    doc = {"source": {"dsn": src, "publication": "all_pub", "slot": slot, "create": True},
           "staging": {"uri": str(tmp_path / "staging")}, "target": {"kind": "postgres", "dsn": ours},
           "tables": {"*": {"actions": ["insert", "update"]}, "public.b": {}}}
    spec = parse_spec(doc, env={})
    decode_pending(spec)  # the existing publication is used as it is
    execute(src, "INSERT INTO a VALUES (1, 1), (2, 2); INSERT INTO b VALUES (1, 1), (2, 2);"
                 "DELETE FROM a WHERE id = 1; DELETE FROM b WHERE id = 1;")
    execute(src, "CREATE TABLE c (id int PRIMARY KEY); ALTER PUBLICATION all_pub ADD TABLE c;"
                 "INSERT INTO c VALUES (7);")
    decode_pending(spec)
    apply_slot(spark, apply_config(resolved(spec)), ours)
    assert rows(ours, "a") == [(1, 1), (2, 2)]  # "*" publishes no delete
    assert rows(ours, "b") == [(2, 2)]  # the named entry: every action
    assert rows(ours, "c") == [(7,)]  # added to the publication after the first run
    clash = parse_spec({**doc, "tables": {"*": {}, "public.a": {"target": "public.b"}}}, env={})
    with pytest.raises(SpecError, match=r"tables\.\* selects the published table public\.b, which is also the "
                                        r"target of tables\.public\.a"):
        resolved(clash)
