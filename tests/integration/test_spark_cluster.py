"""``pglogical run`` on a two-worker Spark standalone cluster with staging on S3 only, as a deployment runs it:
the driver in the ``pglogical`` process (``spark.master: spark://…``) or in a Spark Connect server running on the
cluster; the workers hold the staging credentials, the driver another key (``DRIVER_KEY``) or none.

An initial snapshot and the native-equivalence workload (row filters with UPDATE→INSERT/DELETE, key changes,
TOAST, TRUNCATE cascades) end as a native ``copy_data`` subscriber's tables, with tasks on both workers and no
row-change file read by a driver; under ``spark.master``, a worker killed while its executor reads the changes'
batch loses nothing: Spark runs the task again on the other worker and the target still ends as the native
subscriber's (the kill happens in that run, not in one of its own: an application costs a driver and two
executor JVMs). A Delta target on the
same cluster — the spec app spark-submitted to its master, and ``pglogical run`` over the Connect server on it —
ends as the native subscriber's tables too.

Over the Connect server each test applies the snapshot in one run and the changes in a second (a run finding
the target a previous one left); where every apply is an application of its own (``spark.master``, spark-submit),
the snapshot is staged by ``pglogical decode`` and one application loads it and applies the changes' batch: a
second application would cost three more JVMs and check nothing the Connect runs do not.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from airflow_provider_pglogical.apply.sparkenv import spark_submit_env
from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from scripts.harness.pgserver import query
from scripts.harness.subscriber import run_script
from scripts.harness.userenv import run_as_user, venv_script
from tests.integration.test_native_equivalence import table_rows
from tests.support.cluster import Cluster, cluster_connect, spark_cluster  # noqa: F401 (fixtures)
from tests.support.remote_specs import (
    BATCH_ONE,
    BATCH_TWO,
    SNAPSHOT_SQL,
    Databases,
    assert_delta_equals_native,
    assert_postgres_equals_native,
    write_spec,
)
from tests.support.sparkconnect import DRIVER_KEY, EXECUTOR_KEY, s3_env

APP = str(Path(__file__).resolve().parents[2] / "spark_apps" / "apply_spec.py")


@pytest.fixture
def databases(pg_server) -> Iterator[Databases]:
    """The workload's databases, the source with the snapshot's rows, the native subscriber copying them."""
    dbs = Databases(pg_server, copy_data=True, source_sql=SNAPSHOT_SQL)
    try:
        dbs.subscribe()
        yield dbs
    finally:
        dbs.drop()


def cluster_spec(path: Path, dbs: Databases, cluster: Cluster, spark: dict, *, snapshot: bool,
                 target: dict | None = None) -> Path:
    """The workload's spec with staging on the cluster's S3 only (default target: ``ours``)."""
    return write_spec(path, source={"dsn": dbs.uri("source")},
                      staging=f"s3://{cluster.s3.bucket}/{path.parent.name}/staging",
                      target=target or {"kind": "postgres", "dsn": dbs.uri("ours")}, spark=spark, snapshot=snapshot)


def run(spec: Path, cluster: Cluster, command: str = "run") -> dict:
    """``pglogical run`` (or ``command``) as the user types it, with the driver's S3 key (not the executors')."""
    result = run_as_user([venv_script("pglogical"), command, "--spec", str(spec)], s3_env(cluster.s3, DRIVER_KEY),
                         timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def stage_snapshot(spec: Path, cluster: Cluster) -> dict:
    """``pglogical decode``: the slot made with its exported snapshot, the snapshot staged (no Spark); as ``run``
    reports it."""
    return {"decode": run(spec, cluster, "decode")}


def applied_by_changes_run(where: str) -> int:
    """What the run of the changes reports applied: their one batch, and where it also loads the snapshot
    (``submit``: one application for both) the snapshot's load, which the apply reports as a batch of its own."""
    return 2 if where == "submit" else 1


def tasks_per_worker(cluster: Cluster) -> list[int]:
    return [sum(len(w.task_attempts(app)) for app in cluster.spark.apps()) for w in cluster.spark.workers]


def submit(spec: Path, cluster: Cluster) -> dict:
    """``pglogical decode``, then spark-submit of the spec app to the cluster as the user types it (client deploy
    mode: the driver, where delta-rs commits, in the spark-submit process with the driver's S3 key)."""
    env = {**s3_env(cluster.s3, DRIVER_KEY), **spark_submit_env(cluster.spark.master_url),
           "PYSPARK_DRIVER_PYTHON": sys.executable}  # the executors' Python is the workers' own
    decoded = run_as_user([venv_script("pglogical"), "decode", "--spec", str(spec)], env, timeout=600)
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    conf = [arg for key, value in cluster.conf().items() for arg in ("--conf", f"{key}={value}")]
    result = run_as_user([venv_script("spark-submit"), "--master", cluster.spark.master_url, *conf, APP,
                          "--spec", str(spec)], env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"decode": json.loads(decoded.stdout), "apply": json.loads(result.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("where", ["submit", "connect"])
def test_a_delta_target_on_two_workers_matches_a_native_subscriber(
        spark_cluster, request, databases, tmp_path, where):  # noqa: F811 (the fixtures imported above)
    """The Delta target through spark-submit of ``spark_apps/apply_spec.py`` to the cluster, and through
    ``pglogical run`` as a client of the Connect server on the cluster: the snapshot and the workload's changes
    end as the native subscriber's tables (read with delta-rs), tasks ran on both workers, and no driver read a
    row-change file. The tables are local: delta-rs commits from the driver (or Connect client) process.

    Over Connect a run loads the snapshot and a second one applies the changes; spark-submit's one application
    does both (the module's docstring says why)."""
    lake = DeltaLocation(str(tmp_path / "lake"))
    spark = ({"remote": request.getfixturevalue("cluster_connect")} if where == "connect"
             else {"master": spark_cluster.spark.master_url})
    spec = cluster_spec(tmp_path / "spec.yaml", databases, spark_cluster, spark, snapshot=True,
                        target={"kind": "delta", "uri": lake.uri})
    step = submit if where == "submit" else run
    tasks_before = tasks_per_worker(spark_cluster)
    recorded = spark_cluster.requests
    try:
        recorded.start()
        first = (stage_snapshot if where == "submit" else run)(spec, spark_cluster)
        assert first["decode"]["snapshot"]["initial"]["tables"]["public.cols"]["rows"] == 5000, first
        for script in (BATCH_ONE, BATCH_TWO):
            run_script(databases.source, script)
        changes = step(spec, spark_cluster)
        assert len(changes["decode"]["batches"]) == 1, changes
        assert changes["apply"]["batches_applied"] == applied_by_changes_run(where), changes
        recorded.stop()
        assert_delta_equals_native(databases, lake)
        tasks_after = tasks_per_worker(spark_cluster)
        assert all(after > before for before, after in zip(tasks_before, tasks_after, strict=True)), tasks_after
        assert recorded.reads(EXECUTOR_KEY, "/tables/") > 0
        assert recorded.reads(DRIVER_KEY, "/tables/") == 0
    finally:
        recorded.stop()


def run_losing_worker1(spec: Path, cluster: Cluster) -> tuple[dict, str]:
    """``run``, with worker 1's JVM and executor SIGKILLed once both workers' executors are inside a read of a
    row-change file (the S3 server holds those reads until then): its report and the run's application id."""
    worker1, worker2 = cluster.spark.workers
    apps_before, gate = cluster.spark.apps(), cluster.gate
    held_before = gate.waiting
    gate.close()
    with ThreadPoolExecutor(1) as pool:
        try:
            running = pool.submit(run, spec, cluster)
            deadline = time.monotonic() + 300
            while not (gate.waiting - held_before >= 2 and (apps := cluster.spark.apps() - apps_before)
                       and all(w.running_tasks(app) for w in (worker1, worker2) for app in apps)):
                assert time.monotonic() < deadline, "the executors did not both reach a staged file"
                assert not running.done(), running.result()
                time.sleep(0.2)
            (app,) = apps
            worker1.kill()
        finally:
            gate.open()
        return running.result(), app


@pytest.mark.parametrize("where", ["connect", "submit"])
def test_snapshot_and_changes_on_two_workers_match_a_native_subscriber(
        spark_cluster, request, databases, tmp_path, where):  # noqa: F811 (the fixtures imported above)
    """``spark.remote`` of a Connect server whose application runs on the cluster (its driver without S3
    credentials) and ``spark.master: spark://…`` (the driver in ``pglogical``): over Connect a run with the
    snapshot, then one with the workload's changes; under ``spark.master`` (each run an application of its own,
    with a JVM and two executors) the snapshot staged by ``pglogical decode``, then one run loading it and
    applying the changes.

    The run of ``spark.master`` loses a worker while its executor reads the changes' batch: worker 1's JVM and its
    executor are SIGKILLed once both workers' executors are inside a read of a row-change file. Spark runs the lost
    task again on worker 2, the run ends, and the target is the native subscriber's: nothing lost, nothing applied
    twice (every progress row is the slot's confirmed end). So this runs last of the cluster's modules
    (tests/conftest.py), ``spark.master`` last of its two: the cluster keeps one worker (a test asking for it
    afterwards gets a new one)."""
    spark = ({"remote": request.getfixturevalue("cluster_connect")} if where == "connect"
             else {"master": spark_cluster.spark.master_url, "conf": spark_cluster.conf()})
    spec = cluster_spec(tmp_path / "spec.yaml", databases, spark_cluster, spark, snapshot=True)
    tasks_before = tasks_per_worker(spark_cluster)
    recorded = spark_cluster.requests
    try:
        recorded.start()
        snapshot = (stage_snapshot if where == "submit" else run)(spec, spark_cluster)
        assert snapshot["decode"]["snapshot"]["initial"]["tables"]["public.cols"]["rows"] == 5000, snapshot
        for script in (BATCH_ONE, BATCH_TWO):  # one batch (test_native_equivalence applies them as two)
            run_script(databases.source, script)
        changes, killed_app = (run_losing_worker1(spec, spark_cluster) if where == "submit"
                               else (run(spec, spark_cluster), None))
        assert len(changes["decode"]["batches"]) == 1, changes
        assert changes["apply"]["batches_applied"] == applied_by_changes_run(where), changes
        recorded.stop()
        assert_postgres_equals_native(databases)
        assert table_rows(databases.ours, "cols")[-1] == (5999, "a5999", None, 5999)  # the snapshot's column list
        (slot_lsn,) = query(databases.source, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                              "WHERE slot_name = 'ours'")[0]
        assert query(databases.ours, "SELECT DISTINCT end_lsn::text FROM pglogical_progress "
                                     "WHERE slot = 'ours'") == [(slot_lsn,)]
        if killed_app is not None:  # the task worker 1 was running ran again on worker 2 (a second attempt)
            worker2 = spark_cluster.spark.workers[1]
            assert any(attempt > 0 for _, attempt in worker2.task_attempts(killed_app)), worker2.task_attempts(
                killed_app)
        # Both workers' executors ran tasks of these runs.
        tasks_after = tasks_per_worker(spark_cluster)
        assert all(after > before for before, after in zip(tasks_before, tasks_after, strict=True)), tasks_after
        # The executors read every row-change and snapshot file; the driver read no row-change file.
        assert recorded.reads(EXECUTOR_KEY, "/tables/") > 0
        assert recorded.reads(EXECUTOR_KEY, "/chunks/") > 0
        assert recorded.reads(DRIVER_KEY, "/tables/") == 0
        assert recorded.reads(DRIVER_KEY, "_manifest.json") > 0  # the driver planned from the manifests
    finally:
        recorded.stop()
