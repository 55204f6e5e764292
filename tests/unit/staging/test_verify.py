"""Manifests record every staged file (size, rows, SHA-256, commit-LSN range); the reader refuses a batch whose files
differ, naming batch and file (docs/staging-format.md, "Verification")."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.decoding.model import LogicalMessage, RowChange, TruncateChange
from airflow_provider_pglogical.exceptions import StagingCorruptError
from airflow_provider_pglogical.staging import StagingReader
from airflow_provider_pglogical.staging.manifest import hash_file
from tests.unit.staging.test_writer_and_reader import REL, img, tx, writer

TABLE = "tables/public.t/v1.parquet"


def publish(tmp_path, start: int, txs) -> str:
    w = writer(tmp_path, start=start)
    for t in txs:
        w.write_transaction(t)
    path = w.finish_files()
    w.publish({"format": 1, "relations": [], "types": []})
    return path


def rows(n: int, count: int = 3) -> list[RowChange]:
    return [RowChange("I", REL, 1000 * n - 10 + k, None, img(10 * n + k, "x")) for k in range(count)]


@pytest.fixture
def staged(tmp_path):
    """Two contiguous batches: 10-2008 (transactions 1, 2) and 2008-4008 (3, 4, with a truncate and a message)."""
    first = publish(tmp_path, 10, [tx(1, rows(1)), tx(2, rows(2, 2))])
    second = publish(tmp_path, 2008, [tx(3, rows(3)), tx(4, [*rows(4, 1), TruncateChange(3990, (REL,), False, False),
                                                              LogicalMessage(3995, True, "p", b"m")])])
    reader = StagingReader.from_uri(str(tmp_path), "s")
    return reader, first, second


def test_the_manifest_records_every_file_with_size_rows_hash_and_commit_lsn_range(staged):
    reader, first, second = staged
    one, two = reader.batches()
    manifest = reader.manifest(two)
    assert sorted(manifest.files) == ["messages.parquet", "relations.parquet", TABLE, "transactions.parquet",
                                      "truncates.parquet"]
    for rel, record in manifest.file_records.items():
        assert (record.bytes, record.sha256) == hash_file(reader.layout.fs, f"{second}/{rel}")
        assert record.rows == pq.ParquetFile(f"{second}/{rel}").metadata.num_rows
    records = manifest.file_records
    assert (records[TABLE].rows, records[TABLE].min_commit_lsn, records[TABLE].max_commit_lsn) == (4, 3000, 4000)
    assert (records["transactions.parquet"].min_commit_lsn, records["transactions.parquet"].max_commit_lsn) == \
        (3000, 4000)
    assert records["truncates.parquet"].min_commit_lsn == 4000 and records["messages.parquet"].rows == 1
    assert records["relations.parquet"].min_commit_lsn is None
    assert manifest.bytes == sum(r.bytes for r in records.values())
    reader.verify(one)
    reader.verify(two)


def refused(reader, batch, file: str) -> str:
    with pytest.raises(StagingCorruptError) as info:
        reader.verify(batch)
    message = str(info.value)
    assert "\n" not in message and info.value.file == file and info.value.batch in message
    assert message.startswith(f"staged batch 0/{batch.start_lsn:X}-0/{batch.end_lsn:X} ({batch.name}): {file} ")
    return message


def test_a_file_swapped_in_from_another_batch_is_refused(staged):
    reader, first, second = staged
    shutil.copy(f"{first}/{TABLE}", f"{second}/{TABLE}")
    message = refused(reader, reader.batches()[1], TABLE)
    assert "bytes" in message or "SHA-256" in message


def test_a_file_of_the_same_size_with_other_bytes_is_refused_by_its_hash(staged):
    reader, _first, second = staged
    data = bytearray(open(f"{second}/{TABLE}", "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(f"{second}/{TABLE}", "wb").write(bytes(data))
    assert "SHA-256" in refused(reader, reader.batches()[1], TABLE)


def edit(path: str, change) -> None:
    body = json.loads(open(f"{path}/_manifest.json").read())
    change(body)
    open(f"{path}/_manifest.json", "w").write(json.dumps(body))


def test_a_manifest_whose_range_is_not_its_directorys_is_refused(staged):
    reader, _first, second = staged
    edit(second, lambda body: body.update(end_lsn_int=body["end_lsn_int"] + 8))
    assert "gives the range 0/7D8-0/FB0, its directory 0/7D8-0/FA8" in refused(reader, reader.batches()[1],
                                                                             "_manifest.json")


def test_a_deleted_transactions_file_is_refused(staged):
    reader, first, _second = staged
    (__import__("os")).remove(f"{first}/transactions.parquet")
    assert refused(reader, reader.batches()[0], "transactions.parquet").endswith("transactions.parquet is missing")


def test_a_changed_row_count_is_refused(staged):
    reader, first, _second = staged
    edit(first, lambda body: body["tables"]["public.t"].update(rows=6))
    assert "counts 6 row changes of public.t, its file records 5" in refused(reader, reader.batches()[0],
                                                                            "_manifest.json")
    # the same count edited in the file record too: the Parquet footer disagrees
    edit(first, lambda body: body["files"][TABLE].update(rows=6))
    assert "holds 5 rows, its manifest records 6" in refused(reader, reader.batches()[0], TABLE)


def test_a_recorded_commit_lsn_range_outside_the_batch_is_refused(staged):
    reader, first, _second = staged
    edit(first, lambda body: body["files"][TABLE].update(max_commit_lsn=5000))
    assert "outside 0/A-0/7D8" in refused(reader, reader.batches()[0], TABLE)


def test_a_truncated_parquet_file_is_refused_and_reading_it_names_file_and_batch(staged):
    reader, first, _second = staged
    data = open(f"{first}/{TABLE}", "rb").read()
    open(f"{first}/{TABLE}", "wb").write(data[:-100])
    batch = reader.batches()[0]
    assert "bytes, its manifest records" in refused(reader, batch, TABLE)
    with pytest.raises(StagingCorruptError) as info:
        reader.read_file(batch, TABLE)
    assert str(info.value).startswith(f"staged batch 0/A-0/7D8 ({batch.name}): {TABLE} cannot be read as Parquet: ")
    assert "\n" not in str(info.value)


def test_an_unreadable_file_record_is_refused(staged):
    reader, first, _second = staged
    edit(first, lambda body: body["files"].update({TABLE: {"bytes": 1}}))
    assert "unreadable file record (KeyError" in refused(reader, reader.batches()[0], "_manifest.json")


def test_files_observed_elsewhere_are_judged_from_the_observation_with_the_same_checks(staged, tmp_path):
    """What the executors found of a file (``observe_file`` where they run) is judged like a local read: the same
    refusals, naming batch and file; files not observed are still read here."""
    from dataclasses import replace

    from airflow_provider_pglogical.staging.verify import observe_file

    reader, first, second = staged
    _, batch = reader.batches()
    observed = {TABLE: observe_file(reader.layout.fs, f"{second}/{TABLE}")}
    reader.verify(batch, observed=observed)  # a faithful observation passes
    damaged = {TABLE: replace(observed[TABLE], sha256="0" * 64)}
    with pytest.raises(StagingCorruptError, match=f"{TABLE} has SHA-256 0000000000000000…") as info:
        reader.verify(batch, observed=damaged)
    assert info.value.file == TABLE
    with pytest.raises(StagingCorruptError, match=f"{TABLE} holds 9 rows, its manifest records 4"):
        reader.verify(batch, observed={TABLE: replace(observed[TABLE], rows=9)})
    with pytest.raises(StagingCorruptError, match=f"{TABLE} is missing"):
        reader.verify(batch, observed={TABLE: observe_file(reader.layout.fs, f"{second}/nothing.parquet")})
    # The observation is what counts: the file on disk is not read again for it ...
    shutil.copy(f"{first}/{TABLE}", f"{second}/{TABLE}")
    reader.verify(batch, observed=observed)
    # ... while the unobserved files still are.
    shutil.copy(f"{first}/transactions.parquet", f"{second}/transactions.parquet")
    with pytest.raises(StagingCorruptError, match="transactions.parquet"):
        reader.verify(batch, observed=observed)
