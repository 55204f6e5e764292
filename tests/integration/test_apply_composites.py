"""Composites, ranges and multiranges through slot → stage → Spark apply, compared as ``::text`` with the source and a native subscriber.

Composite fields that need record quoting (commas, quotes, backslashes, parentheses, spaces, tab
and newline, the empty string, NULL, an enum label with spaces), a composite nested in a composite
together with an array, a range, a multirange and an array of ranges; arrays of composites (one
with a lower bound ≠ 1); built-in ranges with empty, unbounded, inclusive/exclusive and infinite
bounds; a user-defined range over text with bounds that need range quoting; multiranges next to
arrays of ranges (the same staged type); and a REPLICA IDENTITY FULL table keyed by such columns —
inserted, updated (key changes included) and deleted over two batches.
"""

from __future__ import annotations

import posixpath

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.apply.batches import list_batches
from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database, make_target, query
from scripts.harness.subscriber import drain_all, run_script, subscribe, unsubscribe, wait_for_subscriber

COMP = ("id", "a", "p", "aa", "r4", "rn", "rd", "rtz", "mr", "tr", "tmr", "ar")
FULLKEY = ("a", "r", "mr", "v")
TABLES = {"comp": COMP, "fullkey": FULLKEY}

TYPES = r"""
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy go lucky');
CREATE TYPE addr AS (street text, city text, zip varchar(10), mood mood, amount numeric(10,2));
CREATE TYPE textrange AS RANGE (subtype = text, collation = "C");
CREATE TYPE person AS (name text, home addr, tags text[], span int4range, slots int4multirange, stays daterange[],
  born date);
"""
TABLES_SQL = """
CREATE TABLE comp (id int PRIMARY KEY, a addr, p person, aa addr[], r4 int4range, rn numrange, rd daterange,
  rtz tstzrange, mr int4multirange, tr textrange, tmr textmultirange, ar int4range[]);
CREATE TABLE fullkey (a addr, r numrange, mr datemultirange, v text);
ALTER TABLE fullkey REPLICA IDENTITY FULL;
"""
PUBLICATIONS = "CREATE PUBLICATION pub_native FOR TABLE comp, fullkey; CREATE PUBLICATION pub_all FOR TABLE comp, fullkey;"

BATCH_ONE = [
    r"""INSERT INTO comp (id) VALUES (1);
    INSERT INTO comp VALUES (2,
      ROW('a,b "q" \ (x)', ' spaced ', '', 'happy go lucky', 12.50)::addr,
      ROW('nm', ROW(NULL, E'tab\there\nnl', 'z', 'sad', NULL)::addr, '{x,"y z",NULL,""}', '[1,5)',
          '{[1,3),[7,9)}', '{"[2024-01-01,2024-02-01)",empty,NULL}', '0044-03-15 BC')::person,
      ARRAY[ROW('s1', 'c"1', NULL, 'ok', 1)::addr, NULL, ROW('', NULL, NULL, NULL, NULL)::addr],
      'empty', '(,5.5]', '[2020-01-01,infinity)', '[2024-01-02 03:04:05.678901+00,infinity]',
      '{[1,3),[5,7)}', '["","a,b")', '{["a b","c\"d"],[x,y]}', '{"[1,5)",empty,NULL}');
    INSERT INTO comp VALUES (3, ROW(NULL, NULL, NULL, NULL, NULL)::addr, ROW(NULL, NULL, '{}', 'empty', '{}', '{}', NULL)::person,
      '[0:1]={"(a,b,,sad,1)","(c,d,,ok,2)"}', '(,)', '[1.5,NaN)', '(-infinity,infinity)',
      '(,2024-01-01 00:00:00+05:45]', '{}', '(,)', '{}', '{}');
    INSERT INTO comp (id, r4, rn, rd, rtz, mr, tr, ar) VALUES (4, '[3,)', 'empty', '[0044-03-15 BC,0001-01-01)',
      '(-infinity,"0044-03-15 12:00:00+00 BC")', '{(,0),[9,)}', '["back\\slash","x]")', '{}');""",
    r"""INSERT INTO fullkey VALUES
      (ROW('k,1', NULL, '', 'ok', 1.00)::addr, '[1.5,2.5)', '{[2024-01-01,2024-01-05),[2024-02-01,infinity)}', 'one'),
      (ROW('k2 "q"', 'c', 'z', 'sad', 2.50)::addr, 'empty', '{}', 'two'),
      (ROW('k3 \', ')', '(', 'happy go lucky', 3)::addr, '(,)', '{(,)}', 'three');""",
]
BATCH_TWO = [
    r"""UPDATE comp SET a = ROW('new, "street"', NULL, NULL, 'ok', -0.01)::addr, mr = '{[10,20)}',
      ar = '{"(,)"}' WHERE id = 2;
    UPDATE comp SET p.name = 'renamed (x)', r4 = '[-5,-1)', tmr = '{(,"")}' WHERE id = 2;
    UPDATE comp SET aa[-1] = ROW('z', '"y"', NULL, 'happy go lucky', NULL)::addr, rd = 'empty' WHERE id = 4;
    DELETE FROM comp WHERE id = 3;
    INSERT INTO comp (id, a, aa) VALUES (5, ROW('\\', '""', ' ', NULL, 0)::addr, '{}');""",
    # REPLICA IDENTITY FULL: rows found by their composite, range and multirange values
    r"""UPDATE fullkey SET v = 'one!' WHERE v = 'one';
    UPDATE fullkey SET a = ROW('k2 moved', NULL, NULL, NULL, NULL)::addr, mr = '{[2024-03-01,2024-03-02)}'
      WHERE v = 'two';
    DELETE FROM fullkey WHERE v = 'three';""",
]


def texts(dsn: str, table: str) -> list[tuple]:
    """Every column as PostgreSQL's own text, rows in a deterministic order."""
    columns = TABLES[table]
    select = ", ".join(f"{c}::text" for c in columns)  # identifiers are this module's constants
    order = ", ".join(str(i + 1) for i in range(len(columns)))
    return query(dsn, f"SELECT {select} FROM {table} ORDER BY {order}")


def staged_comp_schema(uri: str) -> pa.StructType:
    batch = list_batches(uri, "ours")[0]
    (path,) = batch.table_files["public.comp"]
    return pq.read_schema(posixpath.join(batch.ref.path, path)).field("new").type


def test_composites_ranges_and_multiranges_apply_exactly_like_a_native_subscriber(server_15_and_17, spark, tmp_path):
    server = server_15_and_17
    source, native = make_database(server), make_database(server)
    ours_db, ours = make_target(server)
    source_dsn, native_dsn = server.dsn(source), server.dsn(native)
    execute(source_dsn, TYPES + TABLES_SQL + PUBLICATIONS)
    execute(native_dsn, TYPES + TABLES_SQL)
    execute(server.dsn(ours_db), TYPES)  # ours: the apply creates the tables from the staged relations
    subscribe(source_dsn, native_dsn)
    PgLogicalHook.from_dsn(source_dsn).create_slot("ours")
    uri = str(tmp_path / "staging")
    try:
        run_script(source_dsn, BATCH_ONE)
        assert drain_all(source_dsn, uri) == 1
        run_script(source_dsn, BATCH_TWO)
        assert drain_all(source_dsn, uri) == 1
        config = ApplyConfig(slot="ours", staging_root=uri, tables={})
        reports = apply_slot(spark, config, ours)
        assert [r.applied for r in reports] == [True, True]
        wait_for_subscriber(source_dsn, native_dsn)
        for table in TABLES:
            assert texts(ours, table) == texts(source_dsn, table), table
            assert texts(native_dsn, table) == texts(source_dsn, table), table
        # Not vacuous: the values are really staged typed (not as raw bytes) and the hard ones are there.
        staged = staged_comp_schema(uri)
        assert pa.types.is_struct(staged.field("p").type) and staged.field("p").type.field("home").type.num_fields == 5
        assert staged.field("mr").type == staged.field("ar").type  # a multirange and a range array look alike
        comp = {r[0]: dict(zip(COMP, r, strict=True)) for r in texts(source_dsn, "comp")}
        assert comp["2"]["a"] == '("new, ""street""",,,ok,-0.01)'
        assert comp["2"]["p"].startswith('("renamed (x)","(,""tab\there\nnl"",z,sad,)","{x,""y z"",NULL,""""}"')
        assert (comp["2"]["mr"], comp["2"]["ar"], comp["2"]["tr"]) == ("{[10,20)}", '{"(,)"}', '["","a,b")')
        assert comp["4"]["aa"] == '[-1:-1]={"(z,\\"\\"\\"y\\"\\"\\",,\\"happy go lucky\\",)"}'
        assert comp["4"]["tr"] == '["back\\\\slash","x]")' and comp["4"]["rd"] == "empty"
        assert comp["5"]["a"] == r'("\\\\",""""""," ",,0.00)' and "3" not in comp
        fullkey = texts(source_dsn, "fullkey")
        assert sorted(r[-1] for r in fullkey) == ["one!", "two"]
        assert any(r[2].endswith(",[2024-02-01,infinity)}") for r in fullkey)
        # two key changes and a delete, each matched on the composite, range and multirange values
        assert {k: reports[1].rows["public.fullkey"][k] for k in ("deleted", "inserted")} == {"deleted": 3, "inserted": 2}
        assert [r.applied for r in apply_slot(spark, config, ours)] == [False, False]  # replay: no-op
    finally:
        unsubscribe(native_dsn)
        execute(server.dsn(), f'DROP DATABASE IF EXISTS "{native}" WITH (FORCE)')
        execute(server.dsn(), f'DROP DATABASE IF EXISTS "{source}" WITH (FORCE)')
