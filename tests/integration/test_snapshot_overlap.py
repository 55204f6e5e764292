"""Snapshot loads overlapped with the snapshot's read (``apply/targets/postgres/overlap.py``): a set of tables loads
into the target as soon as the snapshot publishes it, while the other tables are still read; a kill inside that
window leaves a state the next run completes exactly once; tables whose rows need Spark are left to the apply
after the snapshot; ``pglogical run`` loads this way."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import psycopg2
import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.direct import ENV_SWITCH
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.targets.postgres.overlap import STREAM_SWITCH, OverlappedLoad, _why
from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget
from airflow_provider_pglogical.apply.without_spark import refusing_session
from airflow_provider_pglogical.exceptions import format_lsn
from airflow_provider_pglogical.snapshot.layout import SnapshotLayout
from airflow_provider_pglogical.snapshot.run import (
    SnapshotJob,
    SnapshotSettings,
    WrittenChunk,
    initial_snapshot,
    request_resync,
    sync_pending,
)
from scripts.harness.pgserver import execute, make_target, query
from tests.conftest import REPO_ROOT
from tests.integration.test_cli_no_spark import DOCS, ITEMS, pipeline, spec_file  # noqa: F401 (fixture)
from tests.integration.test_cli_no_spark import run as pglogical_run
from tests.support.kill_points import KILLED
from tests.support.snapshot import SNAP_SCHEMA_SQL

TARGET_SQL = """
CREATE TABLE parents (id int PRIMARY KEY, name text NOT NULL, region text, amount numeric(12,2));
CREATE TABLE children (id int PRIMARY KEY, parent_id int REFERENCES parents(id) ON DELETE CASCADE,
                       body text, big text, secret text);
CREATE TABLE wide (id bigint PRIMARY KEY, payload text, flags int[], at timestamptz);
"""
TABLES = ("parents", "children", "wide")
CHUNK_BYTES = 256 << 10  # wide (30,000 rows) in several chunks: read after parents and children (name order)


def job(source: str, uri: str) -> SnapshotJob:
    return SnapshotJob(dsn=source, slot="s1", publication="pub", staging_uri=uri,
                       tables={f"public.{t}": (None, None) for t in TABLES},
                       settings=SnapshotSettings(initial=True, parallelism=1, chunk_bytes=CHUNK_BYTES))


def loader_of(target: str, uri: str, *, on_checkpoint=None, log=None) -> OverlappedLoad:
    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    return OverlappedLoad(lambda: (PostgresTarget(refusing_session(True), config, target, on_checkpoint=on_checkpoint),
                                   config), log=log)


def wide_job(source: str, uri: str, *, initial: bool = False, chunk_bytes: int = CHUNK_BYTES) -> SnapshotJob:
    return SnapshotJob(dsn=source, slot="s1", publication="pub", staging_uri=uri, tables={"public.wide": (None, None)},
                       settings=SnapshotSettings(initial=initial, parallelism=1, chunk_bytes=chunk_bytes))


def synced(target: str) -> dict[str, str]:
    if query(target, "SELECT to_regclass('pglogical_sync')") == [(None,)]:
        return {}
    return dict(query(target, "SELECT target_table, sync_lsn::text FROM pglogical_sync"))


def assert_equal(source: str, target: str) -> None:
    for table in TABLES:
        expected = query(source, f"SELECT t::text FROM {table} t ORDER BY id")  # noqa: S608 - the module's names
        assert query(target, f"SELECT t::text FROM {table} t ORDER BY id") == expected, table  # noqa: S608


def test_a_published_set_is_loaded_while_the_snapshot_still_reads_another_table(pg_server, pg_dsn, tmp_path):
    """Observed in the target itself: when the first chunk of ``wide`` is written, the snapshot holds its reading
    until parents and children (published together) show in the target's sync table with every row — and ``wide``
    has chunks still to read then. Without the overlap the wait runs out (nothing loads before the snapshot ends)."""
    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL)
    uri = str(tmp_path / "stage")
    seen: dict[str, object] = {}

    def hold(point: str) -> None:
        if point == "done":
            seen["published"] = seen.get("published", 0) + 1  # type: ignore[operator]
        elif point == "chunk_written" and seen.get("published") == 2 and "loaded" not in seen:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(synced(target)) < 2:
                time.sleep(0.05)
            seen["loaded"] = synced(target)
            seen["rows"] = query(target, "SELECT (SELECT count(*) FROM parents), (SELECT count(*) FROM children)")

    with loader_of(target, uri) as loader:
        result = initial_snapshot(job(source, uri), on_checkpoint=hold, on_published=loader.published)
    lsn = format_lsn(result.lsn)
    assert seen["loaded"] == {"public.parents": lsn, "public.children": lsn}, "not loaded while wide was read"
    assert seen["rows"] == query(source, "SELECT (SELECT count(*) FROM parents), (SELECT count(*) FROM children)")
    layout = SnapshotLayout.from_uri(uri, "s1")
    wide = layout.manifest(layout.latest("public.wide"))
    assert wide.chunks >= 3  # the hold came at its first chunk: the others were read after the load
    assert loader.left == {} and set(loader.rows) == {f"public.{t}" for t in TABLES}
    assert synced(target) == {f"public.{t}": lsn for t in TABLES}
    assert_equal(source, target)


def test_a_set_a_foreign_key_of_the_target_links_to_a_later_set_is_loaded_with_it_by_the_apply(pg_server, pg_dsn,
                                                                                                tmp_path):
    """Only the target links them: ``wide`` references ``parents`` there (a column the source lacks). The source's
    sets (parents with children, then wide) cannot load one by one — parents could then never be emptied without
    wide — so the loaders leave both sets, saying why, and the apply loads the three tables in one transaction."""
    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL + "ALTER TABLE wide ADD COLUMN parent_id int REFERENCES parents(id);")
    uri = str(tmp_path / "stage")
    with loader_of(target, uri) as loader:
        result = initial_snapshot(job(source, uri), on_published=loader.published)
    assert loader.rows == {} and loader.timeline == [], loader.summary()
    assert set(loader.left) == {f"public.{t}" for t in TABLES}, loader.summary()
    assert all("foreign key of the target" in why for why in loader.left.values()), loader.left
    assert "public.wide" in loader.left["public.parents"] and "public.parents" in loader.left["public.wide"]
    apply_slot(refusing_session(True), ApplyConfig(slot="s1", staging_root=uri, tables={}), target)
    lsn = format_lsn(result.lsn)
    assert synced(target) == {f"public.{t}": lsn for t in TABLES}
    for table, columns in (("parents", "t::text"), ("children", "t::text"), ("wide", "id, payload, flags, at")):
        expected = query(source, f"SELECT {columns} FROM {table} t ORDER BY id")  # noqa: S608 - the module's names
        assert query(target, f"SELECT {columns} FROM {table} t ORDER BY id") == expected, table  # noqa: S608


def test_of_a_set_whose_load_failed_only_the_groups_not_committed_are_left(pg_server, pg_dsn, tmp_path):
    """The target does not link parents and children (two atomic groups of one published set, loaded side by side);
    the second group to reach its COMMIT fails: the first committed, so only the other's table is left to the
    apply, which loads it."""
    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL.replace(" REFERENCES parents(id) ON DELETE CASCADE", ""))
    uri = str(tmp_path / "stage")
    commits: list[str] = []
    lock = threading.Lock()

    def second_commit_fails(point: str) -> None:
        if point == "snapshot_before_commit":
            with lock:
                commits.append(point)
                if len(commits) == 2:
                    raise RuntimeError("the second group stopped before its COMMIT")

    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    loader = OverlappedLoad(lambda: (PostgresTarget(refusing_session(True), config, target,
                                                    on_checkpoint=second_commit_fails), config))
    with loader:
        result = initial_snapshot(job(source, uri), on_published=loader.published)
    lsn = format_lsn(result.lsn)
    committed = set(synced(target))
    assert len(committed & {"public.parents", "public.children"}) == 1, committed
    assert set(loader.left) == {"public.parents", "public.children"} - committed, loader.summary()
    assert all(why.startswith("RuntimeError") for why in loader.left.values())
    apply_slot(refusing_session(True), config, target)
    assert synced(target) == {f"public.{t}": lsn for t in TABLES}
    assert_equal(source, target)


BOOKKEEPING = ("SELECT slot, target_table, sync_lsn::text, rows FROM pglogical_sync ORDER BY 1, 2",
               "SELECT slot, target_table, end_lsn::text FROM pglogical_progress ORDER BY 1, 2")


@pytest.mark.parametrize("target_sql", [TARGET_SQL, TARGET_SQL + "ALTER TABLE wide ADD COLUMN parent_id int "
                                                                  "REFERENCES parents(id);"], ids=["plain", "target_fk"])
def test_the_overlapped_load_ends_as_the_load_after_the_snapshot(pg_server, pg_dsn, tmp_path, target_sql):
    """The same staged snapshot into two targets: one loaded while the snapshot reads, then the apply; the other by
    the apply after the snapshot only (the reference path). Rows, sync marks and watermarks are the same."""
    source = pg_dsn
    overlapped, reference = two_targets(pg_server, source, target_sql)
    uri = str(tmp_path / "stage")
    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    with loader_of(overlapped, uri) as loader:
        initial_snapshot(job(source, uri), on_published=loader.published)
    # plain: every set loaded while reading; target_fk: every set left to the apply (one transaction for the three)
    assert set(loader.rows) == ({f"public.{t}" for t in TABLES} if target_sql == TARGET_SQL else set())
    for target in (overlapped, reference):
        apply_slot(refusing_session(True), config, target)
    assert_same_as(overlapped, reference)


def two_targets(pg_server, source: str, target_sql: str) -> tuple[str, str]:
    """The source's snapshot schema and two fresh targets with ``target_sql``: one to load while the snapshot
    reads, one for the load after it (the reference path)."""
    (_, first), (_, second) = make_target(pg_server), make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    for target in (first, second):
        execute(target, target_sql)
    return first, second


def assert_same_as(target: str, reference: str) -> None:
    """Rows, sync marks and watermarks the same in both targets."""
    for table in TABLES:
        rows = f"SELECT t::text FROM {table} t ORDER BY id"  # noqa: S608 - the module's names
        assert query(target, rows) == query(reference, rows) != [], table
    for bookkeeping in BOOKKEEPING:
        assert query(target, bookkeeping) == query(reference, bookkeeping) != [], bookkeeping


def copying_into(target: str, table: str) -> int:
    """Rows a COPY into ``table`` in progress on the target has taken so far (0: no such COPY)."""
    found = query(target, f"SELECT tuples_processed FROM pg_stat_progress_copy WHERE relid = '{table}'::regclass")
    return int(found[0][0]) if found else 0


def test_a_table_read_alone_is_copied_into_the_target_while_its_later_chunks_are_read(pg_server, pg_dsn, tmp_path):
    """``wide`` (read alone, in several chunks) streams into its target table: when its first chunk is written,
    the snapshot holds its reading until the target's ``pg_stat_progress_copy`` shows a COPY into ``wide`` with
    rows — while the other chunks are not read yet. The end state equals the load after the snapshot into another
    target (rows, sync marks, watermarks). Without the streaming the wait runs out: nothing COPYs before the
    table is published."""
    source = pg_dsn
    streamed, reference = two_targets(pg_server, source, TARGET_SQL)
    uri = str(tmp_path / "stage")
    seen: dict[str, int] = {"published": 0}

    def hold(point: str) -> None:
        if point == "done":
            seen["published"] += 1
        elif point == "chunk_written" and seen["published"] == 2 and "copying" not in seen:  # wide's first chunk
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not copying_into(streamed, "wide"):
                time.sleep(0.05)
            seen["copying"] = copying_into(streamed, "wide")
            seen["marked"] = "public.wide" in synced(streamed)  # committed only once published

    with loader_of(streamed, uri) as loader:
        result = initial_snapshot(job(source, uri), on_checkpoint=hold, on_published=loader)
    layout = SnapshotLayout.from_uri(uri, "s1")
    wide = layout.manifest(layout.latest("public.wide"))
    assert 0 < seen["copying"] < wide.rows and not seen["marked"], seen
    assert wide.chunks >= 3 and loader.left == {}, loader.summary()
    assert set(loader.rows) == {f"public.{t}" for t in TABLES} and loader.rows["public.wide"] == {
        "snapshot_rows": wide.rows}
    assert [(t["tables"], t["streamed_chunks"]) for t in loader.timeline if "streamed_chunks" in t] == [
        (["public.wide"], wide.chunks)], loader.timeline
    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    assert not any(r.applied for r in apply_slot(refusing_session(True), config, streamed))
    apply_slot(refusing_session(True), config, reference)
    assert synced(streamed) == {f"public.{t}": format_lsn(result.lsn) for t in TABLES}
    assert_same_as(streamed, reference)


def target_with_an_old_wide_row(pg_server, source: str) -> tuple[str, list[tuple[str]]]:
    """The source's snapshot schema, and a fresh target whose ``wide`` holds one row the snapshot has not."""
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL + "INSERT INTO wide VALUES (-1, 'before', '{}', now());")
    return target, query(target, "SELECT t::text FROM wide t")


def test_a_kill_while_a_table_streams_leaves_its_target_untouched_and_the_rerun_exact(pg_server, pg_dsn, tmp_path):
    """The process dies inside the streamed COPY of ``wide`` (its first chunk sent, the others not read): the
    target table keeps its old row and no sync mark — the transaction died with the connection — and the next
    run's snapshot, streamed again, leaves it equal to the source."""
    source = pg_dsn
    target, before = target_with_an_old_wide_row(pg_server, source)
    uri = str(tmp_path / "stage")
    killed_while_wide_is_read(source, target, uri, ["public.wide"], "snapshot_copying:1", streamed=True)
    assert query(target, "SELECT t::text FROM wide t") == before and synced(target) == {}

    with loader_of(target, uri) as loader:
        again = sync_pending(wide_job(source, uri), on_published=loader)
    assert loader.left == {} and [t["streamed_chunks"] for t in loader.timeline] == [again.tables["public.wide"][
        "chunks"]], loader.summary()
    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    assert not any(r.applied for r in apply_slot(refusing_session(True), config, target))
    rows = "SELECT t::text FROM wide t ORDER BY id"
    assert query(target, rows) == query(source, rows) and synced(target) == {"public.wide": format_lsn(again.lsn)}


def test_a_stream_the_snapshot_ends_before_says_why_and_commits_nothing(pg_server, pg_dsn, tmp_path):
    """The snapshot fails once ``wide``'s first chunk is in the target's COPY: the loader's own reason, raised
    inside that COPY (the snapshot ended before the next chunk), is the log's one line for it — not the server's
    error that ended the COPY — and the target table keeps its old row and no sync mark."""
    source = pg_dsn
    target, before = target_with_an_old_wide_row(pg_server, source)
    uri = str(tmp_path / "stage")
    said: list[str] = []

    def fail_once_copying(point: str) -> None:
        if point == "chunk_written":
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not copying_into(target, "wide"):
                time.sleep(0.05)
            raise RuntimeError("the snapshot stopped")

    with pytest.raises(RuntimeError, match="the snapshot stopped"), loader_of(target, uri, log=said.append) as loader:
        initial_snapshot(wide_job(source, uri, initial=True), on_checkpoint=fail_once_copying, on_published=loader)
    assert [line.split(" not streamed while it was read: ")[1] for line in said if "public.wide" in line] == [
        "the snapshot of public.wide ended before its chunk 1 was written"], said
    assert query(target, "SELECT t::text FROM wide t") == before and synced(target) == {}


def test_a_later_snapshot_of_a_streamed_table_is_loaded_as_its_own(pg_server, pg_dsn, tmp_path):
    """``wide`` streams while the initial snapshot reads it; a resync in the same run snapshots it again, in one
    chunk, after a change: that publication is loaded as its own (rows and sync mark of the resync), never taken
    for the first snapshot's stream, which had committed."""
    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL)
    uri = str(tmp_path / "stage")
    with loader_of(target, uri) as loader:
        first = initial_snapshot(wide_job(source, uri, initial=True), on_published=loader)
        execute(source, "UPDATE wide SET payload = 'resynced' WHERE id = 1")
        request_resync(wide_job(source, uri), ["public.wide"])
        again = sync_pending(wide_job(source, uri, chunk_bytes=64 << 20), on_published=loader)
    assert first.tables["public.wide"]["chunks"] >= 3 and again.tables["public.wide"]["chunks"] == 1
    # not vacuous: the first snapshot streamed (its loader's commit), the resync loaded on its publication
    assert loader.left == {} and [t.get("streamed_chunks") for t in loader.timeline] == [
        first.tables["public.wide"]["chunks"], None], loader.summary()
    assert synced(target) == {"public.wide": format_lsn(again.lsn)}, loader.summary()
    rows = "SELECT t::text FROM wide t ORDER BY id"
    assert query(target, rows) == query(source, rows)


def test_a_streamed_tables_loader_starts_only_once_a_load_slot_frees(pg_server, pg_dsn, tmp_path):
    """parents and children load as two groups (the target does not link them), both held inside their COPY
    when ``wide``'s first chunk is handed to the loader: with every load slot taken, no loader of ``wide`` runs
    (none waits for a slot). Released, their slots free and ``wide``'s loader starts in one, COPYing it before
    its other chunks are read; it ends as the load after the snapshot."""
    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL.replace(" REFERENCES parents(id) ON DELETE CASCADE", ""))
    uri = str(tmp_path / "stage")
    changed, released = threading.Condition(), threading.Event()
    held: list[str] = []
    seen: dict[str, object] = {}

    def hold_groups(point: str) -> None:
        if point == "snapshot_copying" and threading.current_thread().name.startswith("snapshot-group"):
            with changed:
                held.append(threading.current_thread().name)
                changed.notify_all()
            released.wait(60)

    class FirstChunkOnceHeld:
        """The loader as the snapshot's listener; ``wide``'s first chunk reaches it once both groups hold."""

        def __init__(self, loader: OverlappedLoad) -> None:
            self.loader = loader

        def __call__(self, tables: list[str]) -> None:
            self.loader(tables)

        def publishing(self, *args: object) -> None:
            self.loader.publishing(*args)

        def chunk_written(self, chunk: WrittenChunk) -> None:
            if chunk.table != "public.wide" or chunk.index:
                return self.loader.chunk_written(chunk)
            with changed:
                seen["held"] = changed.wait_for(lambda: len(held) == 2, timeout=60)
            self.loader.chunk_written(chunk)
            seen["loaders"] = [t.name for t in threading.enumerate() if t.name == "snapshot-stream"]
            released.set()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not copying_into(target, "wide"):
                time.sleep(0.05)
            seen["copying"] = copying_into(target, "wide")
            return None

    with loader_of(target, uri, on_checkpoint=hold_groups) as loader:
        initial_snapshot(job(source, uri), on_published=FirstChunkOnceHeld(loader))
    assert seen["held"] and seen["loaders"] == [] and seen["copying"], seen
    assert loader.left == {} and set(loader.rows) == {f"public.{t}" for t in TABLES}, loader.summary()
    assert [t["tables"] for t in loader.timeline if "streamed_chunks" in t] == [["public.wide"]], loader.timeline
    assert_equal(source, target)


TWO_SETS_SQL = """
CREATE TABLE a1 (id int PRIMARY KEY); CREATE TABLE a2 (id int PRIMARY KEY, a1_id int {a});
CREATE TABLE b1 (id int PRIMARY KEY); CREATE TABLE b2 (id int PRIMARY KEY, b1_id int {b});
"""


def test_the_loaders_load_at_most_parallel_groups_groups_at_once(pg_server, pg_dsn, tmp_path):
    """Two sets published close together (linked by the source's foreign keys, not by the target's: two atomic
    groups each), each load held inside its COPY until a third starts or 3 s pass: never more than
    ``PARALLEL_GROUPS`` group transactions at once, though two loaders could run two groups each."""
    from airflow_provider_pglogical.apply.targets.postgres.snapshot import PARALLEL_GROUPS

    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, TWO_SETS_SQL.format(a="REFERENCES a1(id)", b="REFERENCES b1(id)")
            + "".join(f"INSERT INTO {t} SELECT g FROM generate_series(1, 1000) g; " for t in ("a1", "b1"))
            + "INSERT INTO a2 SELECT g, g FROM generate_series(1, 1000) g; "
            + "INSERT INTO b2 SELECT g, g FROM generate_series(1, 1000) g; "
            + "CREATE PUBLICATION pub FOR TABLE a1, a2, b1, b2;")
    execute(target, TWO_SETS_SQL.format(a="", b=""))
    uri = str(tmp_path / "stage")
    active: set[int] = set()
    most = [0]
    changed = threading.Condition()

    def count(point: str) -> None:
        with changed:
            if point == "snapshot_copying":
                active.add(threading.get_ident())
                most[0] = max(most[0], len(active))
                changed.notify_all()
                changed.wait_for(lambda: len(active) > PARALLEL_GROUPS, timeout=3)
            elif point == "snapshot_committed":
                active.discard(threading.get_ident())

    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    snapshot = SnapshotJob(dsn=source, slot="s1", publication="pub", staging_uri=uri,
                           tables={f"public.{t}": (None, None) for t in ("a1", "a2", "b1", "b2")},
                           settings=SnapshotSettings(initial=True, parallelism=1))
    with OverlappedLoad(lambda: (PostgresTarget(refusing_session(True), config, target, on_checkpoint=count),
                                 config)) as loader:
        initial_snapshot(snapshot, on_published=loader.published)
    assert loader.left == {} and len(loader.rows) == 4, loader.summary()
    assert most[0] == PARALLEL_GROUPS


def killed_while_wide_is_read(source: str, target: str, uri: str, tables: list[str], kill_at: str, *,
                              streamed: bool = False) -> None:
    """Run the snapshot with its loader in a child process killed at ``kill_at`` (``snapshot_overlap_child``) while
    ``wide`` is still read; return once the killed process's backends on the target have ended."""
    args = {"source": source, "target": target, "slot": "s1", "publication": "pub", "staging_uri": uri,
            "tables": tables, "chunk_bytes": CHUNK_BYTES, "kill_at": kill_at, "streamed": streamed}
    proc = subprocess.run([sys.executable, "-m", "tests.support.snapshot_overlap_child", json.dumps(args)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == KILLED, proc.stderr[-3000:]
    layout = SnapshotLayout.from_uri(uri, "s1")
    assert layout.latest("public.wide") is None and set(layout.requests()) == {"public.wide"}  # killed mid-read
    deadline = time.monotonic() + 60  # the killed process's backends end when they see the socket close
    while query(target, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid()") != [(0,)] and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.parametrize("kill_at", ["snapshot_copying:1", "snapshot_committed:1"])
def test_a_kill_inside_the_overlapped_window_reruns_to_an_exact_copy(pg_server, pg_dsn, tmp_path, kill_at):
    """The process dies inside the first set's load (mid-COPY) or right after its COMMIT, while ``wide`` is still
    being read: the target shows nothing of an uncommitted load, and the next run (the snapshot of what was not
    published, then the apply) ends with every row once."""
    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL)
    uri = str(tmp_path / "stage")
    killed_while_wide_is_read(source, target, uri, [f"public.{t}" for t in TABLES], kill_at)
    if kill_at.startswith("snapshot_committed"):
        assert set(synced(target)) == {"public.parents", "public.children"}
    else:
        assert synced(target) == {} and query(target, "SELECT count(*) FROM parents") == [(0,)]

    with loader_of(target, uri) as loader:  # the next run: its snapshot of wide loads as it is published
        again = sync_pending(job(source, uri), on_published=loader.published)
    assert set(again.tables) == {"public.wide"} and loader.left == {}
    config = ApplyConfig(slot="s1", staging_root=uri, tables={})
    apply_slot(refusing_session(True), config, target)  # what the overlap left (after a mid-COPY kill: parents, children)
    assert_equal(source, target)
    assert synced(target)["public.wide"] == format_lsn(again.lsn)
    assert not any(r.applied for r in apply_slot(refusing_session(True), config, target))


def test_sets_whose_rows_need_spark_are_left_to_the_apply(pg_server, pg_dsn, tmp_path, spark, monkeypatch):
    """With the direct path switched off every table's rows go through Spark: the loaders start no JVM, load
    nothing, and leave every set to the apply after the snapshot, which loads them."""
    source = pg_dsn
    _, target = make_target(pg_server)
    execute(source, SNAP_SCHEMA_SQL)
    execute(target, TARGET_SQL)
    uri = str(tmp_path / "stage")
    monkeypatch.setenv(ENV_SWITCH, "0")
    with loader_of(target, uri) as loader:
        initial_snapshot(job(source, uri), on_published=loader.published)
    assert loader.rows == {} and set(loader.left) == {f"public.{t}" for t in TABLES}
    assert all("Spark" in why for why in loader.left.values()) and synced(target) == {}
    apply_slot(spark, ApplyConfig(slot="s1", staging_root=uri, tables={}), target)
    assert_equal(source, target)


def test_pglogical_run_loads_each_table_as_its_snapshot_is_published(pipeline):  # noqa: F811
    """``pglogical run`` with ``snapshot.initial``: the tables load while the snapshot reads (its JSON says so),
    no JVM starts, the target equals the source; the next run has nothing to load."""
    execute(pipeline["source"], "INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, now() "
                                "FROM generate_series(1, 3000) g; "
                                "INSERT INTO docs SELECT g, 't' || g, repeat('b', g % 300) FROM generate_series(1, 500) g")
    spec = spec_file(pipeline, "initial.yaml", snapshot=True)
    summary, logs = pglogical_run(spec, pipeline["tmp"], java=False)
    loaded = summary["snapshot_loaded_while_reading"]
    assert loaded["left_to_apply"] == {}, loaded  # the two sets' loaders start at once on an empty target
    assert loaded["rows"] == {"public.items": {"snapshot_rows": 3000}, "public.docs": {"snapshot_rows": 500}}
    assert "loaded while the snapshot reads on" in summary["stderr"]
    assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False and logs == []
    assert query(pipeline["target"], ITEMS) == query(pipeline["source"], ITEMS)
    assert query(pipeline["target"], DOCS) == query(pipeline["source"], DOCS)
    again, _ = pglogical_run(spec, pipeline["tmp"], java=False)
    assert "snapshot_loaded_while_reading" not in again and again["apply"]["batches_applied"] == 0


def test_the_loaders_release_the_slot_lock_before_the_drain(pipeline, monkeypatch):  # noqa: F811
    """``pglogical run`` with ``snapshot.initial``, in process: while its drain runs (after the snapshot), an apply
    of the slot into the target may take the slot's lock and no connection of the loaders is open — they ended
    with the snapshot steps, not with the drain."""
    from airflow_provider_pglogical.apply.targets.postgres import catalog
    from airflow_provider_pglogical.pipeline import runs
    from airflow_provider_pglogical.pipeline.spec import load_spec

    execute(pipeline["source"], "INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, now() "
                                "FROM generate_series(1, 300) g")
    spec = load_spec(spec_file(pipeline, "lock.yaml", snapshot=True))
    seen: dict[str, object] = {}
    drain = runs.drain

    def observed_drain(*args: object, **kwargs: object) -> object:
        conn = catalog.connect(pipeline["target"])
        try:
            seen["lock_free"] = catalog.try_lock_slot(conn, spec.source.slot)
            catalog.unlock_slot(conn, spec.source.slot)
            seen["others"] = query(pipeline["target"], "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                   "current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        finally:
            conn.close()
        return drain(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runs, "drain", observed_drain)
    summary = runs.run_pending(spec)
    assert summary["snapshot_loaded_while_reading"]["rows"]["public.items"] == {"snapshot_rows": 300}, summary
    assert seen == {"lock_free": True, "others": [(1,)]}  # the probe's own connection only
    assert query(pipeline["target"], ITEMS) == query(pipeline["source"], ITEMS)


def test_a_target_the_loaders_cannot_reach_fails_nothing_of_the_snapshot(pg_server, pg_dsn, tmp_path):
    """The loaders' target session does not open (here: a database that does not exist): the snapshot is staged
    and published whole all the same, every set is left to the apply with the reason, and nothing was loaded."""
    source = pg_dsn
    execute(source, SNAP_SCHEMA_SQL)
    uri = str(tmp_path / "stage")
    with loader_of(pg_server.dsn("no_such_database"), uri) as loader:
        result = initial_snapshot(job(source, uri), on_published=loader.published)
    assert set(result.tables) == {f"public.{t}" for t in TABLES}
    assert SnapshotLayout.from_uri(uri, "s1").requests() == {}
    assert loader.rows == {} and set(loader.left) == {f"public.{t}" for t in TABLES}
    assert all(why.startswith("OperationalError") and "no_such_database" in why for why in loader.left.values())


def test_a_loaders_reason_names_the_servers_error_without_a_rows_value(pg_dsn):
    """The reasons go into the run's JSON and log: a data exception (its message quotes the value, anywhere in it)
    by its SQLSTATE and message without what it quotes, a unique violation by its primary message (the key's value
    is only in its DETAIL)."""
    execute(pg_dsn, "CREATE TABLE uniq (id int PRIMARY KEY)", "INSERT INTO uniq VALUES (424242)")
    reasons = []
    for sql in ("SELECT 'secret-value'::int", "INSERT INTO uniq VALUES (424242)", "SELECT '1e400'::float8"):
        with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur, pytest.raises(psycopg2.Error) as raised:
            cur.execute(sql)
        reasons.append(_why(raised.value))
    assert reasons[0] == "InvalidTextRepresentation (SQLSTATE 22P02): invalid input syntax for type integer: …"
    assert reasons[1].startswith("UniqueViolation (SQLSTATE 23505): duplicate key value violates unique constraint")
    assert reasons[2] == "NumericValueOutOfRange (SQLSTATE 22003): … is out of range for type double precision"
    assert not any("secret-value" in r or "424242" in r or "1e400" in r for r in reasons), reasons


def test_pglogical_run_streams_a_table_while_it_is_read_only_when_switched_on(monkeypatch):
    """``pglogical run`` hands the snapshot the loader's ``published`` (load each set once published) unless
    ``PGLOGICAL_SNAPSHOT_STREAM_LOAD`` is on: streaming holds the target table's lock for the whole read."""
    loader = OverlappedLoad(lambda: pytest.fail("no table was published"))
    monkeypatch.delenv(STREAM_SWITCH, raising=False)
    assert loader.listener() == loader.published
    monkeypatch.setenv(STREAM_SWITCH, "1")
    assert loader.listener() is loader
    loader.close()
