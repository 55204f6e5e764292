"""Snapshot manifests: version 1 (one table), version 2 (a routed partitioned table, one part per leaf)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.snapshot.layout import SnapshotManifest

RELATION = {"relid": 1, "schema": "public", "table": "meas", "replica_identity": "d",
            "columns": [{"name": "id", "type_oid": 23, "type_modifier": -1, "type_name": "integer", "is_identity": True}]}
PART = {"table": "public.meas_a", "relation": dict(RELATION, table="meas_a"), "row_filter": "(id > 1)", "rows": 3,
        "bytes": 10, "files": ["chunks/p0000-c00000.parquet"]}


def _manifest(**kw) -> SnapshotManifest:
    return SnapshotManifest(slot="s", publication="p", table="public.meas", lsn_int=16, reason="initial",
                            request_id="1", relation=RELATION, **kw)


def test_a_routed_snapshot_is_version_2_with_its_parts_and_reads_back():
    plain, routed = _manifest(), _manifest(parts=[PART], files=PART["files"])
    assert plain.format_version == 1 and json.loads(plain.to_json())["parts"] == []
    assert routed.format_version == 2
    back = SnapshotManifest.from_json(routed.to_json())
    assert back.parts == [PART] and back.format_version == 2 and back.lsn_int == 16
    assert SnapshotManifest.from_json(plain.to_json()).parts == []


@pytest.mark.parametrize("version, parts", [(2, []), (1, [PART]), (3, [PART])])
def test_a_version_that_does_not_match_the_parts_is_refused(version, parts):
    body = json.loads(_manifest().to_json())
    body.update(format_version=version, parts=parts)
    with pytest.raises(StagingError, match="unknown kind or format_version"):
        SnapshotManifest.from_json(json.dumps(body), where="x")


def _published(tmp_path, chunk_rows: int, **kw):
    """A published one-chunk snapshot of public.meas at LSN 16 (chunk rows: the row-change schema's commit_lsn)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_pglogical.snapshot.layout import SnapshotLayout

    layout = SnapshotLayout.from_uri(str(tmp_path), "s")
    directory = layout.snapshot_dir("public.meas", 16)
    layout.fs.create_dir(f"{directory}/chunks", recursive=True)
    pq.write_table(pa.table({"commit_lsn": pa.array([16] * chunk_rows, pa.int64())}),
                   f"{directory}/chunks/c00000.parquet")
    layout.publish(directory, _manifest(files=["chunks/c00000.parquet"], rows=chunk_rows, **kw))
    ref = layout.latest("public.meas")
    assert ref is not None
    return layout, ref, f"{directory}/chunks/c00000.parquet"


def test_a_snapshot_without_file_records_is_refused_naming_the_resync_that_stages_it_again(tmp_path):
    from airflow_provider_pglogical.exceptions import StagingCorruptError

    layout, ref, _chunk = _published(tmp_path, 3)
    with pytest.raises(StagingCorruptError) as info:
        layout.verify(ref, layout.manifest(ref))
    assert str(info.value) == ("staged snapshot of public.meas at 0/10 (0000000000000010): _manifest.json records no "
                               "file sizes or hashes (staged by an older release); stage it again: pglogical resync "
                               "--table public.meas")


def test_a_snapshot_chunk_is_checked_against_its_record(tmp_path):
    from airflow_provider_pglogical.exceptions import StagingCorruptError
    from airflow_provider_pglogical.staging.manifest import FileRecord, hash_file
    from airflow_provider_pglogical.staging.verify import verify_files

    layout, ref, chunk = _published(tmp_path, 3)
    size, digest = hash_file(layout.fs, chunk)
    records = {"chunks/c00000.parquet": FileRecord(size, 3, digest, 16, 16).to_dict()}
    layout.publish(ref.path, _manifest(files=["chunks/c00000.parquet"], rows=3, file_records=records))
    layout.verify(ref, layout.manifest(ref))
    verify_files(layout.fs, ref.path, "x", {"chunks/c00000.parquet": FileRecord(size, 3, digest, 16, 16)}, 16, 16)
    layout.publish(ref.path, _manifest(files=["chunks/c00000.parquet"], rows=3,
                                       file_records={"chunks/c00000.parquet": {"bytes": size}}))
    with pytest.raises(StagingCorruptError, match="unreadable file record"):
        layout.verify(ref, layout.manifest(ref))
    layout.publish(ref.path, _manifest(files=["chunks/c00000.parquet"], rows=4, file_records=records))
    with pytest.raises(StagingCorruptError, match="counts 4 rows, its file records 3; stage it again"):
        layout.verify(ref, layout.manifest(ref))


def test_a_request_closed_between_the_listing_and_its_read_is_left_out(tmp_path, monkeypatch):
    """The snapshot closes a published set's requests while a loader of another set lists them (``pglogical run``'s
    overlapped load): the closed one is left out instead of failing the loader's planning."""
    from airflow_provider_pglogical.snapshot import layout as layout_module
    from airflow_provider_pglogical.snapshot.layout import SnapshotLayout

    layout = SnapshotLayout.from_uri(str(tmp_path), "s1")
    layout.request("public.a", "initial")
    layout.request("public.b", "initial")
    real = layout_module.read_text

    def closing_b_first(staging, path):  # the snapshot's close_request lands between the listing and this read
        if path == layout._request_path("public.b"):
            layout.close_request("public.b")
        return real(staging, path)

    monkeypatch.setattr(layout_module, "read_text", closing_b_first)
    assert set(layout.requests()) == {"public.a"}
