"""Spark apply into a real PostgreSQL target: DML, FKs, TRUNCATE, idempotent replay, TOAST rejects, types."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.exceptions import ApplyError, RowFilterError, UnresolvableToastError
from scripts.harness.pgserver import execute, make_target
from scripts.harness.pgserver import query as rows
from tests.support.stage import BatchSpec, Chg, Col, Rel, Trunc, write_batch

PARENT = Rel("public", "parent", (Col("id", pa.int64(), "bigint", True), Col("name", pa.string(), "text")))
CHILD = Rel("public", "child", (Col("id", pa.int64(), "bigint", True), Col("parent_id", pa.int64(), "bigint"),
                                Col("body", pa.string(), "text")), relid=17000)


@pytest.fixture
def target(pg_server):
    _, dsn = make_target(pg_server)
    return dsn


def run(spark, tmp_path, dsn, tables=None, slot="s1"):
    config = ApplyConfig(slot=slot, staging_root=str(tmp_path), tables=tables or {})
    return apply_slot(spark, config, dsn)


def fk_schema(dsn):
    execute(dsn, "CREATE TABLE parent (id bigint PRIMARY KEY, name text)",
            "CREATE TABLE child (id bigint PRIMARY KEY, parent_id bigint REFERENCES parent, body text)")


def test_dml_is_applied_and_missing_rows_are_skipped_and_counted(spark, tmp_path, target):
    execute(target, "CREATE TABLE parent (id bigint PRIMARY KEY, name text)",
            "INSERT INTO parent VALUES (1, 'one'), (2, 'two')")
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {PARENT: [
        Chg("I", 0x110, 0, new={"id": 3, "name": "three"}),
        Chg("U", 0x120, 0, new={"id": 1, "name": "uno"}),
        Chg("D", 0x130, 0, old={"id": 2}, old_key_only=True),
        Chg("U", 0x140, 0, new={"id": 99, "name": "ghost"}),
        Chg("D", 0x150, 0, old={"id": 98}, old_key_only=True),
    ]}))
    (report,) = run(spark, tmp_path, target)
    assert rows(target, "SELECT * FROM parent ORDER BY id") == [(1, "uno"), (3, "three")]
    assert report.rows["public.parent"]["skipped_missing_update"] == 1
    assert rows(target, "SELECT slot, target_table, end_lsn::text FROM pglogical_progress") == \
        [("s1", "public.parent", "0/200")]


def test_reapplying_applied_batches_changes_nothing(spark, tmp_path, target):
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {PARENT: [Chg("I", 0x110, 0, new={"id": 1, "name": "a"})]}))
    run(spark, tmp_path, target)
    execute(target, "UPDATE parent SET name = 'changed locally'")
    write_batch(tmp_path, "s1", BatchSpec(0x200, 0x300, {PARENT: [Chg("I", 0x210, 0, new={"id": 2, "name": "b"})]}))
    reports = run(spark, tmp_path, target)
    assert [r.applied for r in reports] == [False, True]
    assert rows(target, "SELECT * FROM parent ORDER BY id") == [(1, "changed locally"), (2, "b")]
    assert [r.applied for r in run(spark, tmp_path, target)] == [False, False]


def test_fk_linked_tables_get_deletes_children_first_and_inserts_parents_first(spark, tmp_path, target):
    fk_schema(target)
    execute(target, "INSERT INTO parent VALUES (1, 'old')", "INSERT INTO child VALUES (10, 1, 'c')")
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {
        PARENT: [Chg("I", 0x110, 0, new={"id": 2, "name": "new"}), Chg("D", 0x120, 1, old={"id": 1}, old_key_only=True)],
        CHILD: [Chg("I", 0x110, 1, new={"id": 20, "parent_id": 2, "body": "x"}),
                Chg("D", 0x120, 0, old={"id": 10}, old_key_only=True)],
    }))
    run(spark, tmp_path, target)
    assert rows(target, "SELECT * FROM parent") == [(2, "new")]
    assert rows(target, "SELECT * FROM child") == [(20, 2, "x")]


def test_truncate_restart_identity_empties_and_restarts_owned_sequences(spark, tmp_path, target):
    rel = Rel("public", "seqd", (Col("id", pa.int64(), "bigint", True), Col("v", pa.string(), "text")))
    execute(target, "CREATE TABLE seqd (id bigserial PRIMARY KEY, v text)", "INSERT INTO seqd (v) VALUES ('a'), ('b')")
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {rel: [
        Chg("I", 0x110, 0, new={"id": 50, "v": "void"}),
        Chg("I", 0x120, 1, new={"id": 51, "v": "kept"}),
    ]}, truncates=[Trunc(0x120, 0, ("public.seqd",), restart_identity=True)]))
    run(spark, tmp_path, target)
    assert rows(target, "SELECT * FROM seqd") == [(51, "kept")]
    assert rows(target, "SELECT nextval('seqd_id_seq')") == [(1,)]


@pytest.mark.parametrize("policy", ["follow_source", "never"])
def test_truncate_cascade_follows_the_source_unless_told_never(spark, tmp_path, target, policy):
    fk_schema(target)
    execute(target, "INSERT INTO parent VALUES (1, 'p')", "INSERT INTO child VALUES (10, 1, 'c')")
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {PARENT: [Chg("I", 0x130, 0, new={"id": 5, "name": "after"})]},
                                          truncates=[Trunc(0x120, 0, ("public.parent",), cascade=True)]))
    tables = {"public.parent": TableApplyConfig(truncate_cascade=policy), "public.child": TableApplyConfig()}
    if policy == "never":
        with pytest.raises(ApplyError, match="foreign key"):
            run(spark, tmp_path, target, tables)
        assert rows(target, "SELECT count(*) FROM child") == [(1,)]
        assert rows(target, "SELECT count(*) FROM pglogical_progress") == [(0,)]
    else:
        run(spark, tmp_path, target, tables)
        assert rows(target, "SELECT count(*) FROM child") == [(0,)]
        assert rows(target, "SELECT * FROM parent") == [(5, "after")]


def test_unresolvable_toast_goes_to_rejects_or_fails_by_policy(spark, tmp_path, target):
    fk_schema(target)
    execute(target, "INSERT INTO child VALUES (1, NULL, 'big')")
    # Key change with a K image: the unchanged body of row 2 exists nowhere (row 1 is gone).
    changes = {CHILD: [Chg("D", 0x110, 0, old={"id": 1}, old_key_only=True),
                       Chg("I", 0x110, 1, new={"id": 2, "parent_id": None, "body": None}, toast=("body",)),
                       Chg("I", 0x110, 2, new={"id": 3, "parent_id": None, "body": "fine"})]}
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, changes))
    with pytest.raises(UnresolvableToastError) as info:
        run(spark, tmp_path, target, {"public.child": TableApplyConfig()})
    assert "big" not in str(info.value)
    assert rows(target, "SELECT id FROM child") == [(1,)]
    run(spark, tmp_path, target, {"public.child": TableApplyConfig(unchanged_toast="reject_and_continue")})
    assert rows(target, "SELECT id, body FROM child ORDER BY id") == [(3, "fine")]
    assert rows(target, "SELECT slot, table_name, key FROM pglogical_rejects") == [("s1", "public.child", {"id": 2})]


def test_unchanged_toast_in_an_update_keeps_the_target_value(spark, tmp_path, target):
    fk_schema(target)
    execute(target, "INSERT INTO child VALUES (1, NULL, 'big')")
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {CHILD: [
        Chg("U", 0x110, 0, new={"id": 1, "parent_id": None, "body": None}, toast=("body",))]}))
    run(spark, tmp_path, target)
    assert rows(target, "SELECT * FROM child") == [(1, None, "big")]


def test_strict_conflict_policy_refuses_inserts_of_existing_keys(spark, tmp_path, target):
    execute(target, "CREATE TABLE parent (id bigint PRIMARY KEY, name text)", "INSERT INTO parent VALUES (1, 'x')")
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {PARENT: [Chg("I", 0x110, 0, new={"id": 1, "name": "y"})]}))
    with pytest.raises(ApplyError, match="strict"):
        run(spark, tmp_path, target, {"public.parent": TableApplyConfig(conflict="strict")})
    run(spark, tmp_path, target, {"public.parent": TableApplyConfig()})
    assert rows(target, "SELECT * FROM parent") == [(1, "y")]


def test_invalid_row_filters_fail_before_anything_is_written(spark, tmp_path, target):
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {PARENT: [Chg("I", 0x110, 0, new={"id": 1, "name": "y"})]}))
    with pytest.raises(RowFilterError):
        run(spark, tmp_path, target, {"public.parent": TableApplyConfig(row_filter="nope = 'x'")})
    assert rows(target, "SELECT count(*) FROM pg_tables WHERE tablename IN ('parent', 'pglogical_progress')") == [(0,)]


def test_row_filter_and_column_list_shape_what_reaches_the_target(spark, tmp_path, target):
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {CHILD: [
        Chg("I", 0x110, 0, new={"id": 1, "parent_id": 1, "body": "a"}),
        Chg("I", 0x110, 1, new={"id": 7, "parent_id": 1, "body": "b"}),
        Chg("U", 0x120, 0, old={"id": 7}, old_key_only=True, new={"id": 2, "parent_id": 2, "body": "b"}),
    ]}))
    cfg = TableApplyConfig(row_filter="id > 5", columns=("id", "body"), target="filtered_child")
    run(spark, tmp_path, target, {"public.child": cfg})
    # id 7 -> 2 leaves the filter: UPDATE became DELETE; the created table has only listed columns.
    assert rows(target, "SELECT count(*) FROM filtered_child") == [(0,)]
    assert rows(target, "SELECT column_name FROM information_schema.columns WHERE table_name = 'filtered_child' "
                        "ORDER BY ordinal_position") == [("id",), ("body",)]


def test_missing_tables_are_created_with_exact_types_and_values_round_trip(spark, tmp_path, target):
    rel = Rel("public", "typed", (
        Col("id", pa.int32(), "integer", True), Col("n", pa.decimal128(12, 2), "numeric(12,2)"),
        Col("f", pa.float64(), "double precision"), Col("b", pa.bool_(), "boolean"),
        Col("t", pa.string(), "text"), Col("raw", pa.binary(), "bytea"), Col("d", pa.date32(), "date"),
        Col("ts", pa.timestamp("us", tz="UTC"), "timestamp with time zone"),
        Col("lts", pa.timestamp("us"), "timestamp without time zone"),
        Col("u", pa.string(), "uuid"), Col("j", pa.string(), "jsonb"), Col("arr", pa.list_(pa.int64()), "bigint[]"),
        Col("tags", pa.list_(pa.string()), "text[]")))
    u = uuid.uuid4()
    row = {"id": 1, "n": Decimal("1234.50"), "f": float("nan"), "b": True, "t": "tab\there\nnew \\ line",
           "raw": b"\x00\xff", "d": dt.date(2024, 2, 29), "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
           "lts": dt.datetime(2024, 1, 2, 3, 4, 5), "u": str(u), "j": '{"a": [1, 2]}', "arr": [1, None, 3],
           "tags": ['a "q"', "b,c", None]}
    infinite = {"id": 2, "d": 2**31 - 1, "ts": -(2**63), "lts": 2**63 - 1}  # staged ±infinity extremes
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {rel: [Chg("I", 0x110, 0, new=row),
                                                               Chg("I", 0x110, 1, new=infinite)]}))
    run(spark, tmp_path, target)
    assert rows(target, "SELECT d::text, ts::text, lts::text FROM typed WHERE id = 2") == \
        [("infinity", "-infinity", "infinity")]
    types = rows(target, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'typed'::regclass "
                         "AND attnum > 0 ORDER BY attnum")
    assert [t for (t,) in types] == [c.type_name for c in rel.columns]
    (got,) = rows(target, "SELECT id, n, f::text, b, t, raw, d, ts, lts, u, j, arr, tags FROM typed WHERE id = 1")
    assert got[:3] == (1, Decimal("1234.50"), "NaN")
    assert got[3:5] == (True, row["t"]) and bytes(got[5]) == b"\x00\xff" and got[6] == row["d"]
    assert got[7] == row["ts"] and got[8] == row["lts"] and got[9] == str(u)
    assert got[10] == {"a": [1, 2]} and got[11] == [1, None, 3] and got[12] == row["tags"]
    assert rows(target, "SELECT count(*) FROM pg_constraint WHERE conrelid = 'typed'::regclass AND contype = 'p'") == [(1,)]


def test_a_key_change_keeps_unchanged_toast_values_from_the_old_row(spark, tmp_path, target):
    fk_schema(target)
    execute(target, "INSERT INTO child VALUES (1, NULL, 'big')")
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {CHILD: [
        Chg("U", 0x110, 0, old={"id": 1}, old_key_only=True, new={"id": 2, "parent_id": None, "body": None},
            toast=("body",))]}))
    run(spark, tmp_path, target)
    assert rows(target, "SELECT * FROM child") == [(2, None, "big")]


def test_a_concurrent_apply_of_the_same_slot_fails_fast(spark, tmp_path, target):
    import psycopg2

    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {PARENT: [Chg("I", 0x110, 0, new={"id": 1, "name": "a"})]}))
    holder = psycopg2.connect(target)
    with holder.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(hashtextextended('pglogical-apply:s1', 0))")
    try:
        with pytest.raises(ApplyError, match="another apply"):
            run(spark, tmp_path, target)
    finally:
        holder.close()
    run(spark, tmp_path, target)
    assert rows(target, "SELECT * FROM parent") == [(1, "a")]


def test_postgres_errors_are_reported_without_row_values(spark, tmp_path, target):
    fk_schema(target)
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {CHILD: [
        Chg("I", 0x110, 0, new={"id": 1, "parent_id": 424242, "body": "secret-body"})]}))
    with pytest.raises(ApplyError) as info:
        run(spark, tmp_path, target)
    assert "foreign key" in str(info.value)
    assert "424242" not in str(info.value) and "secret-body" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_replaying_batches_without_a_watermark_upserts_to_the_same_state(spark, tmp_path, target):
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {PARENT: [
        Chg("I", 0x110, 0, new={"id": 1, "name": "a"}), Chg("I", 0x110, 1, new={"id": 2, "name": "b"}),
        Chg("U", 0x120, 0, new={"id": 1, "name": "a2"}), Chg("D", 0x130, 0, old={"id": 2}, old_key_only=True)]}))
    run(spark, tmp_path, target)
    execute(target, "DELETE FROM pglogical_progress")  # as if the watermark commit had been lost
    for record in (tmp_path / "s1" / "state").glob("target-*.json"):  # (and the apply had not recorded it)
        record.unlink()
    run(spark, tmp_path, target)
    assert rows(target, "SELECT * FROM parent") == [(1, "a2")]


def test_a_failed_copy_names_its_position_but_never_the_value(target):
    import psycopg2

    from airflow_provider_pglogical.apply.targets.postgres.copy import copy_rows, create_staging

    conn = psycopg2.connect(target)
    create_staging(conn, "stg", [("n", "int")])
    conn.close()
    with pytest.raises(ApplyError) as info:
        copy_rows(target, "stg", ["n"], iter(["I\t\\N\t1\t5", "I\t\\N\t2\tsecret-value-42"]))
    message = str(info.value)
    assert "secret-value-42" not in message and "22P02" in message and "line 2" in message and "column n" in message


def test_a_write_task_whose_copy_ran_twice_stops_the_batch_and_the_next_apply_applies_it_once(
        spark, tmp_path, target, monkeypatch):
    """Spark may run a write task again after its COPY committed (an executor lost before its result or shuffle
    output reached the driver): the staging table then holds those rows twice. Injected here by a COPY function
    that COPYs its partition twice and reports it once, as the retried task's result does."""
    from airflow_provider_pglogical.apply.targets.postgres import target as postgres_target

    original = postgres_target.copy_partitions

    def copying_twice(dsn, staging, columns, fields):
        run_once = original(dsn, staging, columns, fields)

        def run(batches):
            held = list(batches)
            list(run_once(iter(held)))  # the first attempt: committed, its result lost with its executor
            yield from run_once(iter(held))

        return run

    monkeypatch.setenv("PGLOGICAL_APPLY_DIRECT", "0")  # the Spark transforms' COPY (the direct path's is alike)
    execute(target, "CREATE TABLE parent (id bigint PRIMARY KEY, name text)", "INSERT INTO parent VALUES (1, 'one')")
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {PARENT: [
        Chg("I", 0x110, 0, new={"id": 2, "name": "two"}),
        Chg("U", 0x120, 0, new={"id": 1, "name": "uno"}),
    ]}))
    monkeypatch.setattr(postgres_target, "copy_partitions", copying_twice)
    with pytest.raises(ApplyError, match=r"public\.parent: the write tasks reported 2 rows but staging table .* "
                                         r"holds 4 .*run the apply again"):
        run(spark, tmp_path, target)
    assert rows(target, "SELECT * FROM parent ORDER BY id") == [(1, "one")]
    assert rows(target, "SELECT count(*) FROM pglogical_progress") == [(0,)]
    monkeypatch.setattr(postgres_target, "copy_partitions", original)
    (report,) = run(spark, tmp_path, target)  # the way out the error names
    assert report.applied
    assert rows(target, "SELECT * FROM parent ORDER BY id") == [(1, "uno"), (2, "two")]
