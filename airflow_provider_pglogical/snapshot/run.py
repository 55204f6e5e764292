"""Take snapshots: the initial one with the slot, and per-table ones (added tables, resyncs) later.

Exactly once, by the order of durable steps (like the drain):

1. ``requested``: a request file per table is written before anything is read; while it exists
   the apply holds that table's changes (``snapshot.layout``).
2. ``slot_created``: the initial snapshot creates the pipeline's slot on a replication
   connection with an exported snapshot (its consistent point is the tables' sync LSN); a table
   added or resynced later gets a *temporary* slot with an exported snapshot instead (below).
3. ``chunk_written``: each chunk file appears whole (written under a temp name, renamed).
4. ``files_moved`` then ``manifest_written``: the table's directory gets its final name, then
   its manifest, last and atomically — only now does the snapshot exist for readers.
5. ``done``: the request is removed — the apply loads the snapshot from now on; ``on_published`` hears of it
   then, so a process that applies too may load the set while the other tables are still read.

An ``on_published`` that is a ``ChunkListener`` also hears of each chunk of a table read alone (not linked to
others, not routed) as soon as its file is whole, and is asked (``publishing``) before that table's files move,
so that a loader may stream the table's chunks into its target while the rest is read; the loader commits only
once the table is published (``apply/targets/postgres/streamed.py``).

Tables linked by the source's foreign keys (either way, transitively) are one unit: each is
published once all of them are copied, and their requests are removed only after the last
manifest, so a target always gets them at one LSN and loads them in one transaction (a
referenced table can only be emptied with the tables referencing it, and a child's rows need
their parents').

A crash before 4 leaves an unpublished directory and the request; the next run deletes the
leftover and copies the table again. A crash between the manifests of linked tables leaves all
their requests; the next run copies the whole set again. The exported snapshot died with the crashed process, so the
copy happens at a later LSN through a temporary slot — tables already published keep theirs:
the per-table sync LSN makes every table consistent with the one slot. A crash between the
manifests and the request removals is repaired by removing the requests.

Why a temporary slot for later snapshots, and not ``pg_export_snapshot()`` plus
``pg_current_wal_lsn()``: a transaction becomes visible to snapshots when it leaves the proc
array, which is *after* its commit record is in the WAL, and the two calls are not atomic — a
transaction whose commit record lies before the LSN read could still be invisible to the
snapshot (lost), or one committed after it visible (applied twice). A logical slot's exported
snapshot is built by the snapshot builder from the WAL itself: it holds exactly the
transactions whose commit record starts before the slot's consistent point, the same rule by
which the main slot decodes (every slot decoding a commit record at or after that point emits
it). So the table's changes in the main slot's stream with ``commit_lsn >= sync LSN`` are exactly
the ones the snapshot lacks: PostgreSQL's own per-table rule (tablesync.c copies in its slot's
snapshot; worker.c ``should_apply_changes_for_rel`` applies a table's changes only from its sync
LSN on).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from airflow_provider_pglogical import exceptions
from airflow_provider_pglogical.exceptions import SnapshotError, format_lsn
from airflow_provider_pglogical.lsn import lsn_hex
from airflow_provider_pglogical.snapshot.copier import ChunkResult, ChunkTask, copy_chunk
from airflow_provider_pglogical.snapshot.layout import SnapshotLayout, SnapshotManifest
from airflow_provider_pglogical.snapshot.links import linked_components
from airflow_provider_pglogical.snapshot.source import (
    ExportedSnapshot,
    TableRead,
    describe_tables,
    foreign_key_links,
)
from airflow_provider_pglogical.staging.credentials import process_environment
from airflow_provider_pglogical.staging.layout import make_dirs
from airflow_provider_pglogical.staging.manifest import FileRecord

log = logging.getLogger(__name__)

CHECKPOINTS = ("requested", "slot_created", "chunk_written", "files_moved", "manifest_written", "done")
DEFAULT_CHUNK_BYTES = 256 << 20
DEFAULT_PARALLELISM = 1
POSTGRES_EPOCH_OFFSET_US = 946_684_800_000_000

Checkpoint = Callable[[str], None]
# Called with the tables of a linked set once their manifests are written and requests removed: from then on the
# apply may load them, while the snapshot still reads the other tables (``pipeline/snapshots.py``).
Published = Callable[[list[str]], None]


@dataclass(frozen=True)
class WrittenChunk:
    """A chunk file of a table read alone, whole under its unpublished directory (``path``, in the staging
    area's filesystem); ``chunks``: how many the table has; ``relation``/``row_filter``: as its manifest will say."""

    table: str
    lsn: int
    index: int
    chunks: int
    path: str
    sha256: str
    rows: int
    relation: dict[str, Any]
    row_filter: str | None


@runtime_checkable
class ChunkListener(Protocol):
    """An ``on_published`` that also follows the chunks of tables read alone (``WrittenChunk``)."""

    def __call__(self, tables: list[str]) -> None: ...

    def chunk_written(self, chunk: WrittenChunk) -> None:
        """Never raises, never waits long: the reading goes on."""

    def publishing(self, table: str, lsn: int) -> None:
        """Called before the files of the table's snapshot at ``lsn`` move to their published directory (the
        next call with ``table`` is of that publication): returns once nothing reads them where they were
        written."""


def _noop(_name: str) -> None:
    pass


@dataclass(frozen=True)
class SnapshotSettings:
    """``snapshot:`` of the spec: take the initial snapshot; readers in parallel; chunk size (heap bytes)."""

    initial: bool = False
    parallelism: int = DEFAULT_PARALLELISM
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    progress_every_s: float = 10.0


@dataclass(frozen=True)
class SnapshotJob:
    """Everything a snapshot run needs (no Airflow objects: the CLI, tasks and tests share it)."""

    dsn: str
    slot: str
    publication: str
    staging_uri: str
    tables: dict[str, tuple[tuple[str, ...] | None, str | None]]  # schema.table → (columns, row filter)
    settings: SnapshotSettings = field(default_factory=SnapshotSettings)
    # Several publications decoded together (spec ``publication: [a, b]``): tables are read with their
    # union (``source.describe_tables``). Empty: just ``publication``.
    publications: tuple[str, ...] = ()
    # Entries with ``leaves: route_to_root``: a partitioned one published without publish_via_partition_root
    # is snapshotted as all its leaves' rows (``source.describe_tables``), staged as one snapshot of it.
    routing: tuple[str, ...] = ()

    @property
    def all_publications(self) -> tuple[str, ...]:
        return self.publications or (self.publication,)


@dataclass
class SnapshotResult:
    lsn: int | None = None
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0

    def to_summary(self) -> dict[str, Any]:
        return {"lsn": format_lsn(self.lsn) if self.lsn is not None else None, "tables": self.tables,
                "seconds": round(self.seconds, 3)}


def _connect(dsn: str) -> Any:
    import psycopg2

    conn = psycopg2.connect(dsn, application_name="airflow-provider-pglogical-snapshot")
    conn.autocommit = True
    return conn


def slot_exists(dsn: str, slot: str) -> bool:
    conn = _connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            return cur.fetchone() is not None
    finally:
        conn.close()


def initial_snapshot(job: SnapshotJob, *, on_checkpoint: Checkpoint | None = None,
                     logger: logging.Logger | None = None, on_published: Published | None = None) -> SnapshotResult:
    """Create the pipeline's slot with an exported snapshot and stage every table at its consistent point.

    The slot must not exist (``SnapshotOnExistingSlotError`` otherwise: its exported snapshot is
    gone; resync tables one by one instead). Tables are checked (exist, SELECT privilege, published)
    before the slot is created, so a bad table creates nothing.
    """
    from airflow_provider_pglogical.exceptions import SnapshotOnExistingSlotError

    checkpoint, logger = on_checkpoint or _noop, logger or log
    started = time.monotonic()
    layout = SnapshotLayout.from_uri(job.staging_uri, job.slot)
    if slot_exists(job.dsn, job.slot):
        raise SnapshotOnExistingSlotError(
            f"an initial snapshot needs to create slot {job.slot!r}, which already exists: the snapshot "
            "consistent with it is gone. Resync tables one by one (pglogical resync --spec FILE --table "
            "schema.table), or drop the slot and staging to start over")
    conn = _connect(job.dsn)
    try:
        reads = describe_tables(conn, job.all_publications, job.tables, job.routing)
    finally:
        conn.close()
    for table in job.tables:
        layout.request(table, "initial")
    checkpoint("requested")
    plans = plan_tables(reads, job.settings.chunk_bytes)
    with _readers(job, plans) as pool, ExportedSnapshot(job.dsn, job.slot) as exported:
        logger.info("slot %s created at consistent point %s with exported snapshot %s", job.slot,
                    format_lsn(exported.lsn), exported.name)
        checkpoint("slot_created")
        result = _copy_tables(job, layout, reads, plans, exported, checkpoint, logger, pool, on_published)
    result.seconds = time.monotonic() - started
    return result


def sync_pending(job: SnapshotJob, *, on_checkpoint: Checkpoint | None = None,
                 logger: logging.Logger | None = None, on_published: Published | None = None) -> SnapshotResult:
    """Snapshot every requested table (added, resynced, or left over by a crashed snapshot) at a
    later LSN through a temporary slot with an exported snapshot; the main slot is not touched."""
    from airflow_provider_pglogical.snapshot.source import temporary_slot_name

    checkpoint, logger = on_checkpoint or _noop, logger or log
    started = time.monotonic()
    layout = SnapshotLayout.from_uri(job.staging_uri, job.slot)
    requests = layout.requests()
    result = SnapshotResult()
    if not requests:
        return result
    if not slot_exists(job.dsn, job.slot):
        raise SnapshotError(f"slot {job.slot!r} does not exist: a table snapshot is only consistent with an "
                            "existing slot (create it first: pglogical decode)")
    pending = {t: job.tables.get(t, (None, None)) for t in requests}
    conn = _connect(job.dsn)
    try:
        # A crash after the manifests of a set of linked tables and before their requests' removal: their
        # snapshots exist, only close. A set published in part (the crash came between two manifests) is copied
        # again whole, at one new LSN: its tables load together (``_copy_tables``).
        for linked in linked_components(sorted(requests), foreign_key_links(conn, requests)):
            if all((latest := layout.latest(t)) is not None
                   and layout.manifest(latest).request_id == requests[t]["request_id"] for t in linked):
                for table in linked:
                    layout.close_request(table)
                    pending.pop(table)
        if not pending:
            return result
        unknown = sorted(t for t in pending if t not in job.tables)
        if unknown:
            raise SnapshotError(f"snapshot requested for {', '.join(unknown)}, which the spec does not list")
        reads = describe_tables(conn, job.all_publications, pending, job.routing, named=job.tables)
    finally:
        conn.close()
    plans = plan_tables(reads, job.settings.chunk_bytes)
    with _readers(job, plans) as pool, ExportedSnapshot(
            job.dsn, temporary_slot_name(job.slot, ",".join(sorted(pending))), temporary=True) as exported:
        logger.info("tables %s: temporary slot %s, sync LSN %s", ", ".join(sorted(pending)), exported.slot,
                    format_lsn(exported.lsn))
        checkpoint("slot_created")
        result = _copy_tables(job, layout, reads, plans, exported, checkpoint, logger, pool, on_published)
    result.seconds = time.monotonic() - started
    return result


def request_resync(job: SnapshotJob, tables: list[str]) -> list[str]:
    """Ask for a fresh snapshot of ``tables`` (a damaged target table, or one to rebuild)."""
    layout = SnapshotLayout.from_uri(job.staging_uri, job.slot)
    missing = sorted(t for t in tables if t not in job.tables)
    if missing:
        raise SnapshotError(f"cannot resync {', '.join(missing)}: not in the spec's tables")
    for table in tables:
        layout.request(table, "resync")
    return tables


def request_added_tables(job: SnapshotJob) -> list[str]:
    """Tables of the spec that have never been snapshotted although the pipeline took one: added later."""
    layout = SnapshotLayout.from_uri(job.staging_uri, job.slot)
    known = set(layout.tables())
    if not known:  # the pipeline never took a snapshot: nothing is "added"
        return []
    added = [t for t in job.tables if t not in known]
    for table in added:
        layout.request(table, "added")
    return added


def plan_chunks(read: TableRead, chunk_bytes: int) -> list[tuple[int, int | None] | None]:
    """Page ranges of at most ``chunk_bytes`` of heap each; the last is open-ended. ``[None]``: one plain read."""
    pages_per_chunk = max(1, chunk_bytes // read.block_size)
    if read.pages <= pages_per_chunk:
        return [None]
    bounds = list(range(0, read.pages, pages_per_chunk))
    return [(lo, bounds[i + 1] if i + 1 < len(bounds) else None) for i, lo in enumerate(bounds)]


# per table: (part number, part read, page range) per chunk
ChunkPlan = dict[str, list[tuple[int, TableRead, tuple[int, int | None] | None]]]


def plan_tables(reads: dict[str, TableRead], chunk_bytes: int) -> ChunkPlan:
    """Per table, its chunks in file order: the part read (the table, or a routed table's leaf: its number and
    read) and its page range. Planned once: the reader count and the chunk tasks both come from it."""
    return {table: [(p, part, rng) for p, part in enumerate(read.leaves or (read,))
                    for rng in plan_chunks(part, chunk_bytes)] for table, read in reads.items()}


def _readers(job: SnapshotJob, plans: ChunkPlan) -> contextlib.AbstractContextManager[WorkerPool | None]:
    """The reader processes, started before the slot is created so that their interpreter start and imports
    (0.75 s each, more under load) overlap the slot's creation; none (the chunks are read in this process) for
    one reader or one chunk."""
    chunks = sum(map(len, plans.values()))
    if job.settings.parallelism <= 1 or chunks <= 1:
        return contextlib.nullcontext()
    return WorkerPool(min(job.settings.parallelism, chunks), process_environment(job.staging_uri))


def _copy_tables(job: SnapshotJob, layout: SnapshotLayout, reads: dict[str, TableRead], plans: ChunkPlan,
                 exported: ExportedSnapshot, checkpoint: Checkpoint, logger: logging.Logger,
                 pool: WorkerPool | None, on_published: Published | None = None) -> SnapshotResult:
    requests = layout.requests()
    result = SnapshotResult(lsn=exported.lsn)
    commit_time_us = int(time.time() * 1_000_000)
    tasks: dict[str, list[ChunkTask]] = {}
    render = _connect(job.dsn)  # psycopg2.sql needs a connection to quote identifiers and literals
    # Tables linked by foreign keys are published together, at this one LSN: a target loads them in one
    # transaction (a referenced table is emptied with its referencing ones, a child's rows need its parent's).
    linked = {t: group for group in linked_components(list(reads), foreign_key_links(render, reads)) for t in group}
    for table, read in reads.items():
        for leftover in layout.leftovers(table):
            logger.info("removing unpublished snapshot leftover %s", leftover)
            layout.staging.delete_dir(leftover)
        partial = layout.partial_dir(table, exported.lsn)
        make_dirs(layout.fs, f"{partial}/chunks")
        tasks[table] = []
        # A routed partitioned table: every leaf read on its own, in the same exported snapshot, its files
        # ``chunks/p<leaf>-c<chunk>`` (one part per leaf in the manifest); otherwise the table itself.
        for i, (p, part, rng) in enumerate(plans[table]):
            prefix = f"p{p:04d}-" if read.routed else ""
            tasks[table].append(ChunkTask(job.dsn, exported.name, exported.lsn, table, part.relation,
                                          part.select_sql(rng).as_string(render), job.staging_uri,
                                          f"{partial}/chunks/{prefix}c{i:05d}.parquet", i, commit_time_us,
                                          part=part.table if read.routed else ""))
        logger.info("%s: %d chunk(s)%s over %d heap bytes, sync LSN %s", table, len(tasks[table]),
                    f" of {len(read.leaves)} leaf partition(s)" if read.routed else "", read.heap_bytes,
                    format_lsn(exported.lsn))
    render.close()
    done: dict[str, list[ChunkResult]] = {t: [] for t in tasks}
    seconds: dict[str, float] = {}
    started = {t: time.monotonic() for t in tasks}

    listener = on_published if isinstance(on_published, ChunkListener) else None

    def finished(res: ChunkResult) -> None:
        done[res.table].append(res)
        table, read = res.table, reads[res.table]
        alone = len(linked[table]) == 1 and not read.routed
        if listener is not None and alone:
            listener.chunk_written(WrittenChunk(table, exported.lsn, res.index, len(tasks[table]),
                                                tasks[table][res.index].path, res.sha256, res.rows, read.relation,
                                                read.row_filter))
        checkpoint("chunk_written")
        rows = sum(r.rows for r in done[table])
        copied = sum(r.copied_bytes for r in done[table])
        elapsed = max(time.monotonic() - started[table], 1e-6)
        fraction = len(done[table]) / len(tasks[table])
        eta = elapsed * (1 - fraction) / fraction if fraction else None
        progress = {"table": table, "lsn": format_lsn(exported.lsn), "chunks_done": len(done[table]),
                    "chunks": len(tasks[table]), "rows": rows, "bytes": copied, "heap_bytes": read.heap_bytes,
                    "rows_per_s": round(rows / elapsed), "eta_s": round(eta, 1) if eta is not None else None}
        layout.write_progress(table, progress)
        logger.info("%s: chunk %d/%d, %d rows, %.1f MiB, %.0f rows/s, ETA %.0f s", table, len(done[table]),
                    len(tasks[table]), rows, copied / 2**20, rows / elapsed, eta or 0)
        if len(done[table]) == len(tasks[table]):
            seconds[table] = time.monotonic() - started[table]
            group = linked[table]
            if any(len(done[t]) < len(tasks[t]) for t in group):
                return  # published with the last of its linked tables
            exported.check_alive()  # the snapshot must have been valid until every chunk was read
            if listener is not None and alone:
                listener.publishing(table, exported.lsn)
            for t in group:
                result.tables[t] = _publish(job, layout, reads[t], exported, requests[t], done[t], tasks[t],
                                            seconds[t], checkpoint)
                logger.info("%s: snapshot published at %s (%d rows)", t, format_lsn(exported.lsn),
                            result.tables[t]["rows"])
            # Requests last, once every linked table's manifest is written: until then the apply holds all of
            # them, and a crash in between makes the next run copy the set again whole (``sync_pending``).
            for t in group:
                layout.close_request(t)
                checkpoint("done")
            if on_published is not None:
                on_published(list(group))

    all_tasks = [t for ts in tasks.values() for t in ts]
    if pool is None:
        for task in all_tasks:
            exported.check_alive()
            finished(copy_chunk(task))
    else:
        for res in pool.run(all_tasks, alive=exported.check_alive, poll_s=job.settings.progress_every_s):
            finished(res)
    exported.check_alive()
    return result


def _publish(job: SnapshotJob, layout: SnapshotLayout, read: TableRead, exported: ExportedSnapshot,
             request: dict[str, Any], results: list[ChunkResult], tasks: list[ChunkTask], seconds: float,
             checkpoint: Checkpoint) -> dict[str, Any]:
    """Move the table's files to their final directory and write its manifest (its request stays open)."""
    results = sorted(results, key=lambda r: r.index)
    partial = layout.partial_dir(read.table, exported.lsn)
    final = layout.snapshot_dir(read.table, exported.lsn)
    files = {t.index: t.path.rsplit("/chunks/", 1)[1] for t in tasks}
    part_of = {t.index: t.part for t in tasks}
    parts = []
    for leaf in read.leaves:  # a routed table: one part per leaf, its files in chunk order
        mine = [r for r in results if part_of[r.index] == leaf.table]
        parts.append({"table": leaf.table, "relation": leaf.relation, "row_filter": leaf.row_filter,
                      "rows": sum(r.rows for r in mine), "bytes": sum(r.bytes for r in mine),
                      "files": [f"chunks/{files[r.index]}" for r in mine]})
    if layout.staging.exists(final):
        layout.staging.delete_dir(final)
    chunk_files = [f"chunks/{files[r.index]}" for r in results]
    layout.staging.move_tree(partial, final, chunk_files)
    checkpoint("files_moved")
    manifest = SnapshotManifest(
        slot=job.slot, publication=",".join(job.all_publications), table=read.table, lsn_int=exported.lsn,
        reason=request["reason"], request_id=request["request_id"], relation=read.relation,
        row_filter=read.row_filter, rows=sum(r.rows for r in results), bytes=sum(r.bytes for r in results),
        chunks=len(results), files=chunk_files,
        # every row of a snapshot has commit_lsn = the sync LSN
        file_records={f"chunks/{files[r.index]}": FileRecord(r.bytes, r.rows, r.sha256, *(
            (exported.lsn, exported.lsn) if r.rows else (None, None))).to_dict() for r in results},
        server_version=0, seconds=round(seconds, 3), parts=parts)
    layout.publish(final, manifest)
    checkpoint("manifest_written")
    summary: dict[str, Any] = {"lsn": format_lsn(exported.lsn), "rows": manifest.rows, "bytes": manifest.bytes,
               "chunks": manifest.chunks, "reason": manifest.reason, "dir": lsn_hex(exported.lsn)}
    if parts:
        summary["leaves"] = {p["table"]: p["rows"] for p in parts}
    return summary


class WorkerPool:
    """``n`` reader processes (``snapshot.worker``) fed chunk tasks over pipes by one thread each; ``env``: their
    environment (the staging root's registered credentials included, ``staging/credentials.py``); ``command``:
    what each runs, ``COMMAND`` by default (tests start other programs in its place)."""

    COMMAND = (sys.executable, "-m", "airflow_provider_pglogical.snapshot.worker")

    def __init__(self, n: int, env: dict[str, str] | None = None, command: Sequence[str] | None = None) -> None:
        command = command or self.COMMAND
        self.procs: list[subprocess.Popen[str]] = []
        try:
            for _ in range(n):
                self.procs.append(subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                   text=True, env=env))
        except BaseException:
            self.close()  # the ones started: none outlives a failed start
            raise

    def run(self, tasks: list[ChunkTask], *, alive: Callable[[], None], poll_s: float) -> Iterator[ChunkResult]:
        todo: queue.Queue[ChunkTask] = queue.Queue()
        for task in tasks:
            todo.put(task)
        results: queue.Queue[ChunkResult | BaseException] = queue.Queue()
        stop = threading.Event()

        def feed(proc: subprocess.Popen[str]) -> None:
            if proc.stdin is None or proc.stdout is None:  # started with stdin/stdout=PIPE
                raise SnapshotError("a snapshot reader process has no pipes")
            while not stop.is_set():
                try:
                    task = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    proc.stdin.write(json.dumps(task.__dict__) + "\n")
                    proc.stdin.flush()
                    line = proc.stdout.readline()
                except OSError as exc:
                    results.put(SnapshotError(f"snapshot reader process died: {exc}"))
                    return
                if not line:
                    results.put(SnapshotError(f"snapshot reader process exited with {proc.wait()} while "
                                              f"reading {task.table} chunk {task.index}"))
                    return
                try:
                    answer = json.loads(line)
                    if "ok" in answer:
                        results.put(ChunkResult(**answer["ok"]))
                        continue
                    cls = getattr(exceptions, answer["error"], None)
                    message = str(answer["message"])
                except (ValueError, TypeError, KeyError):  # not JSON, or not an answer (something printed it)
                    proc.kill()
                    results.put(SnapshotError(f"snapshot reader process {proc.pid} wrote {len(line)} bytes that are "
                                              f"not an answer while reading {task.table} chunk {task.index}; "
                                              "nothing of that chunk was published"))
                    return
                err = cls if isinstance(cls, type) and issubclass(cls, SnapshotError) else SnapshotError
                results.put(err(message))
                return

        threads = [threading.Thread(target=feed, args=(p,), daemon=True) for p in self.procs]
        for t in threads:
            t.start()
        try:
            for _ in range(len(tasks)):
                while True:
                    try:
                        item = results.get(timeout=poll_s)
                        break
                    except queue.Empty:
                        alive()
                if isinstance(item, BaseException):
                    raise item
                alive()
                yield item
        finally:
            stop.set()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
