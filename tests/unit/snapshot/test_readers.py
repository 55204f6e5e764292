"""The snapshot's reader processes start before its slot is created (their imports overlap the slot's creation),
one per chunk at most, and none when one reader or one chunk reads in the calling process; a reader that cannot
start, warm up or answer fails the snapshot with a typed error and leaves no process behind."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from airflow_provider_pglogical.exceptions import SnapshotError
from airflow_provider_pglogical.snapshot.copier import ChunkTask
from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, WorkerPool, _readers, plan_tables
from airflow_provider_pglogical.snapshot.source import TableRead


def job(parallelism: int) -> SnapshotJob:
    return SnapshotJob(dsn="", slot="s", publication="p", staging_uri="/nowhere", tables={},
                       settings=SnapshotSettings(parallelism=parallelism, chunk_bytes=8192 * 300))


def read(pages: int) -> TableRead:
    return TableRead("public.t", 1, "public", "t", "d", (), None, heap_bytes=8192 * pages, block_size=8192)


def plans(reads: dict[str, TableRead]) -> dict:
    return plan_tables(reads, 8192 * 300)


def test_one_reader_or_one_chunk_reads_in_process():
    with _readers(job(1), plans({"public.t": read(1000)})) as pool:
        assert pool is None
    with _readers(job(4), plans({"public.t": read(10)})) as pool:
        assert pool is None


def test_readers_start_ready_one_per_chunk_at_most():
    with _readers(job(8), plans({"public.t": read(400)})) as pool:
        assert isinstance(pool, WorkerPool)
        assert len(pool.procs) == 2  # public.t's 2 chunks
        assert all(p.poll() is None for p in pool.procs)  # alive, waiting for their first task
    assert all(p.poll() is not None for p in pool.procs)


def task(index: int = 0) -> ChunkTask:
    return ChunkTask(dsn="", snapshot_name="", lsn=0x1000, table="public.t", relation={}, copy_sql="",
                     staging_uri="", path="/nowhere/c.parquet", index=index, commit_time_us=1)


def collect(pool: WorkerPool, tasks: list[ChunkTask]) -> list:
    """``pool.run``'s results; a run with no answer for a minute fails the test instead of hanging it."""
    deadline = time.monotonic() + 60

    def alive() -> None:
        assert time.monotonic() < deadline, "no answer from the reader processes within 60 s"

    return list(pool.run(tasks, alive=alive, poll_s=0.5))


def test_a_reader_whose_warm_up_fails_answers_its_first_task_with_a_typed_error():
    """What the warm-up prints goes to stderr, never to the answer pipe, and its failure is the first task's answer
    (not a reader that exited while reading chunk 0)."""
    code = ("import sys\n"
            "import airflow_provider_pglogical.snapshot.copier as copier\n"
            "def failing_warm():\n"
            "    print('chatty import')\n"
            "    raise ImportError('no module named psycopg2')\n"
            "copier.warm = failing_warm\n"
            "from airflow_provider_pglogical.snapshot import worker\n"
            "sys.exit(worker.main())\n")
    with WorkerPool(1, command=(sys.executable, "-c", code)) as pool, pytest.raises(SnapshotError) as caught:
        collect(pool, [task()])
    assert type(caught.value) is SnapshotError
    assert "could not import what it reads with (ImportError: no module named psycopg2)" in str(caught.value)


def test_a_line_that_is_not_an_answer_fails_the_snapshot_instead_of_hanging_it():
    """A reader that writes something else on its answer pipe: a ``SnapshotError`` naming the chunk, the reader
    killed, and ``run`` returns (the feed thread does not die with the error unreported)."""
    code = "import sys\nsys.stdin.readline()\nprint('garbage, not JSON', flush=True)\nsys.stdin.readline()\n"
    with WorkerPool(1, command=(sys.executable, "-c", code)) as pool:
        with pytest.raises(SnapshotError, match=r"wrote 18 bytes that are not an answer while reading public\.t "
                                                r"chunk 0; nothing of that chunk was published"):
            collect(pool, [task(0), task(1)])
        assert pool.procs[0].wait(timeout=30) != 0  # killed: it was waiting for its next task


def test_a_failed_start_leaves_no_reader_process_behind(monkeypatch):
    """The third reader's start fails: the two started are killed and reaped, and the start's error is raised."""
    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def popen(*args, **kwargs):
        if len(started) == 2:
            raise OSError(24, "Too many open files")
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(OSError, match="Too many open files"):
        WorkerPool(3, command=(sys.executable, "-c", "import sys; sys.stdin.read()"))
    assert len(started) == 2
    assert all(p.returncode is not None for p in started)  # reaped, not only signalled
