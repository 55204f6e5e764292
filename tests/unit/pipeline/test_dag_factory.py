"""The DAG factory turns a spec into the ensure → WAL check → decode → apply chain with UI params."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pglogical.exceptions import ConfirmationRequiredError, SpecError
from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag, build_replay_dag, build_teardown_dag
from airflow_provider_pglogical.pipeline.spec import parse_spec

EXAMPLE = Path(__file__).resolve().parents[3] / "dags" / "specs" / "example_pipeline.yaml"
DOC = {
    "source": {"conn_id": "src", "publication": "p", "slot": "s", "max_changes": 500},
    "staging": {"uri": "/tmp/staging"},
    "target": {"kind": "postgres", "conn_id": "dw"},
    "tables": {"public.orders": {"row_filter": "amount > 1", "columns": ["id", "amount"], "target": "public.o"}},
}


def test_the_pipeline_dag_chains_snapshot_ensure_check_decode_apply_and_prune_in_one_group():
    dag = build_pipeline_dag(parse_spec(DOC, env={}), dag_id="d", schedule=timedelta(hours=1),
                             start_date=datetime(2026, 1, 1))
    chain = ["pglogical.snapshot", "pglogical.ensure_replication", "pglogical.check_wal_retention", "pglogical.decode",
             "pglogical.apply", "pglogical.prune_staging"]
    assert [t.task_id for t in dag.topological_sort() if t.task_id != "pglogical.check_slot_health"] == chain
    for upstream, downstream in zip(chain, chain[1:], strict=False):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}


def test_the_slot_health_check_runs_beside_the_chain_with_the_specs_thresholds_and_the_alert_callback():
    def page_someone(context):
        pass

    doc = copy.deepcopy(DOC)
    doc["source"].update(max_lag_bytes="10GB", min_safe_wal_bytes="1GB")
    dag = build_pipeline_dag(parse_spec(doc, env={}), dag_id="d", start_date=datetime(2026, 1, 1),
                             alert_callback=page_someone)
    health = dag.get_task("pglogical.check_slot_health")
    # Beside decode → apply, not after it: a leaf of its own, so a failed decode still fails the DAG run.
    assert health.upstream_task_ids == {"pglogical.ensure_replication"} and not health.downstream_task_ids
    assert (health.slot, health.postgres_conn_id, health.max_lag_bytes) == ("s", "src", 10 << 30)
    assert "min_safe_wal_bytes" in health.min_safe_wal_bytes and dag.params["min_safe_wal_bytes"] == 1 << 30
    assert health.on_failure_callback == [page_someone]
    assert dag.get_task("pglogical.check_wal_retention").on_failure_callback == [page_someone]


def test_the_default_alert_logs_one_error_line_naming_the_task_and_the_reason(caplog):
    from types import SimpleNamespace

    from airflow_provider_pglogical.exceptions import SlotWalRetentionError
    from airflow_provider_pglogical.operators.slot_health import log_slot_alert

    error = SlotWalRetentionError("replication slot 's' can lose WAL after 5 more bytes")
    with caplog.at_level("ERROR"):
        log_slot_alert({"ti": SimpleNamespace(dag_id="d", task_id="pglogical.check_slot_health"), "exception": error})
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("pglogical alert: d.pglogical.check_slot_health failed: replication slot 's' can lose WAL")


def test_the_pipeline_dag_runs_one_at_a_time_without_catchup_and_offers_the_limits_as_params():
    dag = build_pipeline_dag(parse_spec(DOC, env={}), dag_id="d", start_date=datetime(2026, 1, 1))
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert dag.params["max_changes"] == 500
    assert set(dag.params) == {"max_changes", "max_wal_bytes", "min_safe_wal_bytes", "resync_tables"}


def test_the_decode_task_reads_the_slot_as_the_spec_says_and_a_misspelt_read_is_refused():
    def decode(doc: dict[str, Any]) -> Any:
        return build_pipeline_dag(parse_spec(doc, env={}), dag_id="d", start_date=datetime(2026, 1, 1)).get_task(
            "pglogical.decode")

    assert decode(DOC).read == "sql"
    stream = decode({**DOC, "source": {**DOC["source"], "read": "stream"}})
    assert stream.read == "stream"
    with pytest.raises(SpecError, match=r"source\.read: must be one of sql, stream, got 'streaming'"):
        parse_spec({**DOC, "source": {**DOC["source"], "read": "streaming"}}, env={})


def test_the_snapshot_task_reads_resync_tables_from_the_param_and_refuses_unknown_tables():
    from airflow_provider_pglogical.exceptions import SpecError
    from airflow_provider_pglogical.pipeline.operators import SnapshotTablesOperator

    spec = parse_spec(DOC, env={})
    for value, expected in (("[]", []), ('["public.orders"]', ["public.orders"]), (None, []),
                            (["public.orders"], ["public.orders"])):
        assert SnapshotTablesOperator(task_id="x", spec=spec, resync_tables=value).tables_to_resync() == expected
    with pytest.raises(SpecError, match="public.nope"):
        SnapshotTablesOperator(task_id="y", spec=spec, resync_tables='["public.nope"]').tables_to_resync()


def test_decode_and_apply_get_the_specs_slot_staging_connections_and_tables():
    dag = build_pipeline_dag(parse_spec(DOC, env={}), dag_id="d", start_date=datetime(2026, 1, 1))
    decode, apply = dag.get_task("pglogical.decode"), dag.get_task("pglogical.apply")
    assert (decode.slot, decode.publication, decode.staging_uri, decode.postgres_conn_id) == ("s", "p", "/tmp/staging",
                                                                                             "src")
    assert [o.uri for o in decode.outlets] == ["pglogical://s/public.orders"]
    assert (apply.slot, apply.staging_uri, apply.target_conn_id) == ("s", "/tmp/staging", "dw")
    assert apply.tables["public.orders"]["row_filter"] == "amount > 1"
    assert apply.tables["public.orders"]["target"] == "public.o"


def test_the_postgres_apply_applies_in_the_worker_unless_the_spec_turns_it_off():
    on = build_pipeline_dag(parse_spec(DOC, env={}), dag_id="d", start_date=datetime(2026, 1, 1))
    off = build_pipeline_dag(parse_spec({**DOC, "spark": {"apply_in_worker": False}}, env={}), dag_id="d",
                             start_date=datetime(2026, 1, 1))
    assert on.get_task("pglogical.apply").apply_in_worker is True
    assert off.get_task("pglogical.apply").apply_in_worker is False
    with pytest.raises(SpecError, match="spark.apply_in_worker: expected true or false"):
        parse_spec({**DOC, "spark": {"apply_in_worker": "no"}}, env={})


def test_dag_kwargs_override_the_factory_defaults():
    dag = build_pipeline_dag(parse_spec(DOC, env={}), dag_id="d", start_date=datetime(2026, 1, 1), max_active_runs=2,
                             tags=["mine"])
    assert dag.max_active_runs == 2 and dag.tags == {"mine"}


def test_a_spec_with_dsns_cannot_become_a_dag():
    doc = copy.deepcopy(DOC)
    doc["source"] = {"dsn": "postgresql://x/y", "publication": "p", "slot": "s"}
    with pytest.raises(SpecError, match="source: Airflow DAGs need source.conn_id instead of source.dsn"):
        build_pipeline_dag(parse_spec(doc, env={}), dag_id="d")


def test_a_task_for_a_spec_section_given_by_dsn_is_refused_when_built_alone():
    from airflow_provider_pglogical.pipeline.dag_factory import apply_task, decode_task

    doc = copy.deepcopy(DOC)
    doc["source"] = {"dsn": "postgresql://x/y", "publication": "p", "slot": "s"}
    doc["target"] = {"kind": "postgres", "dsn": "postgresql://x/z"}
    spec = parse_spec(doc, env={})
    with pytest.raises(SpecError, match="source: Airflow DAGs need source.conn_id instead of source.dsn"):
        decode_task(spec)
    with pytest.raises(SpecError, match="target: Airflow DAGs need target.conn_id instead of target.dsn"):
        apply_task(spec)


def test_the_replay_dag_plans_resets_then_applies_a_bounded_number_of_batches():
    dag = build_replay_dag(EXAMPLE, dag_id="r", start_date=datetime(2026, 1, 1))
    assert [t.task_id for t in dag.topological_sort()] == ["plan_replay", "reset_target", "replay"]
    assert set(dag.params) == {"upto_lsn", "upto_time", "reset"}
    assert dag.schedule is None or str(dag.timetable.summary) in ("None", "Never")


def test_the_teardown_dag_is_manual_and_its_drop_refuses_without_the_slot_name():
    dag = build_teardown_dag(EXAMPLE, dag_id="t", start_date=datetime(2026, 1, 1))
    assert [t.task_id for t in dag.topological_sort()] == ["drop_pipeline"]
    assert set(dag.params) == {"confirm", "staging", "dry_run"} and dag.params["confirm"] == ""
    assert dag.schedule is None or str(dag.timetable.summary) in ("None", "Never")
    drop = dag.get_task("drop_pipeline")
    assert drop.retries == 0  # a refused or failed drop is for a person to look at, not to retry
    for confirm in ("", "other", "app_slot2"):
        drop.confirm = confirm
        with pytest.raises(ConfirmationRequiredError, match="confirm set to 'app_slot'"):
            drop.execute({})
@pytest.mark.parametrize("kind", ["postgres", "delta"])
@pytest.mark.parametrize("spark", [{"connect_conn_id": "spark_connect_default"}, {"remote": "sc://spark:15002"}])
def test_a_spec_reaching_spark_connect_applies_as_a_client_in_the_worker_instead_of_spark_submit(spark, kind):
    """For every target: a lake target's Spark work runs on the Connect server too, delta-rs commits in the worker."""
    from airflow_provider_pglogical.pipeline.operators import SparkConnectApplyOperator

    doc = copy.deepcopy(DOC)
    doc["spark"] = spark
    if kind == "delta":
        doc["target"] = {"kind": "delta", "uri": "/tmp/lake"}
    dag = build_pipeline_dag(parse_spec(doc, env={}), dag_id="d", start_date=datetime(2026, 1, 1))
    apply = dag.get_task("pglogical.apply")
    assert isinstance(apply, SparkConnectApplyOperator)
    assert apply.connect_conn_id == spark.get("connect_conn_id")
    if "remote" in spark:
        assert apply.remote_url() == "sc://spark:15002"
    assert [o.uri for o in apply.outlets]  # the target tables' assets, as the spark-submit task has them


@pytest.mark.parametrize("spark", [None, {"master": "spark://spark:7077"}])
def test_a_lake_target_of_a_spec_naming_no_spark_connection_applies_in_the_worker(spark):
    from airflow_provider_pglogical.pipeline.operators import DeltaApplyOperator

    doc = copy.deepcopy(DOC)
    doc["target"] = {"kind": "delta", "uri": "/tmp/lake"}
    if spark:
        doc["spark"] = spark
    apply = build_pipeline_dag(parse_spec(doc, env={}), dag_id="d").get_task("pglogical.apply")
    assert type(apply) is DeltaApplyOperator


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_lake_target_of_a_spec_naming_a_spark_connection_is_submitted_with_the_spec_file(tmp_path, kind):
    """``spark.conn_id``: spark-submit of the spec app on that connection (the apply runs where that Spark runs), its
    arguments naming the spec file, one target of ``targets:``, the batch limit, and never a credential."""
    import yaml

    from airflow_provider_pglogical.pipeline.operators import SPEC_APPLICATION, SpecSubmitApplyOperator
    from airflow_provider_pglogical.pipeline.spec import load_spec

    lake = ({"kind": "delta", "uri": str(tmp_path / "lake"), "conn_id": "aws_lake"} if kind == "delta" else
            {"kind": "iceberg", "catalog": {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db",
                                            "warehouse": str(tmp_path / "wh")}, "conn_id": "aws_lake"})
    doc = {**copy.deepcopy(DOC), "spark": {"conn_id": "spark_cluster", "conf": {"spark.executor.memory": "2g"}},
           "targets": {"lake": {**lake, "tables": DOC["tables"]}}}
    del doc["target"], doc["tables"]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    dag = build_pipeline_dag(load_spec(path), dag_id="d")
    apply = dag.get_task("pglogical.apply_lake")
    assert isinstance(apply, SpecSubmitApplyOperator)
    assert apply.application == SPEC_APPLICATION and SPEC_APPLICATION.endswith("apply_spec.py")
    assert apply.spark_conn_id == "spark_cluster" and apply.conf == {"spark.executor.memory": "2g"}
    apply.max_batches = "3"
    assert apply.application_arguments(tmp_path / "summary.json") == [
        "--spec", str(path.resolve()), "--summary-file", str(tmp_path / "summary.json"), "--target", "lake",
        "--max-batches", "3", "--credentials-from-env"]
    replay = build_replay_dag(load_spec(path), dag_id="r").get_task("replay_lake")
    assert isinstance(replay, SpecSubmitApplyOperator) and replay.target_name == "lake"


def test_a_spark_submit_apply_needs_the_spec_from_its_file():
    doc = copy.deepcopy(DOC)
    doc["target"] = {"kind": "delta", "uri": "/tmp/lake"}
    doc["spark"] = {"conn_id": "spark_default"}
    with pytest.raises(SpecError, match="reads the spec from its file; build the DAG from the spec's path"):
        build_pipeline_dag(parse_spec(doc, env={}), dag_id="d")


def test_the_spec_app_applies_the_named_target_of_a_targets_spec_and_refuses_an_unknown_one():
    from airflow_provider_pglogical.pipeline.spec_app import one_target

    doc = {**copy.deepcopy(DOC), "targets": {"a": {"kind": "delta", "uri": "/tmp/a", "tables": DOC["tables"]},
                                             "b": {"kind": "delta", "uri": "/tmp/b", "tables": DOC["tables"]}}}
    del doc["target"], doc["tables"]
    spec = parse_spec(doc, env={})
    assert one_target(spec, "b").target.uri == "/tmp/b" and not one_target(spec, "b").targets
    assert one_target(spec, None) is spec
    with pytest.raises(SpecError, match="--target c: no such target; the spec's targets: a, b"):
        one_target(spec, "c")
