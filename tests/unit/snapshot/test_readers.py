"""The snapshot's reader processes start before its slot is created (their imports overlap the slot's creation),
one per chunk at most, and none when one reader or one chunk reads in the calling process."""

from __future__ import annotations

from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, WorkerPool, _readers
from airflow_provider_pglogical.snapshot.source import TableRead


def job(parallelism: int) -> SnapshotJob:
    return SnapshotJob(dsn="", slot="s", publication="p", staging_uri="/nowhere", tables={},
                       settings=SnapshotSettings(parallelism=parallelism, chunk_bytes=8192 * 300))


def read(pages: int) -> TableRead:
    return TableRead("public.t", 1, "public", "t", "d", (), None, heap_bytes=8192 * pages, block_size=8192)


def test_one_reader_or_one_chunk_reads_in_process():
    with _readers(job(1), {"public.t": read(1000)}) as pool:
        assert pool is None
    with _readers(job(4), {"public.t": read(10)}) as pool:
        assert pool is None


def test_readers_start_ready_one_per_chunk_at_most():
    with _readers(job(8), {"public.t": read(400)}) as pool:
        assert isinstance(pool, WorkerPool)
        assert len(pool.procs) == 2  # public.t's 2 chunks
        assert all(p.poll() is None for p in pool.procs)  # alive, waiting for their first task
    assert all(p.poll() is not None for p in pool.procs)
