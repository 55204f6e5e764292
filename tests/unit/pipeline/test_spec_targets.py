"""Pipeline spec: several named targets from one slot (``targets:``) beside the one ``target:``."""

from __future__ import annotations

import copy
from datetime import datetime

import pytest
import yaml

from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.pipeline.model import DEFAULT_TARGET
from airflow_provider_pglogical.pipeline.spec import load_spec, parse_spec
from airflow_provider_pglogical.pipeline.target import IcebergSpecTarget, PostgresSpecTarget, spec_target, spec_targets
from tests.unit.pipeline.test_spec import VALID, error_of

LAKE = {"kind": "iceberg", "catalog": {"type": "sql", "uri": "sqlite:////lake/catalog.db",
                                       "warehouse": "/lake/warehouse"}, "namespace": "cdc"}


def two_targets() -> dict:
    doc = copy.deepcopy(VALID)
    del doc["target"], doc["tables"]
    doc["targets"] = {
        "reporting": {"kind": "postgres", "dsn": "postgresql://loader@warehouse:5432/dw",
                      "tables": {"public.orders": {"row_filter": "amount > 100", "columns": ["id", "amount"]},
                                 "public.customers": {}}},
        "lake": {**copy.deepcopy(LAKE), "tables": {"public.orders": {"row_filter": "region = 'EU'"},
                                                   "public.items": {}}},
    }
    return doc


def test_the_single_target_form_is_one_target_named_default():
    spec = parse_spec(VALID, env={})
    assert spec.targets == {} and spec.target_names == (DEFAULT_TARGET,)
    assert spec.target_views() == {DEFAULT_TARGET: spec}
    assert isinstance(spec_targets(spec)[DEFAULT_TARGET], PostgresSpecTarget)


def test_each_named_target_has_its_own_selection_and_the_decode_sees_the_union():
    spec = parse_spec(two_targets(), env={})
    assert spec.target_names == ("reporting", "lake")
    views = spec.target_views()
    reporting, lake = views["reporting"], views["lake"]
    assert (reporting.target.kind, lake.target.kind) == ("postgres", "iceberg")
    assert sorted(reporting.tables) == ["public.customers", "public.orders"]
    assert sorted(lake.tables) == ["public.items", "public.orders"]
    assert reporting.tables["public.orders"].row_filter == "amount > 100"
    assert reporting.tables["public.orders"].columns == ("id", "amount")
    assert lake.tables["public.orders"].row_filter == "region = 'EU'" and lake.tables["public.orders"].columns is None
    # A view is a one-target spec: source, staging and slot shared, no targets of its own.
    assert reporting.targets == {} and reporting.source == spec.source and reporting.staging == spec.staging
    # The staging holds every table any target needs; a table filtered differently is staged whole.
    assert sorted(spec.tables) == ["public.customers", "public.items", "public.orders"]
    assert spec.tables["public.orders"].row_filter is None and spec.tables["public.orders"].columns is None
    handles = spec_targets(spec)
    assert isinstance(handles["reporting"], PostgresSpecTarget) and isinstance(handles["lake"], IcebergSpecTarget)
    assert [name for name, h in handles.items() if h.maintainable] == ["lake"]  # what `maintain` compacts
    assert spec.target_views(("lake",)).keys() == {"lake"}


def test_a_table_every_target_filters_alike_keeps_its_filter_in_the_union():
    doc = two_targets()
    doc["targets"]["lake"]["tables"]["public.orders"] = {"row_filter": "amount > 100", "columns": ["id", "amount"]}
    spec = parse_spec(doc, env={})
    assert spec.tables["public.orders"].row_filter == "amount > 100"
    assert spec.tables["public.orders"].columns == ("id", "amount")


def test_one_question_for_several_targets_is_refused_rather_than_answered_by_the_first():
    spec = parse_spec(two_targets(), env={})
    with pytest.raises(SpecError, match=r"2 targets \(reporting, lake\); this step takes one of them"):
        spec_target(spec)


def test_errors_in_a_named_target_carry_its_path():
    doc = two_targets()
    doc["targets"]["lake"]["tables"]["public.items"] = {"conflict": "strict"}
    doc["targets"]["lake"]["catalog"]["type"] = "hive"
    doc["targets"]["reporting"]["tables"]["public.orders"]["actions"] = ["upsert"]
    doc["targets"]["reporting"]["mode"] = "mirror"
    message = error_of(doc)
    assert "targets.lake.tables.public.items.conflict: strict is not supported by a iceberg target" in message
    assert "targets.lake.catalog.type: must be one of sql, rest" in message
    assert "targets.reporting.tables.public.orders.actions" in message
    assert "targets.reporting.mode: only for kind: delta or iceberg" in message


def test_target_names_and_the_two_forms_are_checked():
    doc = two_targets()
    doc["targets"]["Bad-Name"] = doc["targets"].pop("lake")
    assert "targets.Bad-Name: a target name is 1-63 characters from a-z, 0-9 and '_'" in error_of(doc)
    both = two_targets()
    both["target"] = copy.deepcopy(VALID["target"])
    both["tables"] = {"public.orders": {}}
    message = error_of(both)
    assert "target: with targets:, each target has its own; give one or the other" in message
    assert "tables: with targets:, each target has its own tables and schemas" in message
    neither = copy.deepcopy(VALID)
    del neither["target"]
    assert "target: required key is missing (or targets:" in error_of(neither)
    assert "targets: expected a mapping of target names to targets, got a list" in error_of({**two_targets(),
                                                                                            "targets": []})
    no_tables = two_targets()
    del no_tables["targets"]["lake"]["tables"]
    assert "targets.lake.tables: required key is missing" in error_of(no_tables)


def test_two_targets_writing_to_one_place_are_refused():
    doc = two_targets()
    doc["targets"]["copy"] = copy.deepcopy(doc["targets"]["reporting"])
    assert ("targets.copy: writes where targets.reporting writes; each target needs a place of its own"
            in error_of(doc))


def test_a_target_name_given_twice_in_a_spec_file_is_an_error_not_the_last_one(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("""
source: {dsn: "postgresql://r@db/app", publication: app_pub, slot: app_slot}
staging: {uri: /tmp/staging}
targets:
  reporting: {kind: postgres, dsn: "postgresql://l@w/dw", tables: {public.orders: {}}}
  reporting: {kind: postgres, dsn: "postgresql://l@w/dw2", tables: {public.items: {}}}
""")
    with pytest.raises(SpecError, match=r"p.yaml: key 'reporting' is given twice in one mapping \(line 6\)"):
        load_spec(path, env={})


def test_an_unknown_target_name_on_the_command_line_names_the_specs_targets():
    from airflow_provider_pglogical.pipeline.fanout import select_views

    spec = parse_spec(two_targets(), env={})
    assert list(select_views(spec, ["lake"])) == ["lake"]
    assert list(select_views(spec, None)) == ["reporting", "lake"]
    with pytest.raises(SpecError, match=r"--target nope: no such target; the spec's targets: reporting, lake"):
        select_views(spec, ["nope"])
    single = parse_spec(VALID, env={})
    assert list(select_views(single, ["default"])) == ["default"]
    with pytest.raises(SpecError, match=r"--target lake: no such target; the spec's targets: default"):
        select_views(single, ["lake"])


def test_the_pipeline_dag_applies_each_target_in_parallel_after_the_one_decode():
    from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag, build_replay_dag

    doc = two_targets()
    doc["source"] = {"conn_id": "src", "publication": "p", "slot": "s"}
    doc["targets"]["reporting"] = {**{k: v for k, v in doc["targets"]["reporting"].items() if k != "dsn"},
                                   "conn_id": "dw"}
    spec = parse_spec(doc, env={})
    dag = build_pipeline_dag(spec, dag_id="d", start_date=datetime(2026, 1, 1))
    reporting, lake = dag.get_task("pglogical.apply_reporting"), dag.get_task("pglogical.apply_lake")
    for apply in (reporting, lake):
        assert apply.upstream_task_ids == {"pglogical.decode"}
        assert apply.downstream_task_ids == {"pglogical.prune_staging"}
    assert dag.get_task("pglogical.prune_staging").upstream_task_ids == {"pglogical.apply_reporting",
                                                                        "pglogical.apply_lake"}
    assert "pglogical.apply" not in dag.task_dict
    # Each apply writes its own target's tables with its own filters; the decode stages the union.
    assert reporting.target_conn_id == "dw" and reporting.tables["public.orders"]["row_filter"] == "amount > 100"
    assert sorted(reporting.tables) == ["public.customers", "public.orders"]
    assert lake.spec.target.kind == "iceberg" and sorted(lake.spec.tables) == ["public.items", "public.orders"]
    assert {o.uri for o in reporting.outlets} == {"pglogical://s/target/postgres%2Fdw/public.orders",
                                                  "pglogical://s/target/postgres%2Fdw/public.customers"}
    assert {o.uri for o in dag.get_task("pglogical.decode").outlets} == {
        "pglogical://s/public.orders", "pglogical://s/public.customers", "pglogical://s/public.items"}
    replay = build_replay_dag(spec, dag_id="r", start_date=datetime(2026, 1, 1))
    assert replay.get_task("replay_lake").upstream_task_ids == {"plan_replay", "reset_target_lake"}
    assert replay.get_task("reset_target_reporting").upstream_task_ids == {"plan_replay"}


def test_a_dag_of_several_targets_names_the_one_whose_conn_id_is_missing():
    from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag

    doc = two_targets()
    doc["source"] = {"conn_id": "src", "publication": "p", "slot": "s"}
    with pytest.raises(SpecError, match=r"targets.reporting: Airflow DAGs need targets.reporting.conn_id"):
        build_pipeline_dag(parse_spec(doc, env={}), dag_id="d", start_date=datetime(2026, 1, 1))


def test_reset_of_a_spec_with_several_targets_names_the_one_to_reset(tmp_path, capsys):
    import yaml

    from airflow_provider_pglogical.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(two_targets(), sort_keys=False))
    assert main(["reset", "--spec", str(path), "--yes"]) == 1
    assert ("reset empties one target's tables; name it with --target (reporting, lake)"
            in capsys.readouterr().err)
    assert main(["reset", "--spec", str(path), "--yes", "--target", "nope"]) == 1
    assert "--target nope: no such target; the spec's targets: reporting, lake" in capsys.readouterr().err


def test_the_report_names_every_targets_kind():
    from airflow_provider_pglogical.history.health import Thresholds
    from airflow_provider_pglogical.pipeline.monitoring import current_state

    doc = two_targets()
    doc["source"]["dsn"] = "postgresql://replicator@127.0.0.1:1/app"  # refused at once: the report goes on
    state = current_state(parse_spec(doc, env={}), [], Thresholds())
    assert state["target"] == "reporting: postgres, lake: iceberg"


def test_two_targets_the_staging_area_would_record_as_one_are_refused_before_anything_is_recorded(tmp_path):
    from airflow_provider_pglogical.pipeline.retention import prune
    from airflow_provider_pglogical.staging.layout import StagingLayout
    from airflow_provider_pglogical.staging.retention import positions

    doc = copy.deepcopy(VALID)
    del doc["target"], doc["tables"]
    doc["staging"] = {"uri": str(tmp_path / "staging"), "retention": {"keep_batches": 1}}
    # One catalog database, each table in its own schema's namespace: the same Iceberg tables, whatever the
    # warehouse (the catalog database says where a table is).
    doc["targets"] = {name: {"kind": "iceberg", "catalog": {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db",
                                                            "warehouse": str(tmp_path / name)},
                             "tables": {"public.orders": {}}} for name in ("eu", "us")}
    spec = parse_spec(doc, env={})
    with pytest.raises(SpecError, match=rf"targets eu and us are both recorded as iceberg/sqlite:///{tmp_path}/cat.db/\* "
                                        "in the staging area"):
        prune(spec)
    assert positions(StagingLayout.from_uri(spec.staging.uri, spec.source.slot)) == {}


def test_a_target_that_cannot_answer_keeps_every_batch_while_the_others_positions_are_recorded(tmp_path):
    import pyarrow as pa

    from airflow_provider_pglogical.pipeline.retention import prune
    from airflow_provider_pglogical.staging.layout import StagingLayout
    from airflow_provider_pglogical.staging.retention import positions
    from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch

    orders = Rel("public", "orders", (Col("id", pa.int32(), "int4", identity=True),))
    for i in range(3):
        write_batch(tmp_path / "staging", "app_slot",
                    BatchSpec(0x1000 * (i + 1), 0x1000 * (i + 2), {orders: [Chg("I", 0x1000 * (i + 1), 0, {"id": i})]}))
    doc = copy.deepcopy(VALID)
    del doc["target"], doc["tables"]
    doc["staging"] = {"uri": str(tmp_path / "staging"), "retention": {"keep_batches": 1}}
    doc["targets"] = {
        # Refused at once: how far it applied is unknown.
        "reporting": {"kind": "postgres", "dsn": "postgresql://loader@127.0.0.1:1/dw", "tables": {"public.orders": {}}},
        # Done with every batch: none holds a table it selects.
        "lake": {"kind": "iceberg", "catalog": {"type": "sql", "uri": f"sqlite:///{tmp_path}/lake.db",
                                                 "warehouse": str(tmp_path / "lake")},
                 "tables": {"public.items": {}}},
    }
    spec = parse_spec(doc, env={})
    result = prune(spec)
    assert result["unreachable"] == ["reporting"] and result["pruned_batches"] == 0 and result["kept_batches"] == 3
    assert positions(StagingLayout.from_uri(spec.staging.uri, "app_slot")) == {f"iceberg/sqlite:///{tmp_path}/lake.db/*": 0x4000}
    del doc["targets"]["reporting"]  # without it the lake alone decides: all but the newest batch go
    assert prune(parse_spec(doc, env={}))["pruned_batches"] == 2


def staged_orders(tmp_path, batches: int = 3) -> None:
    import pyarrow as pa

    from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch

    orders = Rel("public", "orders", (Col("id", pa.int32(), "int4", identity=True),))
    for i in range(batches):
        write_batch(tmp_path / "staging", "app_slot",
                    BatchSpec(0x1000 * (i + 1), 0x1000 * (i + 2), {orders: [Chg("I", 0x1000 * (i + 1), 0, {"id": i})]}))


def one_catalog_two_namespaces(tmp_path) -> dict:
    doc = copy.deepcopy(VALID)
    del doc["target"], doc["tables"]
    doc["staging"] = {"uri": str(tmp_path / "staging"), "retention": {"keep_batches": 1}}
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/lake.db", "warehouse": str(tmp_path / "lake")}
    doc["targets"] = {name: {"kind": "iceberg", "catalog": dict(catalog), "namespace": name,
                             "tables": {"public.items": {}}} for name in ("eu", "us")}
    return doc


def test_two_iceberg_targets_of_one_catalog_in_different_namespaces_are_recorded_apart(tmp_path):
    from airflow_provider_pglogical.pipeline.retention import prune
    from airflow_provider_pglogical.staging.layout import StagingLayout
    from airflow_provider_pglogical.staging.retention import positions, recorded_names

    staged_orders(tmp_path)
    spec = parse_spec(one_catalog_two_namespaces(tmp_path), env={})
    result = prune(spec)  # neither selects a table the batches hold: both are done with all of them
    layout = StagingLayout.from_uri(spec.staging.uri, "app_slot")
    eu, us = f"iceberg/sqlite:///{tmp_path}/lake.db/eu", f"iceberg/sqlite:///{tmp_path}/lake.db/us"
    assert positions(layout) == {eu: 0x4000, us: 0x4000} and result["pruned_batches"] == 2
    assert recorded_names(layout) == {eu: "eu", us: "us"}  # what `drop --target` finds a removed target by


def test_a_prune_replaces_the_record_an_earlier_release_kept_under_the_catalogs_conn_id(tmp_path):
    from airflow_provider_pglogical.pipeline.retention import prune
    from airflow_provider_pglogical.staging.layout import StagingLayout
    from airflow_provider_pglogical.staging.retention import positions, record_position

    staged_orders(tmp_path)
    doc = one_catalog_two_namespaces(tmp_path)
    del doc["targets"]["us"]
    spec = parse_spec(doc, env={})
    layout = StagingLayout.from_uri(spec.staging.uri, "app_slot")
    record_position(layout, "iceberg/", 0x2000)  # the former name of the target: it would hold batches forever
    assert prune(spec)["pruned_batches"] == 2
    assert positions(layout) == {f"iceberg/sqlite:///{tmp_path}/lake.db/eu": 0x4000}


def test_an_iceberg_targets_identity_and_location_leave_the_catalog_password_out():
    doc = two_targets()
    doc["targets"]["lake"]["catalog"]["uri"] = "postgresql+psycopg2://cat:s3cret@db:5432/catalog"
    handle = spec_targets(parse_spec(doc, env={}))["lake"]
    assert handle.identity() == handle.location() == "iceberg/postgresql+psycopg2://cat@db:5432/catalog/cdc"


def test_each_targets_location_tells_two_targets_with_tables_of_one_name_apart():
    doc = two_targets()
    doc["targets"]["archive"] = {"kind": "postgres", "dsn": "host=archive port=6432 dbname=old user=x password=y",
                                 "tables": {"public.orders": {}}}
    doc["targets"]["delta"] = {"kind": "delta", "uri": "s3://bucket/delta", "tables": {"public.orders": {}}}
    for container in ("c1", "c2"):  # in abfss:// what precedes @ is the container: part of the place
        doc["targets"][container] = {"kind": "delta", "uri": f"abfss://{container}@acct.dfs.core.windows.net/lake",
                                     "tables": {"public.orders": {}}}
    locations = {name: h.location() for name, h in spec_targets(parse_spec(doc, env={})).items()}
    assert locations == {"reporting": "postgres/warehouse:5432/dw", "lake": "iceberg/sqlite:////lake/catalog.db/cdc",
                         "archive": "postgres/archive:6432/old", "delta": "delta/s3://bucket/delta",
                         "c1": "delta/abfss://c1@acct.dfs.core.windows.net/lake",
                         "c2": "delta/abfss://c2@acct.dfs.core.windows.net/lake"}


def test_the_dags_apply_tasks_of_two_targets_writing_one_table_name_have_their_own_assets():
    from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag

    doc = two_targets()
    doc["source"] = {"conn_id": "src", "publication": "p", "slot": "s"}
    doc["targets"] = {name: {"kind": "postgres", "conn_id": name, "tables": {"public.orders": {}}}
                      for name in ("dw", "mart")}
    dag = build_pipeline_dag(parse_spec(doc, env={}), dag_id="d", start_date=datetime(2026, 1, 1))
    assert [o.uri for o in dag.get_task("pglogical.apply_dw").outlets] == ["pglogical://s/target/postgres%2Fdw/public.orders"]
    assert [o.uri for o in dag.get_task("pglogical.apply_mart").outlets] == [
        "pglogical://s/target/postgres%2Fmart/public.orders"]


def test_a_lake_targets_apply_task_has_its_tables_assets_on_either_route(tmp_path):
    from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag

    doc = two_targets()
    doc["source"] = {"conn_id": "src", "publication": "p", "slot": "s"}
    doc["targets"] = {"dw": {"kind": "postgres", "conn_id": "dw", "tables": {"public.orders": {}}},
                      "delta": {"kind": "delta", "uri": "s3://bucket/delta", "tables": {"public.orders": {}}}}
    expected = ["pglogical://s/target/delta%2Fs3%3A%2F%2Fbucket%2Fdelta/public.orders"]
    in_worker = build_pipeline_dag(parse_spec(doc, env={}), dag_id="d", start_date=datetime(2026, 1, 1))
    assert [o.uri for o in in_worker.get_task("pglogical.apply_delta").outlets] == expected
    doc["spark"] = {"conn_id": "spark_default"}  # the spark-submit route reads the spec from its file
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    submitted = build_pipeline_dag(load_spec(path, env={}), dag_id="d", start_date=datetime(2026, 1, 1))
    task = submitted.get_task("pglogical.apply_delta")
    assert type(task).__name__ == "SpecSubmitApplyOperator" and [o.uri for o in task.outlets] == expected


def test_the_kinds_of_a_specs_targets_come_from_their_handles():
    from airflow_provider_pglogical.pipeline.target import target_kinds

    assert target_kinds(parse_spec(two_targets(), env={})) == {"reporting": "postgres", "lake": "iceberg"}
    assert target_kinds(parse_spec(VALID, env={})) == {DEFAULT_TARGET: "postgres"}


def test_a_prune_names_a_recorded_target_the_spec_lost_with_the_command_that_retires_it(tmp_path):
    from airflow_provider_pglogical.pipeline.retention import prune
    from airflow_provider_pglogical.staging.layout import StagingLayout
    from airflow_provider_pglogical.staging.retention import record_position

    staged_orders(tmp_path)
    spec = parse_spec(one_catalog_two_namespaces(tmp_path), env={})
    layout = StagingLayout.from_uri(spec.staging.uri, "app_slot")
    record_position(layout, "iceberg/old-catalog/us", 0x2000, name="us")  # us before it moved to this catalog
    record_position(layout, "postgres/dw/16384", 0x2000, name="reporting")  # removed from the spec
    lines: list[str] = []
    assert prune(spec, log=lines.append)["held_by"] == ["iceberg/old-catalog/us", "postgres/dw/16384"]
    held = [line for line in lines if line.startswith("staged batches are held")]
    # The spec's us is elsewhere now: retiring by that name would retire it, so the old one is named by identity.
    assert held == [
        f"staged batches are held for target iceberg/old-catalog/us (us), which {spec.origin} does not name; if it is "
        f"retired, forget it with `pglogical drop --spec {spec.origin} --target iceberg/old-catalog/us --yes`",
        f"staged batches are held for target postgres/dw/16384 (reporting), which {spec.origin} does not name; if it "
        f"is retired, forget it with `pglogical drop --spec {spec.origin} --target reporting --yes`"]
