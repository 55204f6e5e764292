"""The spec's target handle (``pipeline/target.py``): one class per kind, asked instead of the kind."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.pipeline import target as targetmod
from airflow_provider_pglogical.pipeline.spec import parse_spec
from airflow_provider_pglogical.pipeline.target import DeltaSpecTarget, PostgresSpecTarget, SpecTarget, spec_target
from tests.unit.pipeline.test_spec import VALID
from tests.unit.pipeline.test_spec_delta import delta_doc


def postgres_spec():
    return parse_spec(copy.deepcopy(VALID), env={})


def test_each_kind_resolves_to_its_handle_without_opening_anything():
    postgres = spec_target(postgres_spec())
    assert isinstance(postgres, PostgresSpecTarget) and postgres.kind == "postgres"
    assert postgres.early_spark_start and postgres.needs_conn_id and not postgres.applies_in_worker
    delta = spec_target(parse_spec(delta_doc(), env={}))
    assert isinstance(delta, DeltaSpecTarget) and delta.kind == "delta"
    assert delta.applies_in_worker and not delta.needs_conn_id


def test_a_delta_target_with_a_conn_id_starts_spark_only_around_the_apply():
    """Its credentials reach this process (and so the JVM) only around the apply."""
    assert not spec_target(parse_spec(delta_doc(), env={})).early_spark_start
    without = parse_spec(delta_doc(), env={})
    without = replace(without, target=replace(without.target, conn_id=None))
    assert spec_target(without).early_spark_start


def test_a_changelog_delta_target_refuses_a_resync_and_a_mirror_accepts_it():
    changelog = spec_target(parse_spec(delta_doc(mode="changelog"), env={}))
    with pytest.raises(SpecError, match="resync of public.orders: a delta target loads snapshots in mode: mirror only"):
        changelog.check_resync(["public.orders"])
    spec_target(parse_spec(delta_doc(mode="mirror"), env={})).check_resync(["public.orders"])
    spec_target(postgres_spec()).check_resync(["public.orders"])


def test_reset_of_a_delta_target_and_maintain_of_a_postgres_target_are_typed_errors():
    with pytest.raises(SpecError, match="reset of a delta target is not supported; point target.uri at a new location"):
        spec_target(parse_spec(delta_doc(), env={})).reset()
    with pytest.raises(SpecError, match="maintain compacts and vacuums Delta and Iceberg tables; the target is postgres"):
        spec_target(postgres_spec()).maintain(retention_hours=168, vacuum=True)


def test_dropping_a_delta_targets_bookkeeping_drops_nothing_and_says_why():
    """Its watermarks are app transactions in each table's log, with the data: they go only with the tables."""
    handle = spec_target(parse_spec(delta_doc(), env={}))
    with handle.exclusive():
        dropped = handle.drop_bookkeeping()
    assert dropped == {"kind": "delta", "rows": {},
                       "note": "the watermarks live in each Delta table's log with its data: nothing separate to drop"}


def test_a_new_kind_is_one_registered_handle(monkeypatch):
    """Registering a handle is all the pipeline side needs: ``spec_target`` finds it by the spec's kind."""
    monkeypatch.setattr(targetmod, "HANDLES", dict(targetmod.HANDLES))

    @targetmod.register("iceberg")
    class IcebergSpecTarget(SpecTarget):
        def watermarks(self) -> dict[str, int]:
            return {}

        def for_apply(self, spark, config):
            raise AssertionError("not asked here")

    spec = postgres_spec()
    spec = replace(spec, target=replace(spec.target, kind="iceberg"))
    handle = spec_target(spec)
    assert isinstance(handle, IcebergSpecTarget) and handle.kind == "iceberg" and handle.sync_marks() == {}
    with pytest.raises(SpecError, match="drop is not supported for a target of kind 'iceberg'"):
        handle.drop_bookkeeping(dry_run=True)


def test_a_kind_without_a_handle_is_a_spec_error_naming_it():
    spec = postgres_spec()
    spec = replace(spec, target=replace(spec.target, kind="hudi"))
    with pytest.raises(SpecError, match="target kind 'hudi' has no pipeline support"):
        spec_target(spec)
