"""The streamed read (``DrainConfig.read='stream'``) against the SQL peek, on twin slots.

Both reads of the same WAL range must stage the same batches (boundaries, transactions, rows,
messages), confirm the slot to the last published end and nothing past it, and keep the drain's
crash windows: a run killed before or after a manifest leaves exactly one copy after the rerun.
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
import time

import pytest

from airflow_provider_pglogical.hooks import replication
from airflow_provider_pglogical.staging import StagingReader
from airflow_provider_pglogical.staging.drain import DrainConfig, drain_run, drain_slot
from tests.conftest import REPO_ROOT
from tests.integration.test_drain_run import assert_same_staged_log
from tests.support.drain import assert_log_matches, run_tx, staged, staged_xids, workload
from tests.support.drain_child import KILLED

pytestmark = pytest.mark.skipif(not replication.available(), reason="compiled helpers not built with libpq")


def config(uri: str, slot: str, **kw) -> DrainConfig:
    return DrainConfig(slot=slot, publication="pub", staging_uri=uri, **kw)


def wait_for_the_dead_sessions(cur, timeout: float = 30) -> None:
    """Until the server has seen a killed drain's connections close: its drain lock released, its walsender gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cur.execute("SELECT (SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                    "         WHERE l.locktype = 'advisory' AND d.datname = current_database())"
                    " + (SELECT count(*) FROM pg_replication_slots WHERE active AND database = current_database())")
        if cur.fetchone()[0] == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the killed drain's sessions did not end")


def random_workload(cur, seed: int) -> list[int]:
    """Small transactions, one large enough to spill, TOASTed values, REPLICA IDENTITY FULL updates, a
    truncate, transactional and loose messages and a column added mid-way; the committed xids in order."""
    rnd = random.Random(seed)
    xids = workload(cur, rnd.randint(15, 30))
    for i in range(rnd.randint(3, 6)):
        choice = rnd.choice(["toast", "big", "message", "full", "small"])
        if choice == "toast":
            body = "".join(rnd.choice("abcdefghij") for _ in range(rnd.randint(3000, 9000)))
            xids.append(run_tx(cur, [("INSERT INTO docs (id, body, note) VALUES (%s, %s, 'n')", (1000 + i, body)),
                                     ("UPDATE docs SET note = 'm' WHERE id = %s", (1000 + i,))]))
        elif choice == "big":
            xids.append(run_tx(cur, [("INSERT INTO events (account, kind, payload) SELECT g, 'bulk', repeat('x', 50) "
                                      "FROM generate_series(1, %s) g", (rnd.randint(300, 900),))]))
        elif choice == "message":
            cur.execute("SELECT pg_logical_emit_message(false, 'loose', %s)", (f"m{i}",))
        elif choice == "full":
            xids.append(run_tx(cur, [("UPDATE events SET payload = payload || '!' WHERE id %% 3 = %s", (i % 3,))]))
        else:
            xids += workload(cur, 3, start=200 + 10 * i)
    cur.execute("ALTER TABLE docs ADD COLUMN extra int DEFAULT 7")
    xids.append(run_tx(cur, [("INSERT INTO docs VALUES (%s, 'after', 'alter', 8)", (5000,))]))
    xids.append(run_tx(cur, [("TRUNCATE accounts CASCADE", ())]))
    xids += workload(cur, 5, start=300)
    return xids


@pytest.mark.parametrize(("seed", "read_ahead"), [(1, None), (2, "1"), (3, "0")])
def test_the_streamed_drain_stages_what_the_sql_peek_stages(drain_source, tmp_path, monkeypatch, seed, read_ahead):
    """Several batches cut by max_changes from one stream, a memory budget that makes transactions spill; the
    twin slot read through SQL stages the same log, and the streamed slot is confirmed to the last batch's end.
    The stream read ahead of the decoder (the default), one block ahead at most (the reading thread waits for
    the decoder at every block), and on the decoder's thread (the reference)."""
    if read_ahead is None:  # the default, whatever the environment says
        monkeypatch.delenv(replication.READ_AHEAD_ENV, raising=False)
    else:
        monkeypatch.setenv(replication.READ_AHEAD_ENV, read_ahead)
    cur, hook = drain_source
    hook.create_slot("twin")
    xids = random_workload(cur, seed)
    uri, twin_uri = str(tmp_path / "stream"), str(tmp_path / "sql")
    streamed = drain_run(hook, config(uri, "s1", max_changes=15, memory_budget=4096, read="stream"))
    through_sql = drain_run(hook, config(twin_uri, "twin", max_changes=15, memory_budget=4096))
    assert len(streamed) > 3 and [r.end_lsn for r in streamed] == [r.end_lsn for r in through_sql]
    assert_same_staged_log(uri, "s1", twin_uri, "twin")
    assert_log_matches(uri, "s1", xids)
    assert staged(uri, "s1", "messages.parquet").equals(staged(twin_uri, "twin", "messages.parquet"))
    info = hook.slot_info("s1")
    assert not info.active and info.confirmed_flush_lsn == streamed[-1].end_lsn


def test_the_walsender_sends_on_while_the_decoder_holds_a_block(drain_source, monkeypatch):
    """A transaction whose messages outgrow the sockets' buffers, then another: while the decoder holds the first
    block (staging it), the stream's own thread reads on, so the walsender replays the whole first transaction
    and goes on into the next one's WAL (its ``sent_lsn``); read on the decoder's thread, the walsender waited
    on the full socket inside the first one. The read-ahead is set well above the first transaction's ~67 MB of
    rows (``block_bytes``), whatever the environment says."""
    monkeypatch.setenv(replication.READ_AHEAD_ENV, str(128 << 20))
    cur, hook = drain_source
    run_tx(cur, [("INSERT INTO events (account, kind, payload) SELECT g, 'bulk', repeat(md5(g::text), 64) "
                  "FROM generate_series(1, 30000) g", ())])  # ~60 MB of messages, little WAL (compressed values)
    cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'")
    (after_first,) = cur.fetchone()
    xids = workload(cur, 3)
    start = hook.slot_info("s1").confirmed_flush_lsn
    stream = hook.client.stream_changes("s1", "pub", start_lsn=start, upto_lsn=hook.current_wal_flush_lsn())
    blocks = stream.blocks()
    try:
        assert next(blocks)
        deadline, sent = time.monotonic() + 30, 0
        while time.monotonic() < deadline:
            cur.execute("SELECT coalesce(max(sent_lsn - '0/0'), 0) FROM pg_stat_replication WHERE pid = %s",
                        (stream._pid,))
            (sent,) = cur.fetchone()
            if sent > after_first:
                break
            time.sleep(0.05)
        assert sent > after_first, "the walsender still waits inside the first transaction"
        taken = sum(len(block) for block in blocks)  # the rest, as the decoder would take it
        assert taken >= 30000 + 2 * len(xids) - 2000 and stream.done
    finally:
        blocks.close()
        stream.close()


def test_a_transaction_committing_past_the_bound_is_staged_by_the_next_run(drain_source, tmp_path):
    """max_wal_bytes puts the bound inside WAL the walsender streams on: the transactions committing at or after
    it are sent but never staged nor confirmed, and the next run stages them (as the SQL peek's twin does)."""
    cur, hook = drain_source
    hook.create_slot("twin")
    xids = workload(cur, 30)
    uri, twin_uri = str(tmp_path / "stream"), str(tmp_path / "sql")
    first = drain_slot(hook, config(uri, "s1", max_wal_bytes=6100, read="stream"))
    twin_first = drain_slot(hook, config(twin_uri, "twin", max_wal_bytes=6100 + first.start_lsn
                                         - hook.slot_info("twin").confirmed_flush_lsn))
    assert first.staged and 0 < first.transactions < len(xids)
    assert first.end_lsn == twin_first.end_lsn and first.transactions == twin_first.transactions
    assert hook.slot_info("s1").confirmed_flush_lsn == first.end_lsn
    rest = drain_run(hook, config(uri, "s1", read="stream"))
    assert rest and rest[0].start_lsn == first.end_lsn
    assert_log_matches(uri, "s1", xids)


def test_a_message_whose_record_ends_at_the_bound_is_staged_by_both_reads(drain_source, tmp_path):
    """Heartbeats emitted outside transactions, each run bounded at the last one's record end (its lsn, where a
    heartbeat emitted with flush puts the flush position). The SQL peek takes it (its record starts before the
    bound); the streamed read takes it too, so after a second run both logs hold every heartbeat once, in the
    same batches."""
    cur, hook = drain_source
    hook.create_slot("twin")
    uri, twin_uri = str(tmp_path / "stream"), str(tmp_path / "sql")
    streamed, through_sql = [], []
    for run in range(2):
        for i in range(3):
            cur.execute("SELECT (pg_logical_emit_message(false, 'hb', %s) - '0/0')::bigint", (f"{run}-{i}",))
        last_end = cur.fetchone()[0]  # the record's end
        while hook.current_wal_flush_lsn() < last_end:
            time.sleep(0.05)
        for out, path, slot in ((streamed, uri, "s1"), (through_sql, twin_uri, "twin")):
            wal = last_end - hook.slot_info(slot).confirmed_flush_lsn
            out.append(drain_slot(hook, config(path, slot, max_wal_bytes=wal, read="stream" if slot == "s1" else "sql")))
    assert [r.end_lsn for r in streamed] == [r.end_lsn for r in through_sql]
    messages = staged(uri, "s1", "messages.parquet")
    assert messages.equals(staged(twin_uri, "twin", "messages.parquet")) and messages.num_rows == 6


def test_closing_a_stream_whose_hook_session_died_raises_nothing(drain_source):
    """close() runs on a failed run too: when the hook's own session (which it asks whether the slot is released)
    is gone, it logs that and returns, leaving the run's error to be raised."""
    cur, hook = drain_source
    start = hook.slot_info("s1").confirmed_flush_lsn
    stream = hook.client.stream_changes("s1", "pub", start_lsn=start, upto_lsn=hook.current_wal_flush_lsn())
    cur.execute("SELECT pg_terminate_backend(%s)", (hook.client.session.get_backend_pid(),))
    stream.close()
    assert not stream.open


@pytest.mark.parametrize(("kill_at", "published"), [("files_written:2", 1), ("manifest_written:2", 2)])
def test_a_streamed_run_killed_before_or_after_a_manifest_reruns_to_one_copy(drain_source, tmp_path, pg_dsn,
                                                                             kill_at, published):
    """Killed with the second batch's files written (no manifest) or its manifest written (not confirmed): the
    slot is at most at the first batch's end; the rerun removes the leftover or finds the batch published, and
    the log holds every transaction once."""
    cur, hook = drain_source
    xids = workload(cur, 40)
    uri = str(tmp_path / "stage")
    proc = subprocess.run([sys.executable, "-m", "tests.support.drain_child",
                           json.dumps({"dsn": pg_dsn, "slot": "s1", "publication": "pub", "staging_uri": uri,
                                       "kill_at": kill_at, "max_changes": 25, "run": True, "read": "stream"})],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == KILLED, proc.stderr[-3000:]
    wait_for_the_dead_sessions(cur)
    batches = StagingReader.from_uri(uri, "s1").batches()
    assert len(batches) == published
    assert hook.slot_info("s1").confirmed_flush_lsn <= batches[0].end_lsn  # nothing unpublished confirmed
    results = drain_run(hook, config(uri, "s1", max_changes=25, read="stream"))
    assert [r.replayed for r in results[:published - 1]] == [True] * (published - 1)
    assert_log_matches(uri, "s1", xids)
    assert hook.slot_info("s1").confirmed_flush_lsn == results[-1].end_lsn


def test_a_missing_slot_a_busy_one_and_a_missing_publication_are_typed_one_line_errors(drain_source):
    """As the SQL read types them. A stream refused because another consumer holds the slot leaves that consumer's
    walsender alone; a publication created after the changes (absent from the snapshot they are decoded in) is
    PublicationNotFoundError, not a missing slot."""
    from airflow_provider_pglogical.exceptions import PublicationNotFoundError, SlotActiveError, SlotNotFoundError

    cur, hook = drain_source
    start = hook.slot_info("s1").confirmed_flush_lsn
    with pytest.raises(SlotNotFoundError) as missing:
        hook.stream_changes("nosuchslot", "pub", start_lsn=start, upto_lsn=start + 1)
    holder = hook.stream_changes("s1", "pub", start_lsn=start, upto_lsn=start + 1)
    try:
        held_by = hook.slot_info("s1").active_pid
        with pytest.raises(SlotActiveError) as busy:
            hook.stream_changes("s1", "pub", start_lsn=start, upto_lsn=start + 1)
        assert hook.slot_info("s1").active_pid == held_by
    finally:
        holder.close()
    workload(cur, 2)
    cur.execute("CREATE PUBLICATION later FOR TABLE accounts")
    upto = hook.current_wal_flush_lsn()
    with pytest.raises(PublicationNotFoundError) as publication:
        list(hook.stream_changes("s1", "later", start_lsn=start, upto_lsn=upto))
    assert not hook.slot_info("s1").active
    for err in (missing, busy, publication):
        assert "\n" not in str(err.value)


def test_a_failed_start_replication_names_the_command_not_the_connection(drain_source):
    """The connection was accepted and START_REPLICATION failed for a reason the SQL read has no type for (a
    physical slot): one line naming the command, without the pg_hba.conf hint of a refused connection."""
    from airflow_provider_pglogical.exceptions import ReplicationConnectionError

    cur, hook = drain_source
    cur.execute("SELECT pg_create_physical_replication_slot('phys', true)")
    try:
        with pytest.raises(ReplicationConnectionError, match="START_REPLICATION of slot 'phys' failed") as err:
            hook.client.stream_changes("phys", "pub", start_lsn=0, upto_lsn=hook.current_wal_flush_lsn())
    finally:
        cur.execute("SELECT pg_drop_replication_slot('phys')")
    assert "\n" not in str(err.value) and "pg_hba" not in str(err.value)


def test_a_refused_replication_connection_is_one_typed_line_and_the_sql_read_it_names_works(drain_source, pg_dsn,
                                                                                             tmp_path):
    """A role the walsender refuses (no REPLICATION) gets ReplicationConnectionError naming `source.read: sql`;
    that read of the same slot, by a role that may read it, stages the changes."""
    import psycopg2

    from airflow_provider_pglogical.exceptions import ReplicationConnectionError
    from airflow_provider_pglogical.hooks import PgLogicalHook

    cur, hook = drain_source
    xids = workload(cur, 3)
    cur.execute("DROP ROLE IF EXISTS stream_no_replication; CREATE ROLE stream_no_replication LOGIN")
    start = hook.slot_info("s1").confirmed_flush_lsn
    refused = PgLogicalHook.from_dsn(psycopg2.extensions.make_dsn(pg_dsn, user="stream_no_replication"))
    try:
        with pytest.raises(ReplicationConnectionError, match=r"source\.read: sql") as err:
            refused.stream_changes("s1", "pub", start_lsn=start, upto_lsn=start + 1)
    finally:
        refused.close()
    assert "\n" not in str(err.value)
    drain_run(hook, config(str(tmp_path / "sql"), "s1", read="sql"))
    assert_log_matches(str(tmp_path / "sql"), "s1", xids)


@pytest.mark.parametrize(("read_to_the_bound", "empty_advance_bytes"), [(True, None), (True, 1), (False, None)])
def test_a_stream_the_server_ends_mid_run_confirms_nothing_unpublished_and_the_rerun_reads_on(
        drain_source, tmp_path, monkeypatch, caplog, read_to_the_bound, empty_advance_bytes):
    """The walsender ended after the first batch's manifest (as a wal_sender_timeout would). With the read-ahead
    thread having read to the bound (waited for, so the confirmation is sent at once, not left to the thread):
    confirming that batch fails and closes the stream, dropping the rows read ahead. The run then fails with one
    typed line rather than taking the stream's end for the bound's (which, with ``empty_advance_bytes`` reached,
    would publish an empty batch at the bound and advance the slot past transactions never staged). With the
    thread still reading (one block ahead, waiting for the decoder), it sends the confirmation and its failure is
    that one line too. The slot ends at the last published batch, and the next run leaves every transaction
    staged exactly once, as the SQL drain of a twin slot stages them."""
    from airflow_provider_pglogical.exceptions import ReplicationConnectionError

    monkeypatch.setenv(replication.READ_AHEAD_ENV, str(replication.READ_AHEAD_BYTES) if read_to_the_bound else "1")
    cur, hook = drain_source
    hook.create_slot("twin")
    xids = workload(cur, 40)
    uri, twin_uri = str(tmp_path / "stage"), str(tmp_path / "sql")
    kw = {"max_changes": 25, "empty_advance_bytes": empty_advance_bytes}
    streams: list[replication.ReplicationStream] = []
    opened = hook.stream_changes

    def stream_changes(*args, **kwargs):
        streams.append(opened(*args, **kwargs))
        return streams[-1]

    monkeypatch.setattr(hook, "stream_changes", stream_changes)
    held_before_confirm: list[int] = []

    def end_the_walsender(name: str) -> None:
        if name == "manifest_written" and not StagingReader.from_uri(uri, "s1").batches()[1:]:
            ahead = streams[-1]._ahead
            assert ahead is not None
            deadline = time.monotonic() + 30
            while read_to_the_bound and ahead.running and time.monotonic() < deadline:  # it reads on to the bound
                time.sleep(0.05)
            assert ahead.running != read_to_the_bound
            held_before_confirm.append(ahead.held)
            cur.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's1'")
            deadline = time.monotonic() + 30
            while hook.slot_info("s1").active and time.monotonic() < deadline:
                time.sleep(0.05)
            # Two heartbeats: the first write to the dead connection fails silently, the second reads its end, so
            # the batch's confirmation fails.
            time.sleep(2.5 * replication.HEARTBEAT_S)

    with caplog.at_level(logging.WARNING, logger="airflow_provider_pglogical.staging.drain"), \
            pytest.raises(ReplicationConnectionError) as err:
        drain_run(hook, config(uri, "s1", read="stream", itersize=10, **kw), on_checkpoint=end_the_walsender)
    assert "\n" not in str(err.value) and "run the drain again" in str(err.value)
    assert held_before_confirm and held_before_confirm[0] > 0  # rows read ahead and not yet decoded
    failed = [r.getMessage() for r in caplog.records if "the slot is advanced through SQL" in r.getMessage()]
    if read_to_the_bound:  # the path under test: the confirmation failed and closed the stream, dropping them
        assert len(failed) == 1 and "streaming slot 's1' failed" in failed[0], failed
    else:
        assert not failed
    published = StagingReader.from_uri(uri, "s1").batches()
    assert published and hook.slot_info("s1").confirmed_flush_lsn == published[-1].end_lsn
    drain_run(hook, config(uri, "s1", read="stream", **kw))
    drain_run(hook, config(twin_uri, "twin", read="sql", **kw))
    assert_log_matches(uri, "s1", xids)
    assert staged_xids(uri, "s1") == staged_xids(twin_uri, "twin")


def test_a_slot_a_crash_brings_back_behind_the_staged_log_is_refused_and_nothing_moves(tmp_path):
    """A streamed run, retention pruning all but the newest batch, then a server crash before any checkpoint: the
    slot comes back to the position last written, inside the pruned range. Whether the WAL there is the one the
    log was staged from (a crash) or another history's (a promoted standby, a restored server) is not known from
    the position, so the next run refuses it as a slot moved outside the drain, staging and advancing nothing."""
    import psycopg2

    from airflow_provider_pglogical.exceptions import StagingError
    from airflow_provider_pglogical.hooks import PgLogicalHook
    from airflow_provider_pglogical.staging.layout import StagingLayout
    from airflow_provider_pglogical.staging.retention import prune_batches, staged_batches
    from scripts.harness.pgserver import crash_and_restart, start_server, stop_server
    from tests.support.drain import SCHEMA_SQL, staged_xids

    server = start_server()  # its own server: the test crashes it
    try:
        conn = psycopg2.connect(server.dsn())
        conn.autocommit = True
        conn.cursor().execute(SCHEMA_SQL)
        hook = PgLogicalHook.from_dsn(server.dsn())
        hook.create_slot("s1")
        workload(conn.cursor(), 40)
        uri = str(tmp_path / "stage")
        results = drain_run(hook, config(uri, "s1", max_changes=25, read="stream"))
        hook.close()
        conn.close()
        reader = StagingReader.from_uri(uri, "s1")
        assert len(results) > 2 and hook_confirmed(server) == results[-1].end_lsn
        prune_batches(StagingLayout.from_uri(uri, "s1"), staged_batches(reader)[:-1])
        kept, first = staged_xids(uri, "s1"), reader.batches()[0]

        crash_and_restart(server)
        behind = hook_confirmed(server)
        assert behind < first.start_lsn  # back inside the pruned range: the case under test
        hook = PgLogicalHook.from_dsn(server.dsn())
        try:
            with pytest.raises(StagingError, match="moved outside this drain") as err:
                drain_run(hook, config(uri, "s1", read="stream"))
        finally:
            hook.close()
        assert "\n" not in str(err.value)
        assert staged_xids(uri, "s1") == kept and hook_confirmed(server) == behind
    finally:
        stop_server(server)


def hook_confirmed(server) -> int:
    from scripts.harness.pgserver import query

    (lsn,), = query(server.dsn(), "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = 's1'")
    return int(lsn)


def test_a_batch_published_for_longer_than_wal_sender_timeout_keeps_the_stream(drain_source, tmp_path, pg_server,
                                                                               monkeypatch):
    """Nothing reads the stream while a batch is written and published; the stream's status updates meanwhile keep
    the walsender from ending it (wal_sender_timeout), so one run stages every batch."""
    from scripts.harness.pgserver import execute

    cur, hook = drain_source
    xids = [run_tx(cur, [("INSERT INTO events (account, kind, payload) SELECT g, 'bulk', repeat(md5(g::text), 32) "
                          "FROM generate_series(1, 500) g", ())]) for _ in range(16)]  # more than the sockets hold
    uri = str(tmp_path / "stage")

    def slow_publish(name: str) -> None:
        if name == "files_written" and not StagingReader.from_uri(uri, "s1").batches():
            time.sleep(3)  # the first batch's upload outlasts the server's patience

    # One block ahead at most: the stream's reading thread waits for the decoder while the batch is published.
    monkeypatch.setenv(replication.READ_AHEAD_ENV, "1")
    execute(pg_server.dsn(), "ALTER SYSTEM SET wal_sender_timeout = '1500ms'", "SELECT pg_reload_conf()")
    try:
        results = drain_run(hook, config(uri, "s1", max_changes=1000, read="stream"), on_checkpoint=slow_publish)
    finally:
        execute(pg_server.dsn(), "ALTER SYSTEM RESET wal_sender_timeout", "SELECT pg_reload_conf()")
    assert len(results) > 1
    assert_log_matches(uri, "s1", xids)
