"""The ordered replay on staged batches: truncates, counters, rejects, conflict policies, idempotent replays,
deferred constraints, and a batch of tens of thousands of changes."""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.exceptions import ApplyError, ConstraintViolationError, UnresolvableToastError
from scripts.harness.pgserver import execute, make_target
from scripts.harness.pgserver import query as rows
from tests.integration.test_apply import CHILD, PARENT
from tests.support.stage import BatchSpec, Chg, Col, Rel, Trunc, write_batch

UNIQ = Rel("public", "uniq", (Col("id", pa.int64(), "bigint", True), Col("u", pa.string(), "text")), relid=18000)
ITEMS = Rel("public", "items", (Col("id", pa.int64(), "bigint", True), Col("v", pa.string(), "text")), relid=18100)
DOCS = Rel("public", "docs", (Col("id", pa.int64(), "bigint", True), Col("body", pa.string(), "text")), relid=18200)


@pytest.fixture
def target(pg_server):
    _, dsn = make_target(pg_server)
    execute(dsn, "CREATE TABLE uniq (id bigint PRIMARY KEY, u text UNIQUE)", "INSERT INTO uniq VALUES (1, 'a'), (2, 'b')",
            "CREATE TABLE items (id bigint PRIMARY KEY, v text)", "INSERT INTO items VALUES (1, 'x')",
            "CREATE TABLE docs (id bigint PRIMARY KEY, body text)", "INSERT INTO docs VALUES (5, 'five')")
    return dsn


def run(spark, tmp_path, dsn, tables=None):
    return apply_slot(spark, ApplyConfig(slot="s1", staging_root=str(tmp_path), tables=tables or {}), dsn)


def swap(lsn: int) -> list[Chg]:
    """Rows 1 and 2 of uniq swap their unique values over three transactions: only the ordered replay can."""
    return [Chg("U", lsn, 0, new={"id": 1, "u": "tmp"}), Chg("U", lsn + 1, 0, new={"id": 2, "u": "a"}),
            Chg("U", lsn + 2, 0, new={"id": 1, "u": "b"})]


def chain(lsn: int) -> list[Chg]:
    """A docs row inserted and moved twice with its body unchanged ('u'): only the ordered replay carries it."""
    return [Chg("I", lsn, 0, new={"id": 10, "body": "big"}),
            Chg("U", lsn, 1, old={"id": 10}, old_key_only=True, new={"id": 11, "body": None}, toast=("body",)),
            Chg("U", lsn + 1, 0, old={"id": 11}, old_key_only=True, new={"id": 12, "body": None}, toast=("body",))]


def test_the_replay_honours_truncates_and_counts_like_native(spark, tmp_path, target):
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x300, {
        ITEMS: [Chg("I", 0x110, 0, new={"id": 5, "v": "void"}), Chg("U", 0x110, 1, new={"id": 1, "v": "void"}),
                Chg("I", 0x130, 0, new={"id": 6, "v": "v"}), Chg("U", 0x130, 1, new={"id": 6, "v": "w"}),
                Chg("U", 0x130, 2, new={"id": 7, "v": "ghost"}), Chg("D", 0x130, 3, old={"id": 8}, old_key_only=True)],
        UNIQ: swap(0x140),
    }, truncates=[Trunc(0x120, 0, ("public.items",))]))
    (report,) = run(spark, tmp_path, target)
    assert report.ordered and report.applied
    assert rows(target, "SELECT * FROM items") == [(6, "w")]
    assert rows(target, "SELECT * FROM uniq ORDER BY id") == [(1, "b"), (2, "a")]
    assert report.rows["public.items"] == {"inserted": 1, "updated": 1, "deleted": 0, "rejected": 0,
                                           "skipped_missing_update": 1, "skipped_missing_delete": 1}
    assert report.rows["public.uniq"]["updated"] == 3
    assert set(report.seconds) == {"stage", "apply", "stage_ordered", "apply_ordered"}


@pytest.mark.parametrize("policy", ["fail", "reject_and_continue"])
def test_an_insert_whose_unchanged_toast_exists_nowhere_is_rejected_or_fails_in_the_replay(spark, tmp_path, target,
                                                                                           policy):
    orphan = Chg("I", 0x150, 0, new={"id": 20, "body": None}, toast=("body",))  # e.g. an UPDATE a row filter turned
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x300, {DOCS: [*chain(0x110), orphan]}))
    tables = {"public.docs": TableApplyConfig(unchanged_toast=policy)}
    if policy == "fail":
        with pytest.raises(UnresolvableToastError, match="LSN 0/"):
            run(spark, tmp_path, target, tables)
        assert rows(target, "SELECT * FROM docs") == [(5, "five")]
        return
    (report,) = run(spark, tmp_path, target, tables)
    assert report.ordered and report.rows["public.docs"]["rejected"] == 1
    assert rows(target, "SELECT * FROM docs ORDER BY id") == [(5, "five"), (12, "big")]
    assert rows(target, "SELECT table_name, lsn::text, key FROM pglogical_rejects") == \
        [("public.docs", "0/EC", {"id": 20})]  # the change's LSN (stage.py: commit_lsn - 100 + tx_order)


@pytest.mark.parametrize("policy", ["upsert", "strict"])
def test_inserts_of_existing_keys_follow_the_conflict_policy_in_the_replay(spark, tmp_path, target, policy):
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x300, {DOCS: [*chain(0x110),
                                                                Chg("I", 0x150, 0, new={"id": 5, "body": "new"})]}))
    tables = {"public.docs": TableApplyConfig(conflict=policy)}
    if policy == "strict":
        with pytest.raises(ApplyError, match="change at LSN 0/EC of public.docs.*conflict policy strict"):
            run(spark, tmp_path, target, tables)
        assert rows(target, "SELECT * FROM docs") == [(5, "five")]
        return
    (report,) = run(spark, tmp_path, target, tables)
    assert report.ordered and rows(target, "SELECT * FROM docs ORDER BY id") == [(5, "new"), (12, "big")]


def test_replaying_an_ordered_batch_without_its_watermark_reaches_the_same_state(spark, tmp_path, target):
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x300, {DOCS: chain(0x110), UNIQ: swap(0x140)}))
    run(spark, tmp_path, target)
    state = rows(target, "SELECT * FROM docs ORDER BY id"), rows(target, "SELECT * FROM uniq ORDER BY id")
    assert state == ([(5, "five"), (12, "big")], [(1, "b"), (2, "a")])
    execute(target, "DELETE FROM pglogical_progress")  # as if the watermark commit had been lost
    for record in (tmp_path / "s1" / "state").glob("target-*.json"):  # (and the apply had not recorded it)
        record.unlink()
    (report,) = run(spark, tmp_path, target)
    assert report.ordered and report.applied
    assert (rows(target, "SELECT * FROM docs ORDER BY id"), rows(target, "SELECT * FROM uniq ORDER BY id")) == state


def test_deferred_constraints_are_checked_on_the_end_state_without_a_replay(spark, tmp_path, target, caplog):
    execute(target, "CREATE TABLE parent (id bigint PRIMARY KEY, name text)",
            "CREATE TABLE child (id bigint PRIMARY KEY, parent_id bigint REFERENCES parent DEFERRABLE INITIALLY "
            "DEFERRED, body text)", "INSERT INTO parent VALUES (1, 'p1')", "INSERT INTO child VALUES (10, 1, 'c')")
    # Re-point and delete the old parent: fine for a deferred FK even set-based (checked at the end).
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {
        PARENT: [Chg("I", 0x110, 0, new={"id": 2, "name": "p2"}), Chg("D", 0x110, 2, old={"id": 1}, old_key_only=True)],
        CHILD: [Chg("U", 0x110, 1, new={"id": 10, "parent_id": 2, "body": "c"})]}))
    (report,) = run(spark, tmp_path, target)
    assert report.applied and not report.ordered
    # A child whose parent never exists: the end state violates the FK; no order helps, so no replay.
    write_batch(tmp_path, "s1", BatchSpec(0x200, 0x300, {CHILD: [Chg("I", 0x210, 0, new={"id": 11, "parent_id": 99})]}))
    with caplog.at_level(logging.INFO), pytest.raises(ConstraintViolationError) as info:
        run(spark, tmp_path, target)
    assert (info.value.table, info.value.lsn, info.value.sqlstate) == ("public.child", None, "23503")
    assert info.value.constraint == "child_parent_id_fkey" and "99" not in str(info.value)
    assert "change by change" not in caplog.text
    assert rows(target, "SELECT * FROM child") == [(10, 2, "c")]


def test_a_batch_of_tens_of_thousands_of_order_dependent_changes(spark, tmp_path, target):
    n = 30_000
    execute(target, "TRUNCATE uniq", f"INSERT INTO uniq SELECT i, 'v' || i FROM generate_series(1, {n}) i")
    # Every row takes the value the row above it freed, top row first; plus inserts and deletes in between.
    changes = [Chg("U", 0x10000, 0, new={"id": n, "u": "free"})]
    changes += [Chg("U", 0x10000, n - i, new={"id": i, "u": f"v{i + 1}"}) for i in range(n - 1, 0, -1)]
    changes += [Chg("I", 0x20000 + i, 0, new={"id": n + 1 + i, "u": f"new{i}"}) for i in range(10_000)]
    changes += [Chg("D", 0x30000 + i, 0, old={"id": n + 1 + i}, old_key_only=True) for i in range(0, 10_000, 2)]
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x40000, {UNIQ: changes}))
    started = time.monotonic()
    (report,) = run(spark, tmp_path, target)
    print(f"{len(changes)} changes: {time.monotonic() - started:.1f} s in all, {report.seconds}")
    assert report.ordered and report.rows["public.uniq"]["updated"] == n
    assert rows(target, "SELECT count(*), count(*) FILTER (WHERE u = 'v' || (id + 1)) FROM uniq") == [(n + 5_000, n - 1)]
