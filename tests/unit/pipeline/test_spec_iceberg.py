"""Pipeline spec and handle: the iceberg target kind — catalog properties without secrets, namespace, mode."""

from __future__ import annotations

import copy
from datetime import datetime

import pytest

from airflow_provider_pglogical.apply.targets.iceberg.catalog import CATALOG_TYPES
from airflow_provider_pglogical.apply.targets.iceberg.target import MODES
from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.pipeline.model import ICEBERG_CATALOGS, ICEBERG_MODES
from airflow_provider_pglogical.pipeline.spec import parse_spec
from airflow_provider_pglogical.pipeline.target import IcebergSpecTarget, spec_target
from tests.unit.pipeline.test_spec import VALID, error_of

ICEBERG = {"kind": "iceberg", "catalog": {"type": "sql", "uri": "sqlite:///${LAKE}/catalog.db",
                                          "warehouse": "${LAKE}/warehouse"},
           "namespace": "cdc", "mode": "changelog", "partition_by": {"public.orders_eu": ["region"]}}


def iceberg_doc(**target) -> dict:
    doc = copy.deepcopy(VALID)
    doc["target"] = {**copy.deepcopy(ICEBERG), **target}
    return doc


def test_an_iceberg_target_validates_into_its_dataclass():
    spec = parse_spec(iceberg_doc(), env={"LAKE": "/lake"})
    assert (spec.target.kind, spec.target.namespace, spec.target.mode) == ("iceberg", "cdc", "changelog")
    assert spec.target.catalog == {"type": "sql", "uri": "sqlite:////lake/catalog.db", "warehouse": "/lake/warehouse"}
    assert spec.target.partition_by == {"public.orders_eu": ("region",)}
    rest = parse_spec(iceberg_doc(catalog={"type": "rest", "uri": "https://catalog:8181", "warehouse": "lake"},
                                  namespace=None, mode=None), env={})
    assert rest.target.catalog["type"] == "rest" and rest.target.mode == "mirror" and rest.target.namespace is None


def test_the_spec_vocabulary_is_the_targets():
    assert ICEBERG_MODES == MODES and ICEBERG_CATALOGS == CATALOG_TYPES


def test_credentials_in_catalog_properties_are_refused_without_echoing_them():
    message = error_of(iceberg_doc(catalog={"type": "rest", "uri": "https://c", "credential": "id:hunter2",
                                            "s3.secret-access-key": "hunter3"}))
    assert "target.catalog.credential: credentials come from the environment or conn_id" in message
    assert "target.catalog.s3.secret-access-key: credentials come from the environment" in message
    assert "hunter2" not in message and "hunter3" not in message


def test_iceberg_settings_that_cannot_work_are_reported_with_their_paths():
    doc = iceberg_doc(uri="s3://x", dsn="postgresql://x", mode="upsert", catalog={"type": "hive"})
    doc["tables"]["public.customers"] = {"conflict": "strict"}
    message = error_of(doc)
    assert "target.uri: an iceberg target's tables are found through its catalog" in message
    assert "target.dsn: an iceberg target has a catalog, not a dsn" in message
    assert "target.mode: must be one of mirror, changelog" in message
    assert "target.catalog.type: must be one of sql, rest, got 'hive'" in message
    assert "tables.public.customers.conflict: strict is not supported by a iceberg target" in message
    assert "target.catalog: required key is missing" in error_of(iceberg_doc(catalog=None))
    assert "target.catalog.warehouse: required key is missing" in error_of(iceberg_doc(catalog={"type": "sql",
                                                                                               "uri": "sqlite://"}))
    postgres = copy.deepcopy(VALID)
    postgres["target"]["namespace"] = "cdc"
    assert "target.namespace: only for kind: iceberg" in error_of(postgres)


def test_the_iceberg_handle_applies_in_the_worker_and_refuses_what_it_cannot_do():
    handle = spec_target(parse_spec(iceberg_doc(), env={"LAKE": "/lake"}))
    assert isinstance(handle, IcebergSpecTarget) and handle.kind == "iceberg"
    assert handle.applies_in_worker and not handle.needs_conn_id and handle.early_spark_start
    with pytest.raises(SpecError, match="resync of public.orders: a iceberg target loads snapshots in mode: mirror"):
        handle.check_resync(["public.orders"])
    with pytest.raises(SpecError, match="reset of an iceberg target is not supported; point target.namespace"):
        handle.reset()
    assert handle.drop_bookkeeping()["rows"] == {}


def test_an_iceberg_pipeline_dag_applies_in_process_and_needs_no_target_connection():
    from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag
    from airflow_provider_pglogical.pipeline.operators import DeltaApplyOperator
    from tests.unit.pipeline.test_dag_factory import DOC

    doc = copy.deepcopy(DOC)
    doc["target"] = {"kind": "iceberg", "catalog": {"type": "sql", "uri": "sqlite:////lake/c.db",
                                                    "warehouse": "/lake/w"}}
    dag = build_pipeline_dag(parse_spec(doc, env={}), dag_id="d", start_date=datetime(2026, 1, 1))
    apply = dag.get_task("pglogical.apply")
    assert isinstance(apply, DeltaApplyOperator) and apply.spec.target.kind == "iceberg"
