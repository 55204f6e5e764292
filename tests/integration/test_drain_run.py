"""``drain_run``: drain cycles under one lock, a peek read on across the batches cut by ``max_changes``.

Each batch must be exactly what a fresh ``drain_slot`` cycle stages (same boundaries, same rows,
same messages), every durable step in the same order, and the open peek used only when the slot
is where the previous batch left it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.hooks import PgLogicalHook
from airflow_provider_pglogical.staging import StagingReader
from airflow_provider_pglogical.staging.drain import DrainConfig, drain_run, drain_slot
from tests.conftest import REPO_ROOT
from tests.support.drain import assert_log_matches, run_tx, staged, staged_rows, workload
from tests.support.drain_child import KILLED

TABLES = ("public.accounts", "public.events", "public.docs")


class CountingPeeks:
    """The hook, with ``peek_changes`` calls counted (the drain sees no difference).

    ``peeks`` counts every call; ``peeks_with_rows`` only those that returned a row. Background
    WAL (a checkpoint's or the bgwriter's running-xacts record) can make the drain's final
    caught-up check peek an empty range again; that peek is legitimate and returns nothing.
    """

    def __init__(self, hook) -> None:
        self._hook, self.peeks, self.peeks_with_rows, self.advances = hook, 0, 0, 0

    def __getattr__(self, name: str):
        return getattr(self._hook, name)

    def advance_slot(self, *args, **kw):
        self.advances += 1
        return self._hook.advance_slot(*args, **kw)

    def peek_changes(self, *args, **kw):
        self.peeks += 1
        return self._counted(self._hook.peek_changes(*args, **kw))

    def _counted(self, rows):
        first = True
        try:
            for row in rows:
                if first:
                    self.peeks_with_rows, first = self.peeks_with_rows + 1, False
                yield row
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                close()


def config(uri: str, slot: str = "s1", **kw) -> DrainConfig:
    return DrainConfig(slot=slot, publication="pub", staging_uri=uri, **kw)


def cycles(hook, cfg: DrainConfig) -> list:
    """The reference: one ``drain_slot`` (fresh peek) per batch."""
    out = []
    while (r := drain_slot(hook, cfg)).staged:
        out.append(r)
    return out


def assert_same_staged_log(uri_a: str, slot_a: str, uri_b: str, slot_b: str) -> None:
    bounds = [[b.end_lsn for b in StagingReader.from_uri(u, s).batches()]
              for u, s in ((uri_a, slot_a), (uri_b, slot_b))]
    assert bounds[0] == bounds[1]
    for name in ("transactions.parquet", "messages.parquet"):
        assert staged(uri_a, slot_a, name).equals(staged(uri_b, slot_b, name)), name
    for table in TABLES:
        assert staged_rows(uri_a, slot_a, table).equals(staged_rows(uri_b, slot_b, table)), table


def open_peeks(cur) -> int:
    """Sessions still running a peek's statement (the COPY of a peek left open)."""
    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active' "
                "AND query LIKE '%%pg_logical_slot_peek_binary_changes%%'")
    return int(cur.fetchone()[0])


def non_transactional_messages(cur, n: int) -> None:
    for i in range(n):
        cur.execute("SELECT pg_logical_emit_message(false, 'loose', %s)", (f"m{i}",))


def test_batches_cut_by_max_changes_come_from_one_peek_and_equal_fresh_cycles(drain_source, tmp_path):
    cur, hook = drain_source
    hook.create_slot("twin")  # same changes, drained by fresh drain_slot cycles
    xids = workload(cur, 40)
    non_transactional_messages(cur, 3)
    xids += workload(cur, 10, start=40)
    uri, twin_uri = str(tmp_path / "run"), str(tmp_path / "cycles")
    client = CountingPeeks(hook)
    seen: list = []
    results = drain_run(client, config(uri, max_changes=25), on_result=seen.append)
    assert [r.batch_path for r in seen] == [r.batch_path for r in results]
    assert len(results) > 3 and all(r.staged and not r.replayed for r in results)
    assert all(b.start_lsn == a.end_lsn for a, b in zip(results, results[1:], strict=False))
    assert client.peeks_with_rows == 1 and open_peeks(cur) == 0  # every batch from the one peek
    assert len(results) >= 3 and client.advances == 1  # and the slot advanced once, to the last batch's end

    assert hook.slot_info("s1").confirmed_flush_lsn == results[-1].end_lsn
    assert_log_matches(uri, "s1", xids)
    reference = cycles(hook, config(twin_uri, slot="twin", max_changes=25))
    # the twin slot starts a little earlier (created second, before the workload): compare the ends
    assert [(r.end_lsn, r.tables) for r in reference] == [(r.end_lsn, r.tables) for r in results]
    assert_same_staged_log(uri, "s1", twin_uri, "twin")
    assert staged(uri, "s1", "messages.parquet").column("prefix").to_pylist().count("loose") == 3


def test_wal_written_during_the_run_is_staged_by_a_fresh_peek_after_the_open_one(drain_source, tmp_path):
    cur, hook = drain_source
    xids = workload(cur, 20)
    uri = str(tmp_path / "stage")
    late: list[int] = []

    def write_during_the_first_batch(name: str) -> None:
        if name == "manifest_written" and not late:  # beyond the open peek's upto
            late.append(run_tx(cur, [("INSERT INTO docs VALUES (7, 'late', 'row')", ())]))

    client = CountingPeeks(hook)
    results = drain_run(client, config(uri, max_changes=25), on_checkpoint=write_during_the_first_batch)
    assert client.peeks_with_rows == 2 and len(results) >= 3
    assert_log_matches(uri, "s1", xids + late)
    assert staged_rows(uri, "s1", "public.docs").num_rows == 1


def test_max_batches_and_stop_at_end_the_run_and_the_next_run_goes_on(drain_source, tmp_path):
    cur, hook = drain_source
    xids = workload(cur, 30)
    uri = str(tmp_path / "stage")
    first = drain_run(hook, config(uri, max_changes=20), max_batches=2)
    assert len(first) == 2
    assert hook.slot_info("s1").confirmed_flush_lsn == first[-1].end_lsn
    stop = drain_run(hook, config(uri, max_changes=20), stop_at=first[-1].end_lsn + 1)
    assert len(stop) == 1 and stop[0].start_lsn == first[-1].end_lsn
    rest = drain_run(hook, config(uri, max_changes=20))
    assert rest and rest[0].start_lsn == stop[0].end_lsn
    assert_log_matches(uri, "s1", xids)


def test_a_failure_in_a_later_batch_keeps_the_earlier_ones_and_a_rerun_stages_the_rest(drain_source, tmp_path,
                                                                                       pg_dsn):
    cur, hook = drain_source
    xids = workload(cur, 40)
    uri = str(tmp_path / "stage")
    files_written = 0

    def fail_in_third_batch(name: str) -> None:
        nonlocal files_written
        if name == "files_written":
            files_written += 1
            if files_written == 3:
                raise RuntimeError("simulated failure before the third manifest")

    published: list = []
    with pytest.raises(RuntimeError, match="third manifest"):
        drain_run(hook, config(uri, max_changes=25), on_result=published.append, on_checkpoint=fail_in_third_batch)
    assert len(published) == 2
    batches = StagingReader.from_uri(uri, "s1").batches()
    assert [(b.start_lsn, b.end_lsn) for b in batches] == [(r.start_lsn, r.end_lsn) for r in published]
    assert hook.slot_info("s1").confirmed_flush_lsn == published[-1].end_lsn  # never past what is published
    other = PgLogicalHook.from_dsn(pg_dsn)
    try:
        assert other.try_lock_slot("s1")  # the run released its lock (advisory locks are per session)
        other.unlock_slot("s1")
        assert open_peeks(cur) == 0  # and ended its peek
    finally:
        other.close()
    again = drain_run(hook, config(uri, max_changes=25))
    assert again[0].start_lsn == published[-1].end_lsn
    assert_log_matches(uri, "s1", xids)


def test_the_open_peek_is_not_read_on_when_the_slot_moved_between_batches(drain_source, tmp_path):
    cur, hook = drain_source
    workload(cur, 40)
    uri = str(tmp_path / "stage")
    advanced = 0

    def move_slot_after_first_batch(name: str) -> None:
        nonlocal advanced
        if name == "manifest_written":  # drain_run advances later: move it before that
            advanced += 1
            if advanced == 1:  # someone moves the slot behind the drain's back
                run_tx(cur, [("INSERT INTO docs VALUES (1, 'x', 'y')", ())])
                hook.advance_slot("s1", hook.current_wal_flush_lsn())

    client = CountingPeeks(hook)
    with pytest.raises(StagingError, match="moved outside"):
        drain_run(client, config(uri, max_changes=25), on_checkpoint=move_slot_after_first_batch)
    assert client.peeks == 1 and len(StagingReader.from_uri(uri, "s1").batches()) == 1


def test_get_mode_runs_one_batch_per_read(drain_source, tmp_path):
    cur, hook = drain_source
    xids = workload(cur, 12)
    uri = str(tmp_path / "stage")
    results = drain_run(hook, config(uri, mode="get", max_changes=5))
    # get consumes the whole range it reads: max_changes does not apply. WAL the server writes after that read (a
    # busy machine's background records) may make a later read stage a batch of no transaction, never one of these.
    assert results[0].transactions == 12 and all(r.transactions == 0 for r in results[1:])
    assert_log_matches(uri, "s1", xids)


def test_a_failed_row_group_write_fails_the_batch_and_advances_nothing_past_what_is_published(
        drain_source, tmp_path, monkeypatch):
    """Row groups are written on a background thread (staging.writer.RowGroupWriter): its failure
    must surface in the drain as the error itself, before any manifest that would cover it."""
    cur, hook = drain_source
    xids = workload(cur, 40)
    uri = str(tmp_path / "stage")
    real = pq.ParquetWriter.write_table
    calls = {"n": 0}

    def disk_full_later(self, table, row_group_size=None):
        calls["n"] += 1
        if calls["n"] > 20:  # the first batch's files (~13 row groups) get written, a later batch's fail
            raise OSError("No space left on device")
        return real(self, table, row_group_size=row_group_size)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full_later)
    published: list = []
    with pytest.raises(OSError, match="No space left"):
        drain_run(hook, config(uri, max_changes=25, row_group_rows=4), on_result=published.append)
    assert published, "the failure was meant for a later batch"
    batches = StagingReader.from_uri(uri, "s1").batches()
    assert [b.end_lsn for b in batches] == [r.end_lsn for r in published]
    assert hook.slot_info("s1").confirmed_flush_lsn == published[-1].end_lsn
    monkeypatch.undo()
    drain_run(hook, config(uri, max_changes=25))
    assert_log_matches(uri, "s1", xids)


def test_a_run_killed_before_its_advance_is_replayed_by_the_next_run_with_one_advance(drain_source, tmp_path,
                                                                                      pg_dsn):
    """drain_run advances once per peek: a run killed after publishing three batches leaves the slot
    at its start. The next run finds them published, stages nothing twice and advances over them once."""
    cur, hook = drain_source
    xids = workload(cur, 40)
    uri = str(tmp_path / "stage")
    before = hook.slot_info("s1").confirmed_flush_lsn
    proc = subprocess.run([sys.executable, "-m", "tests.support.drain_child",
                           json.dumps({"dsn": pg_dsn, "slot": "s1", "publication": "pub", "staging_uri": uri,
                                       "kill_at": "manifest_written:3", "max_changes": 25, "run": True})],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == KILLED, proc.stderr[-3000:]
    published = StagingReader.from_uri(uri, "s1").batches()
    assert len(published) == 3 and hook.slot_info("s1").confirmed_flush_lsn == before

    xids += workload(cur, 5, start=40)
    client = CountingPeeks(hook)
    results = drain_run(client, config(uri, max_changes=25))
    assert [r.replayed for r in results[:3]] == [True] * 3 and not any(r.replayed for r in results[3:])
    assert [r.end_lsn for r in results[:3]] == [b.end_lsn for b in published]
    # once before the fresh peek (a peek reads from the slot's position), once at the end
    assert client.advances == 2 and hook.slot_info("s1").confirmed_flush_lsn == results[-1].end_lsn
    assert_log_matches(uri, "s1", xids)
