"""Staging layout names and the manifest contract, without any server."""

from __future__ import annotations

import json

import pytest

from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.staging.layout import (
    StagingLayout,
    lsn_hex,
    parse_batch_name,
    quote_name,
    table_file,
    unquote_name,
)
from airflow_provider_pglogical.staging.manifest import Manifest, read_manifest, write_manifest


def test_batch_names_are_fixed_width_hex_so_lexical_order_is_lsn_order():
    lsns = [0, 0xFF, 0x1_0000_0000, 0x2_0000_0001]
    names = [f"{lsn_hex(a)}-{lsn_hex(a + 1)}" for a in lsns]
    assert sorted(names) == names
    assert parse_batch_name(names[2]) == (0x1_0000_0000, 0x1_0000_0001)
    assert parse_batch_name("_partial-0000000000000001") is None
    assert parse_batch_name("0000000000000001-00000000000000zz") is None


def test_names_are_quoted_so_dots_cannot_make_two_tables_collide():
    assert table_file("a.b", "c", 1) != table_file("a", "b.c", 1)
    assert table_file('Sch "ema"', "T.x", 2) == "tables/Sch%20%22ema%22.T%2Ex/v2.parquet"
    for name in ["näme", "a/b", "%41", 'x"y', "dot.dot"]:
        assert unquote_name(quote_name(name)) == name
        assert "/" not in quote_name(name) and "." not in quote_name(name)


def test_local_paths_and_file_uris_resolve_to_the_same_layout(tmp_path):
    a = StagingLayout.from_uri(str(tmp_path), "s")
    b = StagingLayout.from_uri(f"file://{tmp_path}", "s")
    assert a.batches_dir == b.batches_dir == f"{tmp_path}/s/batches"
    assert a.is_local and b.is_local


def test_leftovers_are_partial_or_manifest_less_directories_of_the_same_start(tmp_path):
    layout = StagingLayout.from_uri(str(tmp_path), "s")
    layout.fs.create_dir(layout.partial_dir(16), recursive=True)
    layout.fs.create_dir(layout.batch_dir(16, 32), recursive=True)
    layout.fs.create_dir(layout.batch_dir(32, 48), recursive=True)
    assert sorted(layout.leftovers_for(16)) == sorted([layout.batch_dir(16, 32), layout.partial_dir(16)])
    write_manifest(layout, layout.batch_dir(16, 32), Manifest("s", "p", 16, 32))
    assert layout.leftovers_for(16) == [layout.partial_dir(16)]


def test_a_manifest_round_trips_with_lsns_as_text_and_int(tmp_path):
    layout = StagingLayout.from_uri(str(tmp_path), "s")
    m = Manifest("s", "p", 0x1_0000_0010, 0x1_0000_0FF0, transactions=3,
                 tables={"public.t": {"rows": 5, "files": ["tables/public.t/v1.parquet"]}}, truncates=1)
    batch = layout.batch_dir(m.start_lsn_int, m.end_lsn_int)
    layout.fs.create_dir(batch, recursive=True)
    write_manifest(layout, batch, m)
    body = json.loads(open(f"{batch}/_manifest.json").read())
    assert body["format_version"] == 2 and body["start_lsn"] == "1/10" and body["end_lsn"] == "1/FF0"
    assert body["created_at"].endswith("Z")
    back = read_manifest(layout, batch)
    assert (back.tables, back.transactions, back.changes) == (m.tables, 3, 5)
    assert not any(p.name.startswith("_tmp") for p in tmp_path.rglob("*"))


def test_unknown_manifest_keys_are_ignored_and_other_format_versions_refused():
    base = {"slot": "s", "publication": "p", "start_lsn_int": 1, "end_lsn_int": 2, "format_version": 2}
    assert Manifest.from_json(json.dumps({**base, "future_key": [1]})).end_lsn_int == 2
    # format 1 (no per-file records) is refused, not read unverified
    with pytest.raises(StagingError, match="format_version 1; this reader understands 2"):
        Manifest.from_json(json.dumps({**base, "format_version": 1}))
    with pytest.raises(StagingError, match="unreadable"):
        Manifest.from_json("{not json")
