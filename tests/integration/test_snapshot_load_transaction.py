"""``snapshot.load_transaction``, the one load transaction of a snapshot's atomic group (the load after the snapshot
and the streamed load), against a real PostgreSQL: a read of the staged rows failing mid-COPY is one typed line
naming the snapshot and the table, with nothing committed; a load that waited for ``TRUNCATE``'s lock while another
load of the table committed a later snapshot leaves that one in place."""

from __future__ import annotations

import errno
import io
import shlex
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import psycopg2
import pyarrow as pa
import pytest

from airflow_provider_pglogical.apply.targets.postgres.copy import copy_error
from airflow_provider_pglogical.apply.targets.postgres.overlap import _why
from airflow_provider_pglogical.apply.targets.postgres.progress import (
    PROGRESS_TABLE,
    SYNC_TABLE,
    ensure_bookkeeping,
    ensure_sync_table,
    sync_marks,
)
from airflow_provider_pglogical.apply.targets.postgres.snapshot import FEED_LINE_CHARS, load_transaction, mark_synced
from airflow_provider_pglogical.cli import build_parser
from airflow_provider_pglogical.exceptions import ApplyError, PgLogicalError
from airflow_provider_pglogical.history.recorder import error_line
from scripts.harness.pgserver import execute, make_target, query

SLOT = "loadtx"
TABLE = SimpleNamespace(source="public.t", target="public.t", columns=("id", "v"))
L1, L2 = 0x1000, 0x2000


class JavaError(Exception):
    """Like py4j's ``Py4JJavaError``: its text is the whole Java stack, the first line a call's."""

    __module__ = "py4j.protocol"


RERUN = "rerun the apply to load it whole"
RESYNC = "stage the table again: pglogical resync --table public.t"
UNKNOWN = "rerun the apply; if it fails the same way: pglogical resync --table public.t"


def _target(pg_server: Any) -> tuple[str, Any]:
    _, dsn = make_target(pg_server)
    execute(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'kept')")
    conn = psycopg2.connect(dsn)
    ensure_bookkeeping(conn, PROGRESS_TABLE, "pglogical_rejects")
    ensure_sync_table(conn, SYNC_TABLE)
    conn.commit()
    conn.close()
    config = SimpleNamespace(session_replication_role="origin", progress_table=PROGRESS_TABLE)
    return dsn, SimpleNamespace(dsn=dsn, config=config, checkpoint=lambda _point: None)


def _marks(dsn: str) -> dict[str, int]:
    conn = psycopg2.connect(dsn)
    try:
        return sync_marks(conn, SLOT, SYNC_TABLE)
    finally:
        conn.close()


def test_a_read_failing_mid_copy_is_one_typed_line_and_commits_nothing(pg_server):
    dsn, target = _target(pg_server)
    stack = ("An error occurred while calling o85.toLocalIterator.\n: org.apache.spark.SparkException: "
             + "at org.apache.spark.Stage.run(Stage.scala:1) " * 40)
    long_first = "x" * 500 + "\nat org.apache.spark.Stage.run(Stage.scala:1)"
    cases: list[tuple[BaseException, str, str]] = [
        (OSError("s3://bucket/stage/c00001.parquet: connection reset"),
         "OSError: s3://bucket/stage/c00001.parquet: connection reset", RERUN),
        (JavaError(stack), "JavaError: An error occurred while calling o85.toLocalIterator.", RERUN),
        (JavaError(long_first), f"JavaError: {'x' * (FEED_LINE_CHARS - 1)}…", RERUN),
        # a value quoted by a parser or a conversion never reaches our line (nor the run's history)
        (pa.ArrowInvalid("Failed to parse string: 'alice@x' as a scalar of type int64"),
         "ArrowInvalid: Failed to parse string: … as a scalar of type int64", UNKNOWN),
        (ValueError("invalid literal for int() with base 10: 'alice@x'"),
         "ValueError: invalid literal for int() with base 10: …", UNKNOWN),
        (KeyError("alice@x"), "KeyError", UNKNOWN),
        (ValueError('row "alice@x" has too many fields'), "ValueError: row … has too many fields", UNKNOWN),
        # a pruned or unreadable staged file fails every rerun the same way: the way out that exists
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/stage/c00001.parquet"),
         "FileNotFoundError: /stage/c00001.parquet: No such file or directory", RESYNC),
        (PermissionError(errno.EACCES, "Permission denied", "/stage/c00001.parquet"),
         "PermissionError: /stage/c00001.parquet: Permission denied",
         "give the apply read access to the staging area, then rerun it"),
    ]
    for failure, shown, way_out in cases:
        def chunks(_table: Any, failure: BaseException = failure) -> Iterator[bytes]:
            yield b"2\tloaded\n"
            raise failure

        with pytest.raises(ApplyError) as raised:
            load_transaction(target, SLOT, L1, SYNC_TABLE, (TABLE,), chunks)
        message = str(raised.value)
        reason = f"snapshot at 0/1000 of public.t not applied: its staged rows could not be read ({shown}); " \
                 "nothing of it was committed"
        assert message == f"{reason}; {way_out}", message
        assert raised.value.__cause__ is failure
        assert len(message) < 200 + FEED_LINE_CHARS
        for line in (message, error_line(raised.value), _why(raised.value)):
            assert "alice@x" not in line, line
        # the overlapped and streamed loads log it without a way out: the table is loaded again after its
        # publication, or by the apply, whose own error names it
        assert _why(raised.value) == reason
        assert query(dsn, "SELECT id, v FROM t") == [(1, "kept")] and _marks(dsn) == {}
    capped = cases[2][1].removeprefix("JavaError: ")  # the 500-character first line: capped, marked as cut
    assert len(capped) == FEED_LINE_CHARS and capped.endswith("…")
    # the resync way out is a command that exists, with the option the message names
    resync = shlex.split(RESYNC.split(": ", 1)[1])
    assert build_parser().parse_args([*resync[1:], "--spec", "spec.yaml"]).table == ["public.t"]

    class Declined(Exception):
        """What a caller's ``chunks`` raises on purpose (the streamed load's ``NotStreamed``)."""

    def declined(_table: Any) -> Iterator[bytes]:
        yield b"2\tloaded\n"
        raise Declined("the snapshot ended before its chunk 1 was written")

    for passed in ((Declined,), ()):
        with pytest.raises(Declined if passed else ApplyError,
                           match="chunk 1 was written$" if passed else r"\(Declined: the snapshot ended"):
            load_transaction(target, SLOT, L1, SYNC_TABLE, (TABLE,), declined, passed=passed)

    def ours(_table: Any) -> Iterator[bytes]:
        yield b"2\tloaded\n"
        raise PgLogicalError("staged file changed under the load")

    with pytest.raises(PgLogicalError, match="^staged file changed under the load$"):
        load_transaction(target, SLOT, L1, SYNC_TABLE, (TABLE,), ours)
    def bad_row_then(failure: BaseException | None) -> Any:
        def chunks(_table: Any) -> Iterator[bytes]:
            yield b"x\tloaded\n"
            if failure is not None:
                raise failure
        return chunks

    # the server's own error stays the server's, one line without the row's value, even when the feed failed after
    # the server had ended the COPY (it says so only once the feed ends)
    for failure in (None, OSError("connection reset")):
        with pytest.raises(ApplyError, match=r"^snapshot at 0/1000 of public.t not applied: \[22P02\] invalid "
                                             r"input syntax for type integer: …$"):
            load_transaction(target, SLOT, L1, SYNC_TABLE, (TABLE,), bad_row_then(failure))
    # a range error quotes the value inside its message (``value "99999999999" is out of range …``)
    with pytest.raises(ApplyError) as raised:
        load_transaction(target, SLOT, L1, SYNC_TABLE, (TABLE,), lambda _t: iter([b"99999999999\tloaded\n"]))
    assert str(raised.value) == ("snapshot at 0/1000 of public.t not applied: [22003] value … is out of range for "
                                 "type integer"), str(raised.value)
    # the Spark path's COPY (``copy.copy_error``) says it the same way
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur, pytest.raises(psycopg2.Error) as server:
        cur.copy_expert("COPY t (id, v) FROM STDIN", io.BytesIO(b"99999999999\tloaded\n"))
    assert str(copy_error("t", server.value, 10)) == ("COPY into t failed (line 11 of this partition, column id): "
                                                     "[22003] value … is out of range for type integer")
    assert query(dsn, "SELECT id, v FROM t") == [(1, "kept")] and _marks(dsn) == {}
    # the way out the message names: the rerun loads the table whole
    rows, _ = load_transaction(target, SLOT, L1, SYNC_TABLE, (TABLE,), lambda _t: iter([b"2\tloaded\n"]))
    assert rows == {"public.t": {"snapshot_rows": 1}} and query(dsn, "SELECT id, v FROM t") == [(2, "loaded")]
    assert _marks(dsn) == {"public.t": L1}


def test_a_load_waiting_for_truncates_lock_leaves_a_later_snapshot_committed_meanwhile(pg_server):
    """A load of ``t`` at L1 reads the sync marks (none), then waits for ``TRUNCATE``'s lock held by a load of
    ``t`` at L2 (a streamed one) that commits: the L1 load rolls back, rows and marks stay L2's."""
    dsn, target = _target(pg_server)
    later = psycopg2.connect(dsn)
    try:
        with later.cursor() as cur:
            cur.execute("TRUNCATE t")
            cur.execute("INSERT INTO t VALUES (3, 'later')")
            mark_synced(cur, PROGRESS_TABLE, SYNC_TABLE, SLOT, "public.t", L2, 1)
        # the sync marks' rows are locked by the later load: the L1 load's first read of them does not wait
        result: list[Any] = []
        loading = threading.Thread(target=lambda: result.append(
            load_transaction(target, SLOT, L1, SYNC_TABLE, (TABLE,), lambda _t: iter([b"1\tearlier\n"]))))
        loading.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not query(
                dsn, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'TRUNCATE%'"):
            time.sleep(0.02)
        assert loading.is_alive(), result  # not vacuous: it waits for the lock
        later.commit()
    finally:
        later.close()
    loading.join(30)
    assert result == [({}, 0.0)]
    assert query(dsn, "SELECT id, v FROM t") == [(3, "later")] and _marks(dsn) == {"public.t": L2}
