"""Publication parity: tables without a replica identity, row-filter identity rule at DML time, published actions."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.exceptions import ReplicaIdentityError, RowFilterError
from scripts.harness.pgserver import execute, make_target
from scripts.harness.pgserver import query as rows
from tests.support.stage import BatchSpec, Chg, Col, Rel, Trunc, write_batch

COLS = (Col("id", pa.int64(), "bigint"), Col("v", pa.string(), "text"))
NO_RI = Rel("public", "logs", COLS, replica_identity="n")
ITEMS = Rel("public", "items", (Col("id", pa.int64(), "bigint", True), Col("grp", pa.int32(), "integer")))


@pytest.fixture
def target(pg_server):
    _, dsn = make_target(pg_server)
    return dsn


def run(spark, tmp_path, dsn, tables=None):
    return apply_slot(spark, ApplyConfig(slot="s1", staging_root=str(tmp_path), tables=tables or {}), dsn)


def test_a_table_without_replica_identity_is_appended_truncated_and_stops_only_at_an_update(spark, tmp_path, target):
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {NO_RI: [
        Chg("I", 0x110, 0, new={"id": 1, "v": "a"}),
        Chg("I", 0x110, 1, new={"id": 1, "v": "a"}),  # duplicates are kept, as natively without a unique index
        Chg("I", 0x120, 0, new={"id": 2, "v": "b"}),
    ]}))
    (report,) = run(spark, tmp_path, target)
    assert rows(target, "SELECT id, v FROM logs ORDER BY id") == [(1, "a"), (1, "a"), (2, "b")]
    assert report.rows["public.logs"]["inserted"] == 3
    # The table was created without a primary key.
    assert rows(target, "SELECT count(*) FROM pg_index WHERE indrelid = 'logs'::regclass") == [(0,)]
    write_batch(tmp_path, "s1", BatchSpec(0x200, 0x300, {NO_RI: [
        Chg("I", 0x210, 0, new={"id": 3, "v": "c"}),
        Chg("I", 0x230, 0, new={"id": 4, "v": "d"}),
    ]}, truncates=[Trunc(0x220, 0, ("public.logs",))]))
    run(spark, tmp_path, target)
    assert rows(target, "SELECT id, v FROM logs") == [(4, "d")]
    write_batch(tmp_path, "s1", BatchSpec(0x300, 0x400, {NO_RI: [
        Chg("I", 0x310, 0, new={"id": 5, "v": "e"}),
        Chg("U", 0x320, 0, new={"id": 4, "v": "x"}),
    ]}))
    with pytest.raises(ReplicaIdentityError, match=r"public\.logs from LSN 0/2BC.*no replica identity") as info:
        run(spark, tmp_path, target)
    assert (info.value.table, info.value.lsn) == ("public.logs", 0x320 - 100)
    assert rows(target, "SELECT id FROM logs") == [(4,)]  # nothing of the batch was written
    assert rows(target, "SELECT end_lsn::text FROM pglogical_progress") == [("0/300",)]


def test_an_unpublished_update_of_a_table_without_identity_passes(spark, tmp_path, target):
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {NO_RI: [
        Chg("I", 0x110, 0, new={"id": 1, "v": "a"}), Chg("U", 0x120, 0, new={"id": 1, "v": "b"})]}))
    run(spark, tmp_path, target, {"public.logs": TableApplyConfig(actions=("insert", "truncate"))})
    assert rows(target, "SELECT id, v FROM logs") == [(1, "a")]


def test_key_columns_can_name_a_unique_key_of_the_target_for_upserts(spark, tmp_path, target):
    execute(target, "CREATE TABLE logs (id bigint, v text, UNIQUE (id))")
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {NO_RI: [
        Chg("I", 0x110, 0, new={"id": 1, "v": "a"}), Chg("I", 0x120, 0, new={"id": 1, "v": "b"}),
        Chg("I", 0x130, 0, new={"id": 2, "v": "c"})]}))
    run(spark, tmp_path, target, {"public.logs": TableApplyConfig(key_columns=("id",))})
    write_batch(tmp_path, "s1", BatchSpec(0x200, 0x300, {NO_RI: [Chg("I", 0x210, 0, new={"id": 2, "v": "d"})]}))
    run(spark, tmp_path, target, {"public.logs": TableApplyConfig(key_columns=("id",))})
    assert rows(target, "SELECT id, v FROM logs ORDER BY id") == [(1, "b"), (2, "d")]


def test_a_filter_outside_the_identity_passes_inserts_and_stops_at_an_update(spark, tmp_path, target):
    cfg = {"public.items": TableApplyConfig(row_filter="grp > 5")}
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {ITEMS: [
        Chg("I", 0x110, 0, new={"id": 1, "grp": 9}), Chg("I", 0x120, 0, new={"id": 2, "grp": 1})]}))
    run(spark, tmp_path, target, cfg)
    assert rows(target, "SELECT id, grp FROM items") == [(1, 9)]
    write_batch(tmp_path, "s1", BatchSpec(0x200, 0x300, {ITEMS: [
        Chg("D", 0x210, 0, old={"id": 1}, old_key_only=True)]}))
    with pytest.raises(RowFilterError, match=r"public\.items from LSN 0/1AC.*grp outside the replica identity"):
        run(spark, tmp_path, target, cfg)
    assert rows(target, "SELECT id, grp FROM items") == [(1, 9)]
