"""OpenLineage dataset names: PostgreSQL tables as the postgres provider names them, paths for path targets."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.lineage.datasets import (
    DatasetName,
    path_location,
    postgres_authority,
    postgres_table,
    staged_table,
    target_table,
)
from airflow_provider_pglogical.lineage.openlineage import operator_lineage


def test_postgres_tables_are_named_like_the_postgres_provider_names_them():
    assert postgres_table(postgres_authority("db.example", None), "app", "public.orders") == \
        DatasetName("postgres://db.example:5432", "app.public.orders")
    assert target_table("postgres", "dw.orders_eu", {"authority": "h:6543", "database": "wh"}) == \
        DatasetName("postgres://h:6543", "wh.dw.orders_eu")


@pytest.mark.parametrize(("uri", "expected"), [
    ("/data/delta/", DatasetName("file", "/data/delta")),
    ("file:///data/delta/public.orders", DatasetName("file", "/data/delta/public.orders")),
    ("s3://lake/warehouse/public.orders/", DatasetName("s3://lake", "warehouse/public.orders")),
    ("gs://bucket/x", DatasetName("gs://bucket", "x")),
])
def test_path_locations_use_a_file_or_bucket_namespace_and_the_path(uri, expected):
    assert path_location(uri) == expected


def test_delta_targets_are_named_by_their_table_location():
    assert target_table("delta", "public.orders", {"root": "s3://lake/wh"}) == DatasetName("s3://lake",
                                                                                         "wh/public.orders")
    assert target_table("delta", "public.orders", {"locations": {"public.orders": "/t/o"}}) == DatasetName("file",
                                                                                                         "/t/o")


def test_an_unknown_target_kind_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="no OpenLineage naming for target kind 'kafka'"):
        target_table("kafka", "t.t", {})


def test_operator_lineage_carries_row_counts_as_output_statistics():
    lineage = operator_lineage([staged_table("s", "public.a"), staged_table("s", "public.a")],
                               {DatasetName("postgres://h:1", "d.public.a"): 12})
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("pglogical://s", "public.a")]
    (out,) = lineage.outputs
    assert out.outputFacets["outputStatistics"].rowCount == 12


def test_apply_lineage_without_a_tables_mapping_names_each_applied_table_as_its_own_target(monkeypatch):
    # ``tables`` left out applies every staged table under its own name; its lineage once failed on None.
    from airflow_provider_pglogical.operators.apply import PgLogicalApplyOperator

    monkeypatch.setenv("AIRFLOW_CONN_DW", "postgresql://loader@warehouse:5432/dw")
    op = PgLogicalApplyOperator(task_id="apply", slot="s", staging_uri="/tmp/staging", target_conn_id="dw")
    op._lineage_rows = {"public.orders": 3}  # what execute() leaves for the listener
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("pglogical://s", "public.orders")]
    (out,) = lineage.outputs
    assert (out.namespace, out.name) == ("postgres://warehouse:5432", "dw.public.orders")
    assert out.outputFacets["outputStatistics"].rowCount == 3
