"""The drain cycle against a real server: peek → stage → manifest → advance, read back with pyarrow."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal

import psycopg2
import psycopg2.extras
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.exceptions import SlotActiveError, StagingError
from airflow_provider_pglogical.hooks import PgLogicalHook
from airflow_provider_pglogical.staging import StagingReader
from airflow_provider_pglogical.staging.drain import DrainConfig, drain_slot
from tests.support.drain import (
    assert_log_matches,
    run_tx,
    staged,
    staged_rows,
    workload,
)


def drain(hook, uri, **kw):
    return drain_slot(hook, DrainConfig(slot="s1", publication="pub", staging_uri=uri, **kw))


def test_a_drain_stages_every_kind_of_change_readable_by_plain_pyarrow(drain_source, tmp_path):
    cur, hook = drain_source
    uri = str(tmp_path / "stage")
    big = "x" * 200_000  # compressible but stored out of line: TOAST
    xids = [
        run_tx(cur, [("INSERT INTO docs VALUES (1, %s, 'a')", (big,)), ("INSERT INTO docs VALUES (2, 'small', 'b')", ())]),
        run_tx(cur, [("UPDATE docs SET note = 'changed' WHERE id = 1", ())]),  # body unchanged: 'u'
        run_tx(cur, [("DELETE FROM docs WHERE id = 2", ())]),
    ]
    xids += workload(cur, 10)
    cur.execute("SELECT pg_logical_emit_message(false, 'loose', 'outside')")
    xids.append(run_tx(cur, [("TRUNCATE accounts, events RESTART IDENTITY", ())]))

    result = drain(hook, uri)

    assert result.staged and result.transactions == len(xids)
    assert hook.slot_info("s1").confirmed_flush_lsn == result.end_lsn
    assert_log_matches(uri, "s1", xids)
    docs = staged_rows(uri, "s1", "public.docs").to_pylist()
    assert [d["op"] for d in docs] == ["I", "I", "U", "D"]
    assert docs[0]["new"]["body"] == big
    assert docs[2]["new"]["body"] is None and docs[2]["new_unchanged_toast"] == ["body"]
    assert docs[2]["new"]["note"] == "changed"
    assert docs[3]["old"]["id"] == 2 and docs[3]["old_key_only"] is True
    events = staged_rows(uri, "s1", "public.events").to_pylist()
    assert all(e["old_key_only"] is False for e in events if e["op"] == "D")  # REPLICA IDENTITY FULL
    accounts = staged_rows(uri, "s1", "public.accounts").to_pylist()
    assert {a["new"]["owner"] for a in accounts if a["op"] == "I"} == {f"owner-{i}" for i in range(10)}
    assert "ghost" not in {a["new"]["owner"] for a in accounts if a["new"]}
    truncates = staged(uri, "s1", "truncates.parquet").to_pylist()
    assert truncates[0]["relations"] == ["public.accounts", "public.events"] and truncates[0]["restart_identity"]
    messages = staged(uri, "s1", "messages.parquet").to_pylist()
    assert [m["prefix"] for m in messages].count("audit") == sum(1 for i in range(10) if i % 7 == 3)
    loose = [m for m in messages if not m["transactional"]]
    assert loose[0]["content"] == b"outside" and loose[0]["commit_lsn"] is None
    # a plain glob over the layout works without our code
    batch = StagingReader.from_uri(uri, "s1").batches()[0]
    table = ds.dataset(f"{batch.path}/tables/public.accounts", format="parquet").to_table()
    assert table.num_rows == len(accounts)
    relations = pq.read_table(f"{batch.path}/relations.parquet").to_pylist()
    cols = {r["table"]: r["columns"] for r in relations}
    assert [c["type_name"] for c in cols["accounts"]] == ["integer", "text", "numeric(12,2)"]
    manifest = json.loads(open(f"{batch.path}/_manifest.json").read())
    assert manifest["start_lsn_int"] == result.start_lsn and manifest["end_lsn_int"] == result.end_lsn
    assert manifest["tables"]["public.accounts"]["rows"] == len(accounts)


def test_an_empty_run_stages_nothing_and_succeeds(drain_source, tmp_path):
    _cur, hook = drain_source
    before = hook.slot_info("s1").confirmed_flush_lsn
    result = drain(hook, str(tmp_path / "stage"))
    assert not result.staged and result.start_lsn == result.end_lsn == before
    assert StagingReader.from_uri(str(tmp_path / "stage"), "s1").batches() == []
    assert hook.slot_info("s1").confirmed_flush_lsn == before


def test_a_second_run_continues_at_the_end_of_the_first(drain_source, tmp_path):
    cur, hook = drain_source
    uri = str(tmp_path / "stage")
    xids = workload(cur, 5)
    first = drain(hook, uri)
    xids += workload(cur, 5, start=5)
    cur.execute("ALTER TABLE accounts ADD COLUMN region text")
    xids.append(run_tx(cur, [("INSERT INTO accounts VALUES (99, 'late', 1, 'eu')", ())]))
    second = drain(hook, uri)
    assert second.start_lsn == first.end_lsn and second.end_lsn > second.start_lsn
    assert_log_matches(uri, "s1", xids)
    # schema versions continue across runs: the second run knows v1 and adds v2
    batches = StagingReader.from_uri(uri, "s1").batches()
    files = StagingReader.from_uri(uri, "s1").manifest(batches[1]).tables["public.accounts"]["files"]
    assert files == ["tables/public.accounts/v1.parquet", "tables/public.accounts/v2.parquet"]


def test_budgets_split_the_range_into_contiguous_batches(drain_source, tmp_path):
    cur, hook = drain_source
    uri = str(tmp_path / "stage")
    xids = workload(cur, 40)
    results = []
    for _ in range(60):
        r = drain(hook, uri, max_changes=25, max_wal_bytes=16_384)
        if not r.staged:
            break
        results.append(r)
    assert len(results) > 3
    assert all(b.start_lsn == a.end_lsn for a, b in zip(results, results[1:], strict=False))
    assert_log_matches(uri, "s1", xids)


def test_awkward_identifiers_are_staged_under_quoted_paths(pg_conn, pg_dsn, tmp_path):
    cur = pg_conn.cursor()
    cur.execute('CREATE SCHEMA "Sch ""ema"" ñ"; CREATE TABLE "Sch ""ema"" ñ"."T.a b" (id int PRIMARY KEY, "Col ""x""" text)')
    hook = PgLogicalHook.from_dsn(pg_dsn)
    hook.create_publication('Weird "Pub" näme', [('Sch "ema" ñ', "T.a b")])
    hook.create_slot("weird_slot")
    xid = run_tx(cur, [('INSERT INTO "Sch ""ema"" ñ"."T.a b" VALUES (1, %s)', ("v",))])
    uri = str(tmp_path / "stage")
    result = drain_slot(hook, DrainConfig(slot="weird_slot", publication='Weird "Pub" näme', staging_uri=uri))
    hook.close()
    assert result.tables == {'Sch "ema" ñ.T.a b': 1}
    batch = StagingReader.from_uri(uri, "weird_slot").batches()[0]
    [path] = StagingReader.from_uri(uri, "weird_slot").manifest(batch).tables['Sch "ema" ñ.T.a b']["files"]
    assert path == "tables/Sch%20%22ema%22%20%C3%B1.T%2Ea%20b/v1.parquet"
    row = pq.read_table(f"{batch.path}/{path}").to_pylist()[0]
    assert row["new"] == {"id": 1, 'Col "x"': "v"} and row["xid"] == xid


def test_a_concurrent_drain_gets_slot_active_and_changes_nothing(drain_source, tmp_path, pg_dsn):
    cur, hook = drain_source
    uri = str(tmp_path / "stage")
    workload(cur, 3)
    holder = PgLogicalHook.from_dsn(pg_dsn)
    assert holder.try_lock_slot("s1")  # what a running drain holds for its whole cycle
    before = hook.slot_info("s1").confirmed_flush_lsn
    with pytest.raises(SlotActiveError, match="being drained"):
        drain(hook, uri)
    holder.close()
    assert hook.slot_info("s1").confirmed_flush_lsn == before
    assert not (tmp_path / "stage" / "s1" / "batches").exists()

    # a streaming consumer holding the slot itself
    conn = psycopg2.connect(pg_dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        repl = conn.cursor()
        repl.start_replication(slot_name="s1", options={"proto_version": "1", "publication_names": "pub"})
        with pytest.raises(SlotActiveError):
            drain(hook, uri)
    finally:
        conn.close()
    assert hook.slot_info("s1").confirmed_flush_lsn == before


def test_restaging_the_same_range_yields_the_same_rows(drain_source, tmp_path):
    cur, hook = drain_source
    uri = str(tmp_path / "stage")
    xids = workload(cur, 12)
    copy = tmp_path / "first-attempt"

    def stop_after_files(name: str) -> None:
        if name == "files_written":
            batch = next(p for p in (tmp_path / "stage" / "s1" / "batches").iterdir() if not p.name.startswith("_"))
            shutil.copytree(batch, copy)
            raise RuntimeError("simulated failure before the manifest")

    with pytest.raises(RuntimeError):
        drain_slot(hook, DrainConfig(slot="s1", publication="pub", staging_uri=uri, row_group_rows=7),
                   on_checkpoint=stop_after_files)
    assert StagingReader.from_uri(uri, "s1").batches() == []
    result = drain(hook, uri, row_group_rows=7)
    assert_log_matches(uri, "s1", xids)
    for f in sorted(copy.rglob("*.parquet")):
        again = f"{result.batch_path}/{f.relative_to(copy)}"
        assert pq.read_table(f).equals(pq.read_table(again)), f
        assert f.read_bytes() == open(again, "rb").read(), f


def test_a_slot_moved_outside_the_drain_is_reported_as_a_gap(drain_source, tmp_path):
    cur, hook = drain_source
    uri = str(tmp_path / "stage")
    workload(cur, 2)
    drain(hook, uri)
    workload(cur, 2, start=2)
    hook.advance_slot("s1", hook.current_wal_flush_lsn())
    workload(cur, 2, start=4)
    with pytest.raises(StagingError, match="moved outside"):
        drain(hook, uri)


def test_get_mode_consumes_while_reading_and_keeps_batches_contiguous(drain_source, tmp_path):
    cur, hook = drain_source
    uri = str(tmp_path / "stage")
    xids = workload(cur, 6)
    first = drain(hook, uri, mode="get")
    assert first.staged and hook.slot_info("s1").confirmed_flush_lsn == first.end_lsn
    xids += workload(cur, 3, start=6)
    second = drain(hook, uri)
    assert second.start_lsn == first.end_lsn
    assert_log_matches(uri, "s1", xids)


@pytest.mark.parametrize("read", ["sql", "stream"])
def test_the_operator_returns_a_summary_and_emits_table_asset_events(drain_source, tmp_path, pg_server, pg_dbname,
                                                                     monkeypatch, read):
    from airflow.sdk import AssetAlias
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from airflow_provider_pglogical.operators import PgLogicalDecodeOperator, table_asset

    cur, _hook = drain_source
    workload(cur, 4)
    monkeypatch.setenv("AIRFLOW_CONN_PGLOGICAL_SRC", pg_server.uri(pg_dbname))
    accounts, alias = table_asset("s1", "public.accounts"), AssetAlias("pglogical-s1")
    op = PgLogicalDecodeOperator(task_id="decode", slot="s1", publication="pub", staging_uri=str(tmp_path / "stage"),
                                 postgres_conn_id="pglogical_src", max_changes="none", outlets=[accounts, alias],
                                 read=read)
    assert {"slot", "publication", "staging_uri", "max_wal_bytes", "max_changes"} <= set(op.template_fields)
    events = OutletEventAccessors()
    summary = op.execute({"outlet_events": events})
    assert summary["staged"] and summary["transactions"] == 4 and summary["tables"]["public.accounts"] == 5  # 4 inserts, 1 update
    assert summary["end_lsn_int"] > summary["start_lsn_int"] and "/" in summary["end_lsn"]
    assert events[accounts].extra["rows"] == 5 and events[accounts].extra["end_lsn"] == summary["end_lsn"]
    added = {e.dest_asset_key.uri for e in events[alias].asset_alias_events}
    assert added == {table_asset("s1", t).uri for t in ("public.accounts", "public.events")}
    again = op.execute({"outlet_events": OutletEventAccessors()})
    assert not again["staged"] and again["start_lsn_int"] == summary["end_lsn_int"]
    assert _hook.slot_info("s1").confirmed_flush_lsn == summary["end_lsn_int"]


def test_a_quiet_publication_gets_an_empty_batch_so_wal_is_released(drain_source, tmp_path):
    cur, hook = drain_source
    uri = str(tmp_path / "stage")
    cur.execute("CREATE TABLE unpublished (id int); INSERT INTO unpublished SELECT generate_series(1, 1000)")
    assert not drain(hook, uri, empty_advance_bytes=None).staged  # off: nothing staged, slot pinned
    empty = drain(hook, uri, empty_advance_bytes=1)
    assert empty.staged and empty.transactions == 0 and empty.changes == 0
    assert hook.slot_info("s1").confirmed_flush_lsn == empty.end_lsn > empty.start_lsn
    cur.execute("SELECT pg_logical_emit_message(false, 'only', 'loose')")
    cur.execute("INSERT INTO unpublished VALUES (0)")  # its commit flushes the message's WAL
    loose = drain(hook, uri, empty_advance_bytes=None)  # a loose message alone is staged too
    assert loose.staged and loose.messages == 1 and loose.start_lsn == empty.end_lsn
    xids = workload(cur, 2)
    after = drain(hook, uri)
    assert after.start_lsn == loose.end_lsn
    assert_log_matches(uri, "s1", xids)


def test_values_the_typed_columns_cannot_hold_are_staged_as_exactness_notes(pg_conn, pg_dsn, tmp_path):
    cur = pg_conn.cursor()
    cur.execute("CREATE TABLE m (id int PRIMARY KEY, amount numeric(10,2), grid int[]);"
                "CREATE PUBLICATION pub FOR TABLE m")
    hook = PgLogicalHook.from_dsn(pg_dsn)
    hook.create_slot("s1")
    cur.execute("INSERT INTO m VALUES (1, 'NaN', '[0:1][-2:0]={{1,2,3},{4,NULL,6}}'), (2, 1.5, '{7}')")
    uri = str(tmp_path / "stage")
    drain(hook, uri)
    hook.close()

    rows = staged_rows(uri, "s1", "public.m").to_pylist()
    assert [r["new"]["amount"] for r in rows] == [None, Decimal("1.50")]
    assert [r["new"]["grid"] for r in rows] == [[1, 2, 3, 4, None, 6], [7]]
    assert dict(rows[0]["new_value_notes"]) == {"amount": "NaN", "grid": "[0:1][-2:0]"}
    assert rows[1]["new_value_notes"] == [] and rows[0]["old_value_notes"] == []


def test_a_replayed_batch_ending_past_the_servers_wal_is_refused(drain_source, tmp_path):
    """A published batch starting at the slot's position but ending past the server's WAL (staged from another
    history): the server clamps the replay's advance to its flush position, and the drain raises one typed line
    instead of taking the batch as consumed."""
    from airflow_provider_pglogical.staging.drain import _NoRelations
    from airflow_provider_pglogical.staging.layout import StagingLayout
    from airflow_provider_pglogical.staging.writer import BatchWriter

    _cur, hook = drain_source
    uri = str(tmp_path / "stage")
    start = hook.slot_info("s1").confirmed_flush_lsn
    writer = BatchWriter(StagingLayout.from_uri(uri, "s1"), start_lsn=start, slot="s1", publication="pub",
                         resolver=_NoRelations(), background_writes=False)
    writer.finish_files(hook.current_wal_flush_lsn() + (1 << 30))
    writer.publish({})
    with pytest.raises(StagingError, match="not to the published batches' end") as err:
        drain_slot(hook, DrainConfig(slot="s1", publication="pub", staging_uri=uri))
    assert "\n" not in str(err.value)
