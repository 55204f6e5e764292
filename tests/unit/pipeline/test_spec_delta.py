"""Pipeline spec: the delta target kind — uri, mode, storage options without secrets, partition columns."""

from __future__ import annotations

import copy

from airflow_provider_pglogical.apply.targets.delta.target import MODES
from airflow_provider_pglogical.pipeline.spec import DELTA_MODES, parse_spec
from tests.unit.pipeline.test_spec import VALID, error_of

DELTA = {"kind": "delta", "uri": "s3://lake/cdc", "mode": "changelog", "conn_id": "aws_lake",
         "storage_options": {"AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": True},
         "partition_by": {"public.orders_eu": ["region"]}}


def delta_doc(**target) -> dict:
    doc = copy.deepcopy(VALID)
    doc["target"] = {**DELTA, **target}
    return doc


def test_a_delta_target_validates_into_its_dataclass():
    spec = parse_spec(delta_doc(), env={})
    assert (spec.target.kind, spec.target.uri, spec.target.mode, spec.target.conn_id) == \
        ("delta", "s3://lake/cdc", "changelog", "aws_lake")
    assert spec.target.storage_options == {"AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true"}
    assert spec.target.partition_by == {"public.orders_eu": ("region",)}
    assert parse_spec(delta_doc(mode=None), env={}).target.mode == "mirror"


def test_the_spec_modes_are_the_targets_modes():
    assert DELTA_MODES == MODES


def test_credentials_in_storage_options_are_refused_without_echoing_them():
    message = error_of(delta_doc(storage_options={"AWS_SECRET_ACCESS_KEY": "hunter2"}))
    assert "target.storage_options.AWS_SECRET_ACCESS_KEY: credentials come from the environment" in message
    assert "hunter2" not in message


def test_delta_settings_that_cannot_work_are_reported_with_their_paths():
    doc = delta_doc(dsn="postgresql://x", mode="upsert", partition_by={"public.nope": ["a"],
                                                                         "public.orders_eu": ["secret"]})
    doc["tables"]["public.customers"] = {"conflict": "strict"}
    message = error_of(doc)
    assert "target.dsn: a delta target has a uri, not a dsn" in message
    assert "target.mode: must be one of mirror, changelog" in message
    assert "target.partition_by.public.nope: is not the target of any table" in message
    assert "target.partition_by.public.orders_eu: partition columns must be among" in message
    assert "tables.public.customers.conflict: strict is not supported by a delta target" in message
    assert "target.uri: " in error_of(delta_doc(uri=None))


def test_delta_keys_on_a_postgres_target_are_refused():
    doc = copy.deepcopy(VALID)
    doc["target"]["mode"] = "mirror"
    assert "target.mode: only for kind: delta" in error_of(doc)


def test_a_delta_pipeline_dag_applies_in_process_and_needs_no_target_connection():
    from datetime import datetime

    from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag
    from airflow_provider_pglogical.pipeline.operators import DeltaApplyOperator
    from tests.unit.pipeline.test_dag_factory import DOC

    doc = copy.deepcopy(DOC)
    doc["target"] = {"kind": "delta", "uri": "s3://lake/cdc"}
    dag = build_pipeline_dag(parse_spec(doc, env={}), dag_id="d", start_date=datetime(2026, 1, 1))
    apply = dag.get_task("pglogical.apply")
    assert isinstance(apply, DeltaApplyOperator) and apply.spec.target.uri == "s3://lake/cdc"
    assert apply.upstream_task_ids == {"pglogical.decode"}


def test_max_merge_rows_reaches_the_delta_target_and_is_checked():
    from airflow_provider_pglogical.pipeline.target import DeltaSpecTarget, spec_target

    handle = spec_target(parse_spec(delta_doc(mode="mirror", max_merge_rows=250_000), env={}))
    assert isinstance(handle, DeltaSpecTarget) and handle.delta_target().max_merge_rows == 250_000
    assert spec_target(parse_spec(delta_doc(), env={})).delta_target().max_merge_rows is None  # type: ignore[attr-defined]
    assert "target.max_merge_rows: must be greater than 0" in error_of(delta_doc(mode="mirror", max_merge_rows=0))
    assert "target.max_merge_rows: only for mode: mirror" in error_of(delta_doc(max_merge_rows=10))
    doc = copy.deepcopy(VALID)
    doc["target"]["max_merge_rows"] = 10
    assert "target.max_merge_rows: only for kind: delta" in error_of(doc)
