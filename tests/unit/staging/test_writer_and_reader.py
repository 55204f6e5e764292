"""BatchWriter and StagingReader with hand-made decoder records, on a local filesystem (and once on S3)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import fsspec
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.decoding.model import (
    ColumnDef,
    LogicalMessage,
    NonTransactionalMessage,
    RelationSchema,
    RowChange,
    Transaction,
    TruncateChange,
    TupleData,
)
from airflow_provider_pglogical.decoding.values import RowImageConverter
from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging import StagingLayout, StagingReader
from airflow_provider_pglogical.staging.writer import BatchWriter
from tests.support.s3server import s3_server

REL = RelationSchema(16384, "public", "t", "d", (ColumnDef("id", 23, -1, True), ColumnDef("body", 25, -1, False)))


class Resolver:
    def converter(self, relation):
        return RowImageConverter(relation)

    def type_names(self, relation):
        return ["integer", "text"][: len(relation.columns)]


def img(i: int, body: str | None, kind: str = "b") -> TupleData:
    return TupleData("b" + kind, (struct.pack("!i", i), None if body is None else body.encode()))


def tx(n: int, changes, xid: int | None = None) -> Transaction:
    return Transaction(xid=xid or 700 + n, commit_lsn=1000 * n, end_lsn=1000 * n + 8, commit_time_us=10**12,
                       changes=tuple(changes))


def writer(tmp_path, start=10, **kw) -> BatchWriter:
    return BatchWriter(StagingLayout.from_uri(str(tmp_path), "s"), start_lsn=start, slot="s", publication="p",
                       resolver=Resolver(), **kw)


def no_markers(app: Callable[..., Any]) -> Callable[..., Any]:
    """An S3 server that answers a directory marker's PUT (a key ending in ``/``) without storing it, as a store
    does under a pyarrow that writes none where it deletes a directory's last file."""
    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ["REQUEST_METHOD"] == "PUT" and environ["PATH_INFO"].count("/") > 1 \
                and environ["PATH_INFO"].endswith("/"):
            start_response("200 OK", [("Content-Length", "0")])
            return [b""]
        return app(environ, start_response)
    return serve


def test_a_batch_moved_from_its_partial_directory_on_s3_needs_no_marker_left_there(monkeypatch):
    with s3_server(wrap=no_markers) as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        layout = StagingLayout.from_uri(f"s3://{server.bucket}/st", "s")
        w = BatchWriter(layout, start_lsn=10, slot="s", publication="p", resolver=Resolver())
        w.write_transaction(tx(1, [RowChange("I", REL, 990, None, img(1, "x"))]))
        w.finish_files()
        w.publish({"format": 1, "relations": [], "types": []})
        (batch,) = StagingReader(layout).batches()
        keys = server.keys("st/")
        assert not [k for k in keys if "_partial-" in k or k.endswith("/")], keys
        assert (batch.start_lsn, batch.end_lsn) == (10, 1008) and any(k.endswith("/v1.parquet") for k in keys)


class ShortListing(pafs.FSSpecHandler):
    """Local files behind a store-like filesystem (no directory rename) whose recursive listing leaves out the
    files ``dropped`` matches, as an S3-compatible store's listing that lags a write or comes back short."""

    def __init__(self, dropped: Callable[[str], bool]) -> None:
        super().__init__(fsspec.filesystem("file"))
        self.dropped = dropped

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return [info for info in super().get_file_info_selector(selector) if not self.dropped(info.path)]


def test_a_listing_that_misses_a_written_file_moves_publishes_and_deletes_nothing(tmp_path):
    """Moving only what a short listing returned, then deleting the partial directory, would publish a batch
    without its table file (the drain then advances the slot past it) and delete that file."""
    def write(fs: pafs.FileSystem) -> BatchWriter:
        w = BatchWriter(StagingLayout(fs, str(tmp_path), "s"), start_lsn=10, slot="s", publication="p",
                        resolver=Resolver())
        w.write_transaction(tx(1, [RowChange("I", REL, 990, None, img(1, "x"))]))
        return w

    short = write(pafs.PyFileSystem(ShortListing(lambda path: "/tables/" in path)))
    with pytest.raises(StagingError, match=r"_partial-000000000000000A: the store's listing lacks 1 of the 4 "
                                           r"file\(s\) written \(tables/public.t/v1.parquet\); nothing was moved "
                                           r"or published: run again, the next run deletes"):
        short.finish_files()
    partial = tmp_path / "s" / "batches" / "_partial-000000000000000A"
    assert sorted(p.relative_to(partial).as_posix() for p in partial.rglob("*.parquet")) == sorted(
        short.manifest.files)
    layout = StagingLayout.from_uri(str(tmp_path), "s")
    assert StagingReader(layout).batches() == [] and layout.list_batch_dirs() == []
    # The way out the error names: the next run deletes the unpublished directory and stages the batch anew
    # (through the store's move, an extra file there moving along unread).
    for leftover in layout.leftovers_for(10):
        layout.delete_dir(leftover)
    again = write(pafs.PyFileSystem(ShortListing(lambda path: False)))
    (tmp_path / "s" / "batches" / "_partial-000000000000000A" / "_extra").write_text("")
    again.finish_files()
    again.publish({"format": 1, "relations": [], "types": []})
    (batch,) = StagingReader(layout).batches()
    assert pq.read_table(f"{batch.path}/tables/public.t/v1.parquet").column("new").to_pylist() == [
        {"id": 1, "body": "x"}]
    assert not partial.exists() and (tmp_path / batch.path / "_extra").exists()


def test_rows_stream_out_in_row_groups_in_commit_and_tx_order(tmp_path):
    w = writer(tmp_path, row_group_rows=4)
    for n in range(1, 4):
        w.write_transaction(tx(n, [RowChange("I", REL, 1000 * n - 10 + k, None, img(10 * n + k, "x")) for k in range(3)]))
    path = w.finish_files()
    manifest = w.publish({"format": 1, "relations": [], "types": []})
    f = pq.ParquetFile(f"{path}/tables/public.t/v1.parquet")
    assert [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)] == [4, 4, 1]
    rows = f.read().to_pylist()
    assert [(r["commit_lsn"], r["tx_order"]) for r in rows] == sorted((r["commit_lsn"], r["tx_order"]) for r in rows)
    assert rows[0]["new"] == {"id": 10, "body": "x"} and rows[0]["old"] is None
    assert manifest.transactions == 3 and manifest.changes == 9 and manifest.end_lsn_int == 3008
    assert StagingReader(w.layout).batches()[0].end_lsn == 3008


def test_unchanged_toast_is_listed_and_not_confused_with_null(tmp_path):
    w = writer(tmp_path)
    w.write_transaction(tx(1, [RowChange("U", REL, 990, img(1, None, "n"), img(1, None, "u"), old_key_only=True),
                               RowChange("U", REL, 995, None, img(2, None, "n"))]))
    rows = pq.read_table(f"{w.finish_files()}/tables/public.t/v1.parquet").to_pylist()
    assert rows[0]["new_unchanged_toast"] == ["body"] and rows[0]["old_key_only"] is True
    assert rows[1]["new_unchanged_toast"] == [] and rows[1]["new"]["body"] is None


def test_truncates_file_exists_only_when_the_batch_has_truncates(tmp_path):
    w = writer(tmp_path)
    w.write_transaction(tx(1, [RowChange("I", REL, 990, None, img(1, "a"))]))
    path = w.finish_files()
    assert not (tmp_path / path / "truncates.parquet").exists()
    w2 = writer(tmp_path / "b")
    w2.write_transaction(tx(1, [TruncateChange(990, (REL,), cascade=False, restart_identity=True),
                                LogicalMessage(995, True, "pfx", b"\x00\x01")]))
    w2.write_message(NonTransactionalMessage(LogicalMessage(996, False, "loose", b"z"), xid=0))
    p2 = w2.finish_files()
    [t] = pq.read_table(f"{p2}/truncates.parquet").to_pylist()
    assert t["relations"] == ["public.t"] and t["relids"] == [16384] and t["restart_identity"] and t["tx_order"] == 0
    msgs = pq.read_table(f"{p2}/messages.parquet").to_pylist()
    assert [(m["prefix"], m["tx_order"], m["transactional"]) for m in msgs] == [("pfx", 1, True), ("loose", None, False)]
    assert pq.read_table(f"{p2}/relations.parquet").to_pylist()[0]["columns"][0]["type_name"] == "integer"


def test_a_batch_is_invisible_until_its_manifest_is_published(tmp_path):
    w = writer(tmp_path)
    w.write_transaction(tx(1, [RowChange("I", REL, 990, None, img(1, "a"))]))
    reader = StagingReader(w.layout)
    assert (tmp_path / "s" / "batches" / "_partial-000000000000000A").is_dir()
    assert reader.batches() == []
    w.finish_files()
    assert reader.batches() == [] and reader.layout.leftovers_for(10)
    w.publish({"format": 1, "relations": [], "types": []})
    assert [b.name for b in reader.batches()] == ["000000000000000A-00000000000003F0"]


def test_out_of_order_transactions_are_refused(tmp_path):
    w = writer(tmp_path)
    w.write_transaction(tx(2, []))
    with pytest.raises(StagingError, match="commit order"):
        w.write_transaction(tx(1, []))


def _publish(tmp_path, start, end, state=None):
    w = writer(tmp_path, start=start)
    w.finish_files(end)
    w.publish(state or {"format": 1, "relations": [], "types": [], "end": end})


def test_the_reader_reports_gaps_and_overlaps(tmp_path):
    _publish(tmp_path, 100, 200)
    _publish(tmp_path, 200, 300)
    reader = StagingReader.from_uri(str(tmp_path), "s")
    assert [(b.start_lsn, b.end_lsn) for b in reader.batches()] == [(100, 200), (200, 300)]
    _publish(tmp_path, 400, 500)
    with pytest.raises(StagingError, match="gap"):
        reader.batches()
    _publish(tmp_path / "o", 100, 200)
    _publish(tmp_path / "o", 150, 250)
    with pytest.raises(StagingError, match="overlap"):
        StagingReader.from_uri(str(tmp_path / "o"), "s").batches()


def test_relation_state_comes_from_the_last_batch_ending_at_or_before_the_start(tmp_path):
    _publish(tmp_path, 100, 200, {"end": 200})
    _publish(tmp_path, 200, 300, {"end": 300})
    reader = StagingReader.from_uri(str(tmp_path), "s")
    assert reader.relation_state()["end"] == 300
    assert reader.relation_state(upto_lsn=250)["end"] == 200
    assert reader.relation_state(upto_lsn=50) is None
    reader.save_state_copy({"end": 300}, 300)
    for b in reader.batches():
        reader.layout.delete_dir(b.path)  # pruned after apply: the slot-level copy remains
    assert reader.relation_state(upto_lsn=300) == {"end": 300}
