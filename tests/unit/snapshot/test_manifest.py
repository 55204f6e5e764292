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
