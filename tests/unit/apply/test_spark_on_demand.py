"""The apply's session on demand (``apply/spark_on_demand.py``) and the judgement, before anything is staged, of
whether a run will surely need Spark (``direct.may_cover``, ``runs.spark_expected``)."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.apply import direct, sparkenv
from airflow_provider_pglogical.apply.batches import list_batches
from airflow_provider_pglogical.apply.config import ACTIONS, ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand, session_of
from airflow_provider_pglogical.pipeline import runs
from airflow_provider_pglogical.pipeline.runs import spark_expected
from airflow_provider_pglogical.pipeline.spec import parse_spec
from tests.support.stage import BatchSpec, Chg, write_batch
from tests.unit.apply.conftest import ITEMS
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


def test_settings_the_started_session_has_are_not_set_again():
    session = _Session()
    spark = SparkOnDemand(lambda: session, preset={"a": "1"})  # the start gives every session a=1
    spark.conf({"a": "1", "b": "2"})
    spark.session()
    spark.conf({"a": "1", "b": "2", "c": "3"})
    assert session.conf.values == {"b": "2", "c": "3"}  # each set once; a=1 never (a round trip over Connect)
    spark.conf({"a": "0"})
    assert session.conf.values["a"] == "0"


@pytest.mark.parametrize(("master", "set_again"), [("sc://127.0.0.1:1", False), ("local[1]", False),
                                                   ("sc://127.0.0.1:1/;session_id=0b0e4d4a-8f1e-4c55-9a43-3d1c2f6f7a10",
                                                    True)])
def test_a_shared_session_gets_the_apply_settings_again_when_the_apply_starts(master, set_again):
    starter = runs.SparkStarter(master)
    session = _Session()
    starter._session, starter.start_s = session, 0.0  # started during the drain
    starter._thread = threading.Thread(target=lambda: None)
    starter._thread.start()
    with runs._apply_session(starter, master, {}, lambda _: None) as spark:
        spark.conf(sparkenv.SESSION_CONF)
        assert spark.session() is session
    # A session named by its id may have had its settings changed since its start (anyone holding the id can):
    # SESSION_CONF is set again; one this process opened or reset holds them since its start.
    assert session.conf.values == (sparkenv.SESSION_CONF if set_again else {})


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
    assert wrapped.local_master and not SparkOnDemand.of(_Session("spark://host:7077")).local_master
    assert not SparkOnDemand.of(_Session("localhost")).local_master


# Literal answers (not the implementation's expression): which masters run Spark on this machine.
LOCAL_MASTERS = {"local": True, "local[2]": True, "local[*]": True, "local[4,3]": True, "local-cluster[2,1,1024]": True,
                 "localhost": False, "local-spark.corp": False, "local:7077": False, "spark://localhost:7077": False,
                 "yarn": False, "k8s://https://localhost:6443": False, "sc://localhost:15002": False, "": False}


@pytest.mark.parametrize(("master", "expected"), [*LOCAL_MASTERS.items(), (None, False)])
def test_a_master_is_local_only_when_spark_runs_on_this_machine(master, expected):
    assert sparkenv.is_local(master) is expected
    assert sparkenv.session_is_local(master, environ={}) is expected


def test_spark_remote_in_the_environment_makes_no_master_local():
    # pyspark builds a Spark Connect client whatever the master says when SPARK_REMOTE is exported
    assert not sparkenv.session_is_local("local[2]", environ={"SPARK_REMOTE": "sc://spark:15002"})
    config = ApplyConfig(slot="s", staging_root="s3://bucket/staging", tables={"public.t": TableApplyConfig()})
    assert direct.may_cover(config, sparkenv.session_is_local("local[2]", environ={}))
    assert not direct.may_cover(config, sparkenv.session_is_local("local[2]", environ={"SPARK_REMOTE": "sc://h"}))


def test_spark_remote_exported_makes_a_run_on_an_object_store_expect_spark(monkeypatch):
    doc = {**copy.deepcopy(VALID), "tables": {"public.customers": {}}, "staging": {"uri": "s3://bucket/staging"},
           "spark": {"master": "local[2]"}}
    spec = parse_spec(doc, env={})
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    assert not spark_expected(spec)
    monkeypatch.setenv("SPARK_REMOTE", "sc://spark:15002")
    assert spark_expected(spec)


@given(row_filter=st.sampled_from([None, "", "a > 1", "a::bigint > 1"]),
       actions=st.lists(st.sampled_from(ACTIONS), unique=True, min_size=1),
       leaves=st.sampled_from(["own", "route_to_root"]),
       staging=st.sampled_from(["/staging", "file:///staging", "s3://bucket/staging", "gs://bucket/staging"]),
       master=st.sampled_from(sorted(LOCAL_MASTERS)),
       plain_others=st.integers(0, 2))
def test_may_cover_is_the_configuration_part_of_the_per_table_rule(row_filter, actions, leaves, staging, master,
                                                                    plain_others):
    cfg = TableApplyConfig(row_filter=row_filter, actions=tuple(actions), leaves=leaves)
    tables = {"public.t": cfg, **{f"public.p{i}": TableApplyConfig() for i in range(plain_others)}}
    covered = direct.may_cover(ApplyConfig(slot="s", staging_root=staging, tables=tables),
                               sparkenv.session_is_local(master, environ={}))
    # a filter this process evaluates (not a cast) and any published actions: applied per change in process
    in_process = not row_filter or "::" not in row_filter
    # staging on an object store is read here only when the driver would be this machine (a local master)
    readable = not staging.startswith(("s3://", "gs://")) or LOCAL_MASTERS[master]
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
              "staging": {"uri": "s3://bucket/staging"}}, False),  # an object store, read here: no master given, so
    # the default local[*]
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


TOKEN = "s3cr3t-t0ken"
CONNECT = f"sc://spark:15002/;user_id=etl;token={TOKEN};use_ssl=true"


def test_a_connect_token_is_masked_in_log_lines_and_never_kept_by_a_batch(tmp_path):
    assert sparkenv.redacted(CONNECT) == "sc://spark:15002/;user_id=etl;token=***;use_ssl=true"
    assert sparkenv.redacted("local[2]") == "local[2]"

    class Starter:  # what ``_apply_session`` touches of a ``SparkStarter``: its master, its start, its settings
        master, started, settings_held = CONNECT, False, True

        def session(self) -> Any:
            return _Session()

    lines: list[str] = []
    with runs._apply_session(Starter(), CONNECT, {}, lines.append) as on_demand:  # type: ignore[arg-type]
        on_demand.session()
    assert lines and all(TOKEN not in line for line in lines) and "token=***" in lines[0]
    assert not on_demand.local_master and TOKEN not in repr(vars(on_demand))

    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {ITEMS: [Chg("I", 10, 0, new={"id": 1})]}))
    (batch,) = list_batches(str(tmp_path), "slot", sparkenv.session_is_local(CONNECT))
    assert not batch.local_master and TOKEN not in repr(batch) and "sc://" not in repr(batch)
