"""Transactions over the memory budget spill to an anonymous temp file and replay identically."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_pglogical.decoding import ChangeAssembler, SpilledChanges, SpillFile
from tests.support import wire as w

REL = w.relation(1, "t", w.T_COLUMNS)
WIDE = w.relation(1, "t", w.T_COLUMNS + [("extra", w.INT4, -1, 0)])


def open_files_in(directory: Path) -> int:
    """Open descriptors of this process pointing into ``directory`` (deleted files included)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(str(directory))
    return count


def plain_rows(n: int) -> list[bytes]:
    rows = [w.begin(0x9000, 7), REL]
    for i in range(n):
        rows.append(w.insert(1, w.row(i, "v" * (i % 50))))
        if i == n // 2:
            rows += [WIDE, w.truncate([1], 1), w.message("p", b"mid", transactional=True)]
        if i % 7 == 0:
            rows.append(w.delete(1, w.tup(w.int4(i), ("n",)), "K"))
    rows.append(w.commit(0x9000, 0x9100))
    return rows


def streamed_rows(n: int) -> list[bytes]:
    rows = [w.stream_start(50, True), w.relation(1, "t", w.T_COLUMNS, xid=50)]
    for i in range(n):
        # 51 is aborted halfway, so the second half uses 54 instead; 52 is aborted at the end
        sub = (50, 51 if i <= n // 2 else 54, 52)[i % 3]
        rows.append(w.insert(1, w.row(i), xid=sub))
        if i == n // 2:
            rows += [w.stream_stop(), w.stream_abort(50, 51), w.stream_start(50, False),
                     w.relation(1, "t", w.T_COLUMNS + [("extra", w.INT4, -1, 0)], xid=53)]
    rows += [w.stream_stop(), w.stream_abort(50, 52), w.stream_commit(50, 0x9000, 0x9100)]
    return rows


def run(rows: list[bytes], **kwargs) -> tuple[ChangeAssembler, list]:
    asm = ChangeAssembler(**kwargs)
    return asm, [e for i, r in enumerate(rows) if (e := asm.feed(0x100 + i, 7, r)) is not None]


@pytest.mark.parametrize("rows", [plain_rows(2000), streamed_rows(2000)], ids=["plain", "streamed"])
def test_a_transaction_over_a_tiny_budget_round_trips_identically(rows, tmp_path):
    _, [expected] = run(rows)
    with ChangeAssembler(memory_budget=300, spill_dir=tmp_path) as asm:
        [tx] = [e for i, r in enumerate(rows) if (e := asm.feed(0x100 + i, 7, r)) is not None]
        assert isinstance(tx.changes, SpilledChanges) and tx.changes.spilled_records > 100
        assert len(tx.changes) == len(expected.changes)
        assert list(tx.changes) == list(expected.changes)
        assert list(tx.changes) == list(expected.changes)  # re-iterable
        # chunks(): the same changes, a slice at a time (what the staging writer consumes)
        chunks = list(tx.changes.chunks())
        assert len(chunks) > 1 and all(chunks) and [c for chunk in chunks for c in chunk] == list(expected.changes)
        assert tx.changes[-1] == expected.changes[-1] and tx.changes[5:8] == expected.changes[5:8]
        assert {c.relation.version for c in tx.changes if hasattr(c, "op")} == {1, 2}
        assert (tx.xid, tx.end_lsn, tx.streamed) == (expected.xid, expected.end_lsn, expected.streamed)
    assert tx.changes.closed


def test_spill_file_exists_only_while_needed_and_never_has_a_name(tmp_path):
    asm = ChangeAssembler(memory_budget=100, spill_dir=tmp_path)
    rows = plain_rows(300)
    for i, r in enumerate(rows[:-1]):
        asm.feed(i, 7, r)
    assert open_files_in(tmp_path) == 1 and os.listdir(tmp_path) == []
    tx = asm.feed(999, 7, rows[-1])
    assert open_files_in(tmp_path) == 1  # now owned by the lazy changes
    tx.changes.close()
    assert open_files_in(tmp_path) == 0
    with pytest.raises(ValueError, match="closed"):
        list(tx.changes)


def test_aborted_and_unfinished_streams_release_their_spill_files(tmp_path):
    asm = ChangeAssembler(memory_budget=100, spill_dir=tmp_path)
    rows = streamed_rows(300)
    for i, r in enumerate(rows[:-2]):
        asm.feed(i, 7, r)
    assert open_files_in(tmp_path) == 1
    asm.feed(1000, 7, w.stream_abort(50, 50))
    assert open_files_in(tmp_path) == 0
    for i, r in enumerate(rows[:-2]):
        asm.feed(i, 7, r)
    assert open_files_in(tmp_path) == 1
    assert asm.finish() == (50,)
    assert open_files_in(tmp_path) == 0


def test_closing_the_assembler_closes_emitted_spilled_changes(tmp_path):
    asm, [tx] = run(plain_rows(300), memory_budget=100, spill_dir=tmp_path)
    assert open_files_in(tmp_path) == 1
    asm.close()
    assert open_files_in(tmp_path) == 0 and tx.changes.closed


def test_budget_accounting_returns_to_zero_after_commit_and_abort(tmp_path):
    asm, _ = run(streamed_rows(50) + plain_rows(50), memory_budget=10**9)
    assert asm._buffered == 0


def test_spill_file_reads_back_records_across_chunk_boundaries(tmp_path):
    spill = SpillFile(tmp_path)
    records = [(i, i % 5, bytes([i % 256]) * (i * 37 % 3000)) for i in range(2000)]
    records.append((2000, 1, b"z" * (3 << 20)))  # one record larger than a read chunk
    for lsn, sub, data in records:
        spill.append(lsn, sub, data)
    assert [(lsn, sub, data) for _, lsn, sub, data in spill] == records
    spill.close()
    assert spill.closed and open_files_in(tmp_path) == 0
