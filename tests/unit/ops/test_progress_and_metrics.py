"""Progress lines for long steps and the one-line batch summaries."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.metrics.batches import ApplyBatchMetrics, DecodeBatchMetrics, apply_line, decode_line
from airflow_provider_pglogical.progress import Progress, human_bytes, human_seconds, metered_rows


def test_a_progress_line_gives_rows_bytes_rates_and_an_eta_when_the_total_is_known():
    p = Progress("decode slot s", print, total_bytes=4 << 20)
    p._started = 100.0
    p.update(rows=5000, done_bytes=1 << 20)
    line = p.line(now=110.0)
    assert line.startswith("decode slot s: 5000 rows, 1.0 MiB of 4.0 MiB (25.0%), 500 rows/s, 102.4 KiB/s")
    assert "ETA 30s" in line and "elapsed 10s" in line


def test_without_a_total_the_eta_is_unknown():
    p = Progress("apply", print)
    p._started = 0.0
    assert "ETA unknown" in p.line(now=5.0)


def test_the_heartbeat_logs_while_the_work_loop_is_silent():
    lines: list[str] = []
    with Progress("decode slot s", lines.append, interval=0.05, detail=lambda: "3 changes staged") as p:
        p.update(rows=1)
        time.sleep(0.4)  # e.g. the server materialising a peek: no row arrives
    assert len(lines) >= 3 and all(line.endswith("3 changes staged") for line in lines)
    count = len(lines)
    time.sleep(0.15)
    assert len(lines) == count, "the heartbeat stops with the step"


def test_metered_rows_pass_every_row_through_and_report_wal_bytes_read():
    p = Progress("x", print)
    rows = [(1000 + i, 1, b"d") for i in range(10_000)]
    assert list(metered_rows(iter(rows), p, start_lsn=1000, chunk=4096)) == rows
    assert (p.rows, p.done_bytes) == (10_000, 9_999)


def test_metered_blocks_hand_on_a_block_readers_lists_as_they_are():
    """Rows that come in lists (``RowBlocks``) reach the decoder in those lists, progress counted per list."""
    from airflow_provider_pglogical.progress import metered_blocks

    lists = [[(1000 + 3 * k + i, 1, b"d") for i in range(3)] for k in range(4)] + [[]]

    class Blocks:
        def blocks(self):
            return iter(lists)

        def __iter__(self):
            raise AssertionError("rows of a block reader are not iterated one by one")

    p = Progress("x", print)
    got = list(metered_blocks(Blocks(), p, start_lsn=1000))
    assert got == lists[:4] and all(a is b for a, b in zip(got, lists, strict=False))
    assert (p.rows, p.done_bytes) == (12, 11)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(), max_size=50), st.integers(1, 12))
def test_chunked_cuts_items_into_full_lists_and_a_shorter_last_one(items, size):
    """``chunked`` cuts rows into lists for the decoder, the progress meter and the cursor fetch: nothing lost or
    reordered, every list ``size`` long but the last, none empty."""
    from airflow_provider_pglogical.progress import chunked

    lists = list(chunked(iter(items), size))
    assert [x for block in lists for x in block] == items
    assert all(len(b) == size for b in lists[:-1]) and all(0 < len(b) <= size for b in lists)


def test_chunked_refuses_a_size_that_would_drop_every_row():
    from airflow_provider_pglogical.progress import chunked, metered_blocks

    with pytest.raises(ValueError, match="size 0"):
        list(chunked([1, 2], 0))
    with pytest.raises(ValueError, match="size 0"):
        list(metered_blocks([(1, 1, b"d")], Progress("x", print), start_lsn=0, chunk=0))


def test_human_units():
    assert (human_bytes(512), human_bytes(3 * 1024**3)) == ("512 B", "3.0 GiB")
    assert (human_seconds(59), human_seconds(61), human_seconds(7322)) == ("59s", "1m01s", "2h02m")


def test_batch_lines_read_as_one_key_value_line():
    decode = DecodeBatchMetrics(slot="s", start_lsn="0/10", end_lsn="0/20", changes=42, transactions=3,
                                staged_bytes=1000, duration_s=1.5, lag_bytes=0, lag_seconds=0.25)
    assert decode_line(decode) == ("pglogical decode slot=s batch=0/10..0/20 changes=42 transactions=3 "
                                   "staged_bytes=1000 duration=1.50s slot_lag_bytes=0 slot_lag_seconds=0.2s")
    apply = ApplyBatchMetrics(slot="s", start_lsn="0/10", end_lsn="0/20", applied=True,
                              rows={"public.t": {"inserted": 5, "deleted": 1, "rejected": 2}},
                              seconds={"stage": 1.0, "apply": 0.5})
    assert apply_line(apply) == ("pglogical apply slot=s batch=0/10..0/20 applied=true ordered=false duration=1.50s "
                                 "(stage 1.00s, apply 0.50s) rows public.t=-1/+5/!2")
    assert apply.table_rows("public.t") == 6
