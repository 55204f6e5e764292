"""Every hard-to-stage type through slot → stage → Spark apply, compared as ``::text`` with the source and a native subscriber.

Intervals (mixed signs, field extremes, 17+ ±infinity), time 24:00:00, timetz in odd zones, BC and
five-digit-year dates/timestamps, numeric NaN in a numeric(10,2) column, ±Infinity in numeric,
multi-dimensional arrays and arrays with lower bounds ≠ 1 — inserted, updated (also as key
columns, and as an unchanged TOAST value) and deleted, over two batches.
"""

from __future__ import annotations

import posixpath

import pyarrow.parquet as pq

from airflow_provider_pglogical.apply.batches import list_batches
from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database, make_target, query
from scripts.harness.subscriber import drain_all, run_script, subscribe, unsubscribe, wait_for_subscriber

TYPED = ("id", "iv", "tm", "ttz", "d", "ts", "tstz", "n", "nu", "ai", "an", "at", "aiv", "ad", "ats", "attz", "anu")
KEYED = ("d", "ts", "tstz", "tm", "ttz", "iv", "n", "a", "v")
WIDE = ("id", "v", "grid", "amounts")
EDGE = ("id", "iv")
CASH = ("id", "m", "ms")
TABLES = {"typed": TYPED, "keyed": KEYED, "wide": WIDE, "edge": EDGE, "cash": CASH}

SCHEMA = """
CREATE TABLE typed (id int PRIMARY KEY, iv interval, tm time, ttz timetz, d date, ts timestamp, tstz timestamptz,
  n numeric(10,2), nu numeric, ai int[], an numeric(6,2)[], at text[], aiv interval[], ad date[],
  ats timestamptz[], attz timetz[], anu numeric[]);
CREATE TABLE keyed (d date, ts timestamp, tstz timestamptz, tm time, ttz timetz, iv interval, n numeric(10,2),
  a int[], v text, PRIMARY KEY (d, ts, tstz, tm, ttz, iv, n, a));
CREATE TABLE wide (id int PRIMARY KEY, v int, grid int[], amounts numeric(10,2)[]);
ALTER TABLE wide REPLICA IDENTITY FULL;
ALTER TABLE wide ALTER grid SET STORAGE EXTERNAL;
CREATE TABLE edge (id int PRIMARY KEY, iv interval);
CREATE TABLE cash (id int PRIMARY KEY, m money, ms money[]);
"""
# edge holds a value PostgreSQL prints but cannot read back (time = INT64_MIN), so a text-mode
# native subscriber would fail on it: only our apply gets it.
PUBLICATIONS = """
CREATE PUBLICATION pub_native FOR TABLE typed, keyed, wide, cash;
CREATE PUBLICATION pub_all FOR TABLE typed, keyed, wide, edge, cash;
"""

BATCH_ONE = [
    """INSERT INTO typed (id) VALUES (1);
    INSERT INTO typed VALUES (2, '1 year 2 mons -3 days +04:05:06.789', '13:14:15.123456', '01:02:03.5+05:45',
      '2024-02-29', '2024-01-02 03:04:05.678901', '2024-01-02 03:04:05.678901+02', 12.34, '123.4500',
      '{1,NULL,3}', '{1.10,NaN}', '{"a b","q\\"",NULL,"NULL"}', '{"1 day","-1 mons +2 days"}',
      '{2024-01-01,infinity,"0044-03-15 BC"}', '{"2024-01-01 00:00:00+00",-infinity}',
      '{"24:00:00-03:30","00:00:00+15:59:59"}', '{Infinity,-Infinity,NaN,1.5}');
    INSERT INTO typed VALUES (3, '-178956970 years -8 mons -2147483648 days -2562047788:00:54.775807', '24:00:00',
      '24:00:00-03:30', '0044-03-15 BC', '4713-01-01 00:00:00 BC', '0001-12-31 23:59:59.999999+00 BC', 'NaN',
      'Infinity', '[0:2]={1,2,3}', '[2:3]={NaN,-1.50}', '[0:1][-2:0]={{a,NULL,c},{d,e,NULL}}',
      '[-1:0]={"178956970 years 7 mons 2147483647 days 2562047788:00:54.775807","00:00:00"}',
      '{{infinity,-infinity},{"0001-01-01 BC","10000-01-01"}}', '[5:5]={"0044-03-15 12:00:00+00 BC"}',
      '{{"12:00+05:45"},{"12:00-03:30"}}', '{{NaN,Infinity},{-Infinity,0}}');
    INSERT INTO typed (id, iv, tm, ttz, d, ts, tstz, n, nu, ai, an) VALUES (4, '00:00:00.000001', '00:00:00',
      '00:00:00+00', 'infinity', '294246-12-31 23:59:59.999999', '-infinity', -99999999.99, '-Infinity', '{}', '{}');
    INSERT INTO typed (id, iv, tm, ttz, d, ts, tstz, n) VALUES (5, '1 mon -1 days +00:00:00.000001',
      '23:59:59.999999', '23:59:59.999999-15:59:59', '5874897-12-31', '10000-01-01 00:00:00',
      '12345-06-07 08:09:10.111111+00', 0.01);""",
    """INSERT INTO keyed VALUES ('0044-03-15 BC', '4713-01-01 00:00:00 BC', 'infinity', '24:00:00', '24:00:00-03:30',
      '-1 mons +3 days', 'NaN', '[0:2]={1,2,3}', 'k1');
    INSERT INTO keyed VALUES ('0044-03-15 BC', '4713-01-01 00:00:00 BC', 'infinity', '24:00:00', '24:00:00-03:30',
      '-1 mons +3 days', 1.5, '{1,2,3}', 'k2');
    INSERT INTO keyed VALUES ('10000-01-01', '-infinity', '0044-03-15 12:00:00+05:45 BC', '00:00:00', '00:00:00+05:45',
      '2562047788:00:54.775807', 'NaN', '{{1,2},{3,4}}', 'k3');
    INSERT INTO wide VALUES (1, 1, array_fill(7, ARRAY[10, 100], ARRAY[0, -5]), '[0:1]={NaN,1.00}');
    INSERT INTO edge VALUES (1, '-2562047788:00:54.775807'::interval - '00:00:00.000001'::interval);
    INSERT INTO cash VALUES (1, 1234.56, '{0.01,-92233720368547758.08}'), (2, '-92233720368547758.08', NULL),
      (3, NULL, '{}');""",
    # in the same batch: an insert updated twice and a NaN replaced by a number and back
    """INSERT INTO typed (id, n, ai) VALUES (6, 'NaN', '[0:0]={1}'); UPDATE typed SET n = 1, ai = '{1}' WHERE id = 6;
    UPDATE typed SET n = 'NaN', ai = '[3:4]={5,6}', iv = '-00:00:00.000001' WHERE id = 6;""",
]
BATCH_TWO = [
    """UPDATE typed SET n = 'NaN', an = '[0:0]={NaN}', ai = '{{1,2},{3,4}}', d = '0001-01-01 BC',
      ts = '0001-01-01 00:00:00 BC', iv = '-1 mons +1 days -00:00:01', ttz = '12:00:00-03:30' WHERE id = 2;
    UPDATE typed SET n = 1.00, ai = '{7}', an = '{NaN}', at = '{x}', iv = '1 day' WHERE id = 3;
    DELETE FROM typed WHERE id = 4;
    INSERT INTO typed (id, ad, ats) VALUES (7, '[-3:-2]={"0002-02-02 BC",infinity}', '{"10000-01-01 00:00:00+00"}');""",
    # key columns of these types: plain update, key change (lower bound only), delete
    """UPDATE keyed SET v = 'k1b' WHERE a = '[0:2]={1,2,3}';
    UPDATE keyed SET a = '[-5:-3]={1,2,3}', tm = '24:00:00' WHERE v = 'k2';
    DELETE FROM keyed WHERE v = 'k3';""",
    # REPLICA IDENTITY FULL: grid is unchanged TOAST ('u'); its value and shape come from the old image
    "UPDATE wide SET v = 2 WHERE id = 1; UPDATE edge SET id = 2 WHERE id = 1;",
    # money is staged as int64 minor units: only the target type says it is not a bigint
    "UPDATE cash SET m = m + '1.00'::money, ms = '{92233720368547758.07}' WHERE id = 1; DELETE FROM cash WHERE id = 3;",
]
INFINITE_INTERVALS = """INSERT INTO typed (id, iv, aiv) VALUES (8, 'infinity', '{infinity,-infinity}'),
    (9, '-infinity', '[0:0]={infinity}'); UPDATE typed SET iv = '-infinity' WHERE id = 2;"""


def texts(dsn: str, table: str) -> list[tuple]:
    """Every column as PostgreSQL's own text, rows in a deterministic order."""
    columns = TABLES[table]
    select = ", ".join(f"{c}::text" for c in columns)  # identifiers are this module's constants
    order = ", ".join(str(i + 1) for i in range(len(columns)))
    return query(dsn, f"SELECT {select} FROM {table} ORDER BY {order}")


def staged_wide_update(uri: str) -> dict:
    """The staged UPDATE of wide in the second batch (to prove the unchanged-TOAST path was taken)."""
    batch = list_batches(uri, "ours")[1]
    (path,) = batch.table_files["public.wide"]
    (row,) = pq.read_table(posixpath.join(batch.ref.path, path)).to_pylist()
    return row


def test_every_staged_type_round_trips_exactly_like_a_native_subscriber(server_15_and_17, spark, tmp_path):
    server = server_15_and_17
    source, native = make_database(server), make_database(server)
    _, ours = make_target(server)
    source_dsn, native_dsn = server.dsn(source), server.dsn(native)
    execute(source_dsn, SCHEMA + PUBLICATIONS)
    execute(native_dsn, SCHEMA)  # ours: the apply creates every table from the staged relation
    subscribe(source_dsn, native_dsn)
    PgLogicalHook.from_dsn(source_dsn).create_slot("ours")
    uri = str(tmp_path / "staging")
    second = BATCH_TWO + ([INFINITE_INTERVALS] if server.version_num >= 170000 else [])
    try:
        run_script(source_dsn, BATCH_ONE)
        assert drain_all(source_dsn, uri) == 1
        run_script(source_dsn, second)
        assert drain_all(source_dsn, uri) == 1
        config = ApplyConfig(slot="ours", staging_root=uri, tables={})
        assert [r.applied for r in apply_slot(spark, config, ours)] == [True, True]
        wait_for_subscriber(source_dsn, native_dsn)
        for table in TABLES:
            assert texts(ours, table) == texts(source_dsn, table), table
            if table != "edge":
                assert texts(native_dsn, table) == texts(source_dsn, table), table
        # Not vacuous: the hard values are really there, and the TOAST path was really taken.
        typed = {r[0]: dict(zip(TYPED, r, strict=True)) for r in texts(source_dsn, "typed")}
        assert typed["3"]["ai"] == "{7}" and typed["3"]["at"] == "{x}" and typed["3"]["tm"] == "24:00:00"
        assert typed["2"]["n"] == "NaN" and typed["2"]["an"] == "[0:0]={NaN}" and typed["2"]["d"] == "0001-01-01 BC"
        assert typed["3"]["aiv"].startswith("[-1:0]={") and typed["7"]["ad"] == "[-3:-2]={\"0002-02-02 BC\",infinity}"
        assert typed["6"]["ai"] == "[3:4]={5,6}" and typed["6"]["n"] == "NaN"
        assert typed["5"]["ttz"] == "23:59:59.999999-15:59:59" and typed["5"]["d"] == "5874897-12-31"
        assert "4" not in typed and sorted(r[-1] for r in texts(source_dsn, "keyed")) == ["k1b", "k2"]
        assert texts(source_dsn, "wide")[0][2].startswith("[0:9][-5:94]={{7,")
        if server.version_num >= 170000:
            assert (typed["2"]["iv"], typed["8"]["iv"], typed["9"]["aiv"]) == ("-infinity", "infinity", "[0:0]={infinity}")
        update = staged_wide_update(uri)
        assert update["new_unchanged_toast"] == ["grid"] and dict(update["old_value_notes"])["grid"] == "[0:9][-5:94]"
        assert [r.applied for r in apply_slot(spark, config, ours)] == [False, False]  # replay: no-op
    finally:
        unsubscribe(native_dsn)
        execute(server.dsn(), f'DROP DATABASE IF EXISTS "{native}" WITH (FORCE)')
        execute(server.dsn(), f'DROP DATABASE IF EXISTS "{source}" WITH (FORCE)')
