"""Benchmark: the run history at its bound — append, read and render ``--records`` records (default 5,000, the
store's ``MAX_RECORDS``), side by side with one run's own work of recording (one append with pruning).

Local staging by default; ``--staging s3://bucket/prefix`` measures an object store (credentials from the
environment). Prints one JSON object: seconds per step, the page's size, and the ratio of reading + rendering
the whole history to one record's append.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta

from airflow_provider_pglogical.history.record import RunRecord, SlotFigures, record_name
from airflow_provider_pglogical.history.render import render_html, report_data
from airflow_provider_pglogical.history.store import MAX_RECORDS, RunHistory
from airflow_provider_pglogical.staging.manifest import write_text_atomic


def records(n: int) -> list[RunRecord]:
    start = datetime.now(UTC) - timedelta(minutes=15 * n)
    out = []
    for i in range(n):
        at = start + timedelta(minutes=15 * i)
        out.append(RunRecord(run_id=f"{i:032x}", kind="decode" if i % 2 == 0 else "apply", slot="bench",
                             started_at=at - timedelta(seconds=30), finished_at=at, outcome="ok", tool="airflow",
                             slot_figures=SlotFigures(lag_bytes=i * 1000, retained_bytes=i * 2000,
                                                      safe_wal_size=10**9 - i, wal_status="reserved"),
                             changes=1000 + i, staged_bytes=50_000, batches_staged=1, batches_applied=i % 2,
                             decode_s=2.5 if i % 2 == 0 else None, apply_s=None if i % 2 == 0 else 8.0,
                             tables={"public.orders": 700, "public.customers": 300 + i}, start_lsn="0/10",
                             end_lsn="0/20"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=MAX_RECORDS)
    parser.add_argument("--staging", help="staging root (default: a temp dir)")
    args = parser.parse_args()
    root = args.staging or tempfile.mkdtemp(prefix="pglogical-history-bench-")
    store = RunHistory.from_uri(root, "bench")
    batch = records(args.records)
    t0 = time.perf_counter()
    for r in batch[:-1]:
        store.layout.fs.create_dir(store.directory, recursive=True)
        write_text_atomic(store.layout, f"{store.directory}/{record_name(r)}", r.to_json())
    fill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.append(batch[-1])  # what one run pays: its record, then the prune's listing
    append_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    read = store.records()
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    page = render_html(report_data("bench", read), read)
    render_s = time.perf_counter() - t0
    print(json.dumps({"records": len(read), "fill_s": round(fill_s, 3), "append_one_s": round(append_s, 4),
                      "read_all_s": round(read_s, 3), "render_s": round(render_s, 3), "page_bytes": len(page),
                      "report_over_append": round((read_s + render_s) / append_s, 1)}))


if __name__ == "__main__":
    main()
