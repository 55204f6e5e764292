"""RelationCache versions relation schemas only on real change and survives a state round trip."""

from __future__ import annotations

import json

import pytest

from airflow_provider_pglogical.decoding.messages import RelationMessage, TypeMessage
from airflow_provider_pglogical.decoding.model import ColumnDef
from airflow_provider_pglogical.decoding.relations import RelationCache

COLS = (ColumnDef("id", 23, -1, True), ColumnDef("v", 25, -1, False))


def rel(**changes) -> RelationMessage:
    fields = {"xid": None, "relid": 16384, "namespace": "public", "name": "t", "replica_identity": "d",
              "columns": COLS}
    fields.update(changes)
    return RelationMessage(**fields)


def test_first_relation_message_creates_version_one():
    schema = RelationCache().apply_relation(rel())
    assert (schema.version, schema.qualified_name, schema.identity_columns) == (1, "public.t", ("id",))


def test_identical_relation_message_keeps_the_same_version_and_object():
    cache = RelationCache()
    first = cache.apply_relation(rel())
    assert cache.apply_relation(rel(xid=77)) is first


@pytest.mark.parametrize("change", [
    {"namespace": "other"}, {"name": "t2"}, {"replica_identity": "f"},
    {"columns": COLS[:1]}, {"columns": (COLS[0], ColumnDef("v", 1043, -1, False))},
    {"columns": (COLS[0], ColumnDef("v", 25, 10, False))}, {"columns": (COLS[0], ColumnDef("v", 25, -1, True))},
    {"columns": (COLS[0], ColumnDef("w", 25, -1, False))},
], ids=["namespace", "name", "replica identity", "column dropped", "type", "typmod", "identity flag", "column name"])
def test_any_difference_bumps_the_version(change):
    cache = RelationCache()
    cache.apply_relation(rel())
    assert cache.apply_relation(rel(**change)).version == 2


def test_changing_back_to_an_earlier_shape_is_still_a_new_version():
    cache = RelationCache()
    cache.apply_relation(rel())
    cache.apply_relation(rel(name="t2"))
    assert cache.apply_relation(rel()).version == 3


def test_empty_namespace_means_pg_catalog_for_relations_and_types():
    cache = RelationCache()
    assert cache.apply_relation(rel(namespace="")).namespace == "pg_catalog"
    assert cache.apply_type(TypeMessage(None, 16500, "", "int4")).namespace == "pg_catalog"
    assert cache.type_info(16500).name == "int4"


def test_versions_are_per_relid():
    cache = RelationCache()
    cache.apply_relation(rel())
    cache.apply_relation(rel(name="x"))
    assert cache.apply_relation(rel(relid=1)).version == 1


def test_state_round_trips_through_json_and_continues_numbering():
    cache = RelationCache()
    cache.apply_relation(rel())
    cache.apply_relation(rel(replica_identity="f"))
    cache.apply_type(TypeMessage(None, 16500, "public", "mood"))
    restored = RelationCache.from_state(json.loads(json.dumps(cache.to_state())))
    assert restored.get(16384) == cache.get(16384)
    assert restored.types == cache.types
    assert restored.apply_relation(rel(replica_identity="f")).version == 2
    assert restored.apply_relation(rel()).version == 3


def test_state_of_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="format"):
        RelationCache.from_state({"format": 99, "relations": [], "types": []})
