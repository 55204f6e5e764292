"""Benchmark: raw slot fetch vs decode-into-Arrow vs decode-and-stage vs pypgoutput (text), in one run.

Every decode step runs the way the drain runs it: cyclic GC paused (``decoding.gcpause``),
row tuples framed a row group at a time by the Arrow converter.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg2
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as `python benchmarks/decode.py`

from airflow_provider_pglogical.decoding import ChangeAssembler  # noqa: E402
from airflow_provider_pglogical.decoding.gcpause import paused_gc  # noqa: E402
from airflow_provider_pglogical.decoding.model import RowChange, Transaction  # noqa: E402
from scripts.harness.pgserver import start_server, stop_server  # noqa: E402

# Same shape as the hook's query: LSN turned into a bigint server-side, xid as bigint.
PEEK = ("SELECT (lsn - '0/0'::pg_lsn)::bigint, xid::text::bigint, data FROM pg_logical_slot_peek_binary_changes("
        "'bench', NULL, NULL, 'proto_version', '1', 'publication_names', 'p', 'binary', %s)")
Row = tuple[int, int, memoryview]


def generate(conn, changes: int, tx_changes: int) -> None:
    """~85% inserts, 10% updates, 5% deletes, in transactions of ``tx_changes`` changes."""
    cur = conn.cursor()
    cur.execute("CREATE TABLE bench (id int8 PRIMARY KEY, a int4, t text, f float8, ts timestamptz, "
                "n numeric(12,2), b bool)")
    cur.execute("CREATE PUBLICATION p FOR TABLE bench")
    cur.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
    next_id = 0
    done = 0
    while done < changes:
        size = min(tx_changes, changes - done)
        inserts, updates = size * 85 // 100, size * 10 // 100
        deletes = size - inserts - updates
        first = next_id
        cur.execute("BEGIN")
        cur.execute("INSERT INTO bench SELECT g, g %% 100000, 'row ' || g || ' ' || md5(g::text), g * 1.5, "
                    "'2024-01-01'::timestamptz + g * interval '1 second', (g %% 100000) / 7.0, g %% 2 = 0 "
                    "FROM generate_series(%s, %s) g", (first, first + inserts - 1))
        cur.execute("UPDATE bench SET a = a + 1, f = f * 2 WHERE id >= %s AND id < %s", (first, first + updates))
        cur.execute("DELETE FROM bench WHERE id >= %s AND id < %s",
                    (first + inserts - deletes, first + inserts))
        cur.execute("COMMIT")
        next_id += inserts
        done += size
    cur.close()


def fetch(conn, binary: bool, itersize: int, sink: Callable[[Iterator[Row]], int]) -> tuple[int, float]:
    """Stream the slot through a named cursor into ``sink``; return its count and the seconds taken."""
    conn.autocommit = False
    start = time.perf_counter()
    with conn.cursor(name="bench_fetch") as cur:
        cur.itersize = itersize
        cur.execute(PEEK, ("true" if binary else "false",))
        count = sink(cur)
    conn.commit()
    conn.autocommit = True
    return count, time.perf_counter() - start


def fetch_client(dsn: str, cursor: bool, itersize: int) -> tuple[int, float, float]:
    """The drain's own fetch (``PgLogicalClient``): binary COPY through the compiled reader, or the named cursor."""
    from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient

    client = PgLogicalClient.from_dsn(dsn)
    start, cpu = time.perf_counter(), time.process_time()
    count = count_rows(client._changes("pg_logical_slot_peek_binary_changes", "bench", "p", upto_lsn=None,
                                       upto_nchanges=None, streaming=False, itersize=itersize, cursor=cursor))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    client.close()
    return count, seconds, cpu


def fetch_psycopg3(dsn: str) -> tuple[int, float, float]:
    """The public-API candidate: psycopg 3's ``Cursor.copy()`` of the same binary COPY, rows typed by psycopg."""
    import psycopg

    start, cpu = time.perf_counter(), time.process_time()
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        with cur.copy("COPY (" + PEEK.replace("%s", "'true'") + ") TO STDOUT (FORMAT binary)") as copy:
            copy.set_types(["int8", "int8", "bytea"])
            count = sum(1 for _ in copy.rows())
    return count, time.perf_counter() - start, time.process_time() - cpu


def count_rows(rows: Iterator[Row]) -> int:
    return sum(1 for _ in rows)


def assemble(rows) -> int:
    """Parse + assemble every row (tuples left unsplit); the count is the number of row changes emitted."""
    changes = 0
    with ChangeAssembler() as asm, paused_gc():
        for event in asm.feed_rows(rows):
            if isinstance(event, Transaction):
                changes += len(event.changes)
    return changes


def assemble_split(rows) -> int:
    """Parse + assemble + split every tuple into values one row at a time (``.kinds``/``.values``)."""
    values = 0
    with ChangeAssembler() as asm, paused_gc():
        for event in asm.feed_rows(rows):
            if isinstance(event, Transaction):
                for change in event.changes:
                    if isinstance(change, RowChange):
                        values += len(change.new.values if change.new is not None else change.old.values)
    return values


def stage(rows) -> int:
    """What the drain does: decode and write a staged batch (Parquet, zstd) into a temp directory."""
    import shutil
    import tempfile

    from airflow_provider_pglogical.decoding.values import RowImageConverter
    from airflow_provider_pglogical.staging.layout import StagingLayout
    from airflow_provider_pglogical.staging.writer import BatchWriter

    class Resolver:
        def converter(self, relation):
            return RowImageConverter(relation)

        def type_names(self, relation):
            return [None] * len(relation.columns)

    root = tempfile.mkdtemp(prefix="bench-stage-")
    try:
        with ChangeAssembler() as asm, paused_gc():
            writer = BatchWriter(StagingLayout.from_uri(root, "bench"), start_lsn=0, slot="bench", publication="p",
                                 resolver=Resolver())
            for event in asm.feed_rows(rows):
                if isinstance(event, Transaction):
                    writer.write_transaction(event)
            writer.finish_files()
        return writer.changes
    finally:
        shutil.rmtree(root, ignore_errors=True)


def assemble_to_arrow(rows, batch: int = 65536) -> int:
    """Parse + assemble, then convert new/old images to Arrow per relation version, ``batch`` at a time."""
    from airflow_provider_pglogical.decoding.values import RowImageConverter

    converters: dict[tuple[int, int], RowImageConverter] = {}
    pending: dict[tuple[int, int], list] = {}
    converted = 0

    def flush(key: tuple[int, int]) -> int:
        images = pending.pop(key)
        converter = converters[key]
        converter.to_arrow([c.new for c in images])
        converter.to_arrow([c.old for c in images])
        return len(images)

    with ChangeAssembler() as asm, paused_gc():
        for event in asm.feed_rows(rows):
            if not isinstance(event, Transaction):
                continue
            for change in event.changes:
                if not isinstance(change, RowChange):
                    continue
                key = (change.relation.relid, change.relation.version)
                if key not in converters:
                    converters[key] = RowImageConverter(change.relation)
                bucket = pending.setdefault(key, [])
                bucket.append(change)
                if len(bucket) >= batch:
                    converted += flush(key)
        for key in list(pending):
            converted += flush(key)
    return converted


def pypgoutput_decode(rows) -> int:
    """pypgoutput 0.0.3 message classes on text-mode output (it has no binary or streaming support)."""
    from pypgoutput import decoders as d

    classes = {b"B": d.Begin, b"C": d.Commit, b"R": d.Relation, b"I": d.Insert, b"U": d.Update,
               b"D": d.Delete, b"T": d.Truncate}
    n = 0
    for _, _, data in rows:
        data = bytes(data)
        classes[data[:1]](data)
        n += 1
    return n


def timed(label: str, fn: Callable[[], int], rows: int, baseline: float | None) -> float:
    start = time.perf_counter()
    count = fn()
    seconds = time.perf_counter() - start
    rate = rows / seconds
    ratio = f"  ({rate / baseline:.2f}x raw fetch)" if baseline else ""
    print(f"{label:<46} {rows:>9} rows in {seconds:7.2f}s = {rate:>10,.0f} rows/s{ratio}   [{count}]")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--changes", type=int, default=1_000_000, help="row changes to generate")
    parser.add_argument("--tx-changes", type=int, default=50_000, help="changes per transaction")
    parser.add_argument("--itersize", type=int, default=10_000, help="named-cursor fetch size")
    parser.add_argument("--pg-bin", default=None, help="PostgreSQL bin directory (default: scripts.harness.pgserver's)")
    args = parser.parse_args()

    # PostgreSQL's default decoding memory (the test default of 64kB would make the server spill).
    pa.array([0])  # pyarrow imports pandas on first use (~0.25 s, once per process): not decode time
    server = start_server(args.pg_bin, settings={"logical_decoding_work_mem": "64MB"})
    try:
        conn = psycopg2.connect(server.dsn())
        conn.autocommit = True
        t0 = time.perf_counter()
        generate(conn, args.changes, args.tx_changes)
        print(f"PostgreSQL {server.version_num}: generated {args.changes:,} changes in "
              f"{time.perf_counter() - t0:.1f}s (transactions of {args.tx_changes:,})")

        raw_count, raw_seconds = fetch(conn, True, args.itersize, count_rows)
        raw_rate = raw_count / raw_seconds
        print(f"{'raw fetch (named cursor, binary, no decoding)':<46} {raw_count:>9} rows in {raw_seconds:7.2f}s"
              f" = {raw_rate:>10,.0f} rows/s")
        # Wall time includes the server's decoding (shared by all); the client's CPU seconds tell the readers apart.
        fetches: list[tuple[str, Callable[[], tuple[int, float, float]]]] = [
            ("raw fetch (drain: named cursor)", lambda: fetch_client(server.dsn(), True, args.itersize)),
            ("raw fetch (drain: binary COPY, compiled)", lambda: fetch_client(server.dsn(), False, args.itersize))]
        try:
            import psycopg  # noqa: F401
        except ImportError:
            print("psycopg 3 Cursor.copy(): skipped, not installed")
        else:
            fetches.append(("raw fetch (psycopg 3 Cursor.copy, binary)", lambda: fetch_psycopg3(server.dsn())))
        for label, fetch_fn in fetches:
            count, seconds, cpu = fetch_fn()
            print(f"{label:<46} {count:>9} rows in {seconds:7.2f}s = {count / seconds:>10,.0f} rows/s  "
                  f"({count / seconds / raw_rate:.2f}x raw fetch), client CPU {cpu:5.2f}s = "
                  f"{cpu / count * 1e9:,.0f} ns/row")
        for label, sink in (("fetch + decode into Arrow (end to end)", assemble_to_arrow),
                            ("fetch + decode + stage Parquet (the drain)", stage)):
            _, e2e_seconds = fetch(conn, True, args.itersize, sink)
            print(f"{label:<46} {raw_count:>9} rows in {e2e_seconds:7.2f}s = "
                  f"{raw_count / e2e_seconds:>10,.0f} rows/s  ({raw_seconds / e2e_seconds:.2f}x raw fetch)")

        rows: list[Row] = []
        fetch(conn, True, args.itersize, lambda cur: rows.extend(cur) or len(rows))
        # The in-memory row list is a benchmark artefact; keep the cyclic GC from rescanning it.
        gc.collect()
        gc.freeze()
        timed("parse + assemble, tuples unsplit (in memory)", lambda: assemble(rows), len(rows), raw_rate)
        timed("parse + assemble + split row by row (old path)", lambda: assemble_split(rows), len(rows), raw_rate)
        timed("decode into Arrow: parse+assemble+Arrow", lambda: assemble_to_arrow(rows), len(rows), raw_rate)
        timed("decode + stage Parquet (in memory rows)", lambda: stage(rows), len(rows), raw_rate)
        rows.clear()  # free the binary rows before fetching the text-mode ones

        gc.unfreeze()
        text_rows: list[Row] = []
        fetch(conn, False, args.itersize, lambda cur: text_rows.extend(cur) or len(text_rows))
        gc.collect()
        gc.freeze()
        timed("text mode: parse + assemble (ours)", lambda: assemble(text_rows), len(text_rows), raw_rate)
        try:
            import pypgoutput  # noqa: F401
        except ImportError:
            print("pypgoutput: skipped, not installed")
        else:
            timed("text mode: pypgoutput 0.0.3 parse only", lambda: pypgoutput_decode(text_rows), len(text_rows),
                  raw_rate)
        conn.close()
    finally:
        stop_server(server)


if __name__ == "__main__":
    main()
