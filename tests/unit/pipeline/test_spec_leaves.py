"""Pipeline spec: ``leaves: route_to_root`` on a partitioned table's entry — validated, carried to the apply,
and its leaves kept out of ``"*"`` / ``schema.*`` selections."""

from __future__ import annotations

from airflow_provider_pglogical.pipeline.spec import parse_spec
from tests.unit.pipeline.test_spec import VALID, error_of, with_change
from tests.unit.pipeline.test_spec_delta import delta_doc


def test_leaves_is_a_choice_carried_to_the_apply_config():
    from airflow_provider_pglogical.pipeline.runs import apply_config

    spec = parse_spec(with_change("tables/public.meas", {"leaves": "route_to_root", "target": "dw.meas"}), env={})
    assert spec.tables["public.meas"].leaves == "route_to_root"
    assert spec.tables["public.customers"].leaves == "own"
    cfg = apply_config(spec).tables["public.meas"]
    assert (cfg.leaves, cfg.target, cfg.partition_of) == ("route_to_root", "dw.meas", None)
    assert "tables.public.meas.leaves: must be one of own, route_to_root, got 'root'" in error_of(
        with_change("tables/public.meas", {"leaves": "root"}))


def test_leaves_is_refused_on_selections_and_for_a_delta_target():
    assert "tables.*.leaves: only for a named partitioned table" in error_of(
        with_change("tables/*", {"leaves": "route_to_root"}))
    doc = delta_doc()
    doc["tables"]["public.meas"] = {"leaves": "route_to_root"}
    assert "tables.public.meas.leaves: route_to_root is only for target kind: postgres" in error_of(doc)


def test_a_selection_leaves_the_routed_leaves_to_their_root():
    from airflow_provider_pglogical.pipeline.source import resolve

    doc = with_change("tables/*", {})
    doc["tables"]["public.meas"] = {"leaves": "route_to_root"}
    spec = parse_spec(doc, env={})
    got = resolve(spec, {"public.meas_eu", "public.meas_us", "public.other"}, routed={"public.meas_eu", "public.meas_us"})
    assert sorted(got.tables) == ["public.customers", "public.meas", "public.orders", "public.other"]
    assert sorted(resolve(spec, {"public.meas_eu"}).tables) == sorted([*VALID["tables"], "public.meas", "public.meas_eu"])


def test_the_snapshot_job_snapshots_the_routing_entries_leaves():
    """Initial snapshot, added tables and ``pglogical resync`` share ``snapshot_job``: it names the routing entries."""
    from airflow_provider_pglogical.pipeline.snapshots import snapshot_job

    doc = with_change("tables/public.meas", {"leaves": "route_to_root", "row_filter": "id > 1"})
    job = snapshot_job(parse_spec(doc, env={}))
    assert job.routing == ("public.meas",) and job.tables["public.meas"] == (None, "id > 1")
