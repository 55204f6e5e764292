"""The apply's session on demand (``apply/spark_on_demand.py``) and the judgement, before anything is staged, of
whether a run will surely need Spark (``direct.may_cover``, ``runs.spark_expected``)."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.apply import direct
from airflow_provider_pglogical.apply.config import ACTIONS, ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand, session_of
from airflow_provider_pglogical.pipeline.runs import spark_expected
from airflow_provider_pglogical.pipeline.spec import parse_spec
from tests.unit.pipeline.test_spec import VALID
from tests.unit.pipeline.test_spec_delta import delta_doc
from tests.unit.pipeline.test_spec_iceberg import iceberg_doc


class _Conf:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _Session:
    """What ``SparkOnDemand`` touches of a session: its conf, its JVM (none here; the laziness is under test,
    not Spark)."""

    _jvm = None

    def __init__(self, master: str = "local[2]") -> None:
        self.conf = _Conf()
        self.sparkContext = type("Context", (), {"master": master})()


def test_the_session_starts_on_the_first_ask_once_with_the_settings_given_before_and_after():
    starts: list[_Session] = []

    def start() -> Any:
        starts.append(_Session())
        return starts[-1]

    spark = SparkOnDemand(start)
    spark.conf({"a": "1"})
    assert not spark.started and starts == []
    session = spark.session()
    assert spark.started and starts == [session] and session.conf.values == {"a": "1"}
    spark.conf({"b": "2"})  # set at once on the running session
    assert session.conf.values == {"a": "1", "b": "2"}
    assert spark.session() is session and session_of(spark) is session and len(starts) == 1


def test_threads_asking_together_start_one_session():
    starts: list[int] = []
    gate = threading.Barrier(4)

    def start() -> Any:
        starts.append(1)
        return _Session()

    spark = SparkOnDemand(start)

    def ask() -> None:
        gate.wait()
        spark.session()

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert starts == [1]


def test_a_start_under_way_elsewhere_counts_as_started_and_a_given_session_is_used_as_it_is():
    spark = SparkOnDemand(_Session, running=lambda: True)
    assert spark.started
    given_session: Any = _Session()
    wrapped = SparkOnDemand.of(given_session)
    assert wrapped.started and wrapped.session() is given_session and SparkOnDemand.of(wrapped) is wrapped
    # the master a given session runs on decides whether this process reads staging on an object store
    assert wrapped.master == "local[2]" and SparkOnDemand.of(_Session("spark://host:7077")).master == "spark://host:7077"


@given(row_filter=st.sampled_from([None, "", "a > 1", "a::bigint > 1"]),
       actions=st.lists(st.sampled_from(ACTIONS), unique=True, min_size=1),
       leaves=st.sampled_from(["own", "route_to_root"]),
       staging=st.sampled_from(["/staging", "file:///staging", "s3://bucket/staging", "gs://bucket/staging"]),
       master=st.sampled_from([None, "local", "local[2]", "spark://host:7077", "yarn", "sc://host:15002"]),
       plain_others=st.integers(0, 2))
def test_may_cover_is_the_configuration_part_of_the_per_table_rule(row_filter, actions, leaves, staging, master,
                                                                    plain_others):
    cfg = TableApplyConfig(row_filter=row_filter, actions=tuple(actions), leaves=leaves)
    tables = {"public.t": cfg, **{f"public.p{i}": TableApplyConfig() for i in range(plain_others)}}
    covered = direct.may_cover(ApplyConfig(slot="s", staging_root=staging, tables=tables), master)
    # a filter this process evaluates (not a cast) and any published actions: applied per change in process
    in_process = not row_filter or "::" not in row_filter
    # staging on an object store is read here only when the driver would be this machine (a local master)
    readable = not staging.startswith(("s3://", "gs://")) or (master or "").startswith("local")
    expected = in_process and leaves == "own" and readable
    assert covered is expected
    # a table the rule takes is one this judgement did not rule out (the per-table rule's configuration part)
    assert direct.plain_config(cfg) is in_process


def test_may_cover_is_false_with_the_direct_path_switched_off(monkeypatch):
    config = ApplyConfig(slot="s", staging_root="/staging", tables={"public.t": TableApplyConfig()})
    assert direct.may_cover(config)
    monkeypatch.setenv(direct.ENV_SWITCH, "0")
    assert not direct.may_cover(config)


@pytest.mark.parametrize(("doc", "expected"), [
    (lambda: {**copy.deepcopy(VALID), "tables": {"public.customers": {}}}, False),  # plain PostgreSQL: may not
    (lambda: copy.deepcopy(VALID), False),  # a row filter this process evaluates (apply/filter_eval.py): may not
    (lambda: {**copy.deepcopy(VALID), "tables": {"public.orders": {"row_filter": "amount::bigint > 100"}}},
     True),  # a row filter with a cast: Spark evaluates it
    (lambda: {**copy.deepcopy(VALID), "tables": {"public.customers": {}},
              "staging": {"uri": "s3://bucket/staging"}}, False),  # an object store, read here: no master is local
    (lambda: {**copy.deepcopy(VALID), "tables": {"public.customers": {}}, "staging": {"uri": "s3://bucket/staging"},
              "spark": {"master": "spark://host:7077"}}, True),  # an object store read by a cluster's executors
    (delta_doc, True),  # a row filter (and a change feed, which takes no direct rows)
    # a Delta change feed takes no direct rows; a Delta mirror does
    (lambda: {**delta_doc(partition_by={}), "tables": {"public.customers": {}}}, True),
    (lambda: {**delta_doc(mode="mirror", partition_by={}), "tables": {"public.customers": {}}}, False),
    # an Iceberg mirror reads the direct path's rows itself (``lake/direct.py``); a change feed needs Spark's frames
    (lambda: {**iceberg_doc(mode="mirror", partition_by={}), "tables": {"public.customers": {}}}, False),
    (lambda: {**iceberg_doc(partition_by={}), "tables": {"public.customers": {}}}, True),
])
def test_a_run_surely_needs_spark_only_when_target_or_configuration_rule_the_direct_path_out(doc, expected):
    assert spark_expected(parse_spec(doc(), env={"LAKE": "/lake"})) is expected


@pytest.mark.parametrize(("doc", "expected"), [
    (lambda: {**copy.deepcopy(VALID), "tables": {"public.customers": {}}}, False),  # PostgreSQL COPYs snapshot rows
    (lambda: {**delta_doc(mode="mirror", partition_by={}), "tables": {"public.customers": {}}}, True),
    (lambda: {**iceberg_doc(mode="mirror", partition_by={}), "tables": {"public.customers": {}}}, True),
])
def test_a_staged_snapshot_surely_needs_spark_for_a_target_that_loads_snapshots_through_it(doc, expected):
    """Only PostgreSQL reads a snapshot's staged rows itself: an initial load or resync into a lake mirror starts
    Spark while the drain runs, though its change batches may not need it."""
    spec = parse_spec(doc(), env={"LAKE": "/lake"})
    assert spark_expected(spec, snapshot=True) is expected
    assert not spark_expected(spec)  # the change batches alone: the direct path may cover them
