"""The pglogical:// Asset URI scheme: canonical URIs, validation, and Airflow using our handler."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical import get_provider_info
from airflow_provider_pglogical.assets.pglogical import (
    asset_uri,
    convert_asset_to_openlineage,
    create_asset,
    parse_asset_uri,
    sanitize_uri,
    staged_table_asset,
    target_table_asset,
)


def sanitized(uri: str) -> str:
    return urlunsplit(sanitize_uri(urlsplit(uri)))


def test_staged_and_target_tables_of_the_same_name_have_different_uris():
    assert staged_table_asset("s1", "public.orders").uri == "pglogical://s1/public.orders"
    assert target_table_asset("s1", "public.orders").uri == "pglogical://s1/target/public.orders"


def test_dots_inside_names_are_escaped_so_schema_and_table_never_collide():
    assert asset_uri("s", "a.b.c") == "pglogical://s/a.b%2Ec"
    assert parse_asset_uri(asset_uri("s", "a.b.c")).qualified_name == "a.b.c"


@pytest.mark.parametrize(("uri", "canonical"), [
    ("pglogical://S1/public.orders", "pglogical://s1/public.orders"),
    ("pglogical://s1/p%75blic.a%2eb", "pglogical://s1/public.a%2Eb"),
    ("pglogical://s1/target/My%20Schema.T", "pglogical://s1/target/My%20Schema.T"),
])
def test_sanitize_normalises_to_the_one_canonical_uri(uri, canonical):
    assert sanitized(uri) == canonical


@pytest.mark.parametrize(("uri", "message"), [
    ("pglogical:///public.orders", "must name a replication slot"),
    ("pglogical://bad-slot/public.orders", "must name a replication slot"),
    ("pglogical://u:p@s1/public.orders", "no user, password or port"),
    ("pglogical://s1:5432/public.orders", "no user, password or port"),
    ("pglogical://s1/orders", "one <schema>.<table>"),
    ("pglogical://s1/a.b.c", "one <schema>.<table>"),
    ("pglogical://s1/staged/public.orders", "path must be"),
    ("pglogical://s1/public.orders?x=1", "no query string"),
    ("pglogical://s1/.orders", "empty schema or table"),
    ("pglogical://s1/target//public.orders", "empty target location"),
    ("pglogical://s1/staged/x/public.orders", "path must be"),
])
def test_sanitize_rejects_uris_that_name_no_slot_table(uri, message):
    with pytest.raises(ValueError, match=message):
        sanitized(uri)


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)


@given(slot=st.from_regex(r"[a-z0-9_]{1,63}", fullmatch=True), schema=names, table=names,
       kind=st.sampled_from(["staged", "target"]), location=st.none() | names)
def test_every_slot_and_table_name_round_trips_through_its_uri(slot, schema, table, kind, location):
    location = location if kind == "target" else None
    uri = asset_uri(slot, f"{schema.replace('.', '_')}.{table}", kind, location)
    ref = parse_asset_uri(uri)
    assert (ref.slot, ref.kind, ref.table, ref.location) == (slot, kind, table, location)
    assert sanitized(uri) == uri  # canonical URIs are fixed points


def test_two_targets_writing_a_table_of_one_name_have_distinct_uris_and_lineage_names():
    dw = target_table_asset("s1", "public.orders", "postgres/warehouse:5432/dw")
    lake = target_table_asset("s1", "public.orders", "iceberg/sqlite:////lake/catalog.db/cdc")
    assert dw.uri == "pglogical://s1/target/postgres%2Fwarehouse%3A5432%2Fdw/public.orders"
    assert lake.uri == "pglogical://s1/target/iceberg%2Fsqlite%3A%2F%2F%2F%2Flake%2Fcatalog%2Edb%2Fcdc/public.orders"
    assert parse_asset_uri(dw.uri).location == "postgres/warehouse:5432/dw"
    assert parse_asset_uri(dw.uri).qualified_name == "public.orders"
    names = {convert_asset_to_openlineage(a, None).name for a in (dw, lake, target_table_asset("s1", "public.orders"))}
    assert len(names) == 3
    assert sanitized("pglogical://s1/target/postgres%2fdw/p%75blic.orders") == \
        "pglogical://s1/target/postgres%2Fdw/public.orders"
    with pytest.raises(ValueError, match="only a target table"):
        asset_uri("s1", "public.orders", "staged", "postgres/dw")


def test_the_provider_registers_the_scheme_and_airflow_normalises_assets_with_it():
    from airflow.sdk import Asset
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    (entry,) = get_provider_info()["asset-uris"]
    assert entry["schemes"] == ["pglogical"]
    handlers = ProvidersManagerTaskRuntime().asset_uri_handlers
    assert handlers["pglogical"] is sanitize_uri
    assert Asset("pglogical://S1/p%75blic.orders").uri == "pglogical://s1/public.orders"
    with pytest.raises(ValueError, match="must name a replication slot"):
        Asset("pglogical://not-a-slot/public.orders")


def test_the_factory_and_the_openlineage_converter_agree_with_the_lineage_names():
    asset = create_asset(slot="s1", table="public.orders_eu", kind="target")
    dataset = convert_asset_to_openlineage(asset, None)
    assert (dataset.namespace, dataset.name) == ("pglogical://s1", "target/public.orders_eu")
    staged = convert_asset_to_openlineage(staged_table_asset("s1", "public.orders"), None)
    assert (staged.namespace, staged.name) == ("pglogical://s1", "public.orders")
