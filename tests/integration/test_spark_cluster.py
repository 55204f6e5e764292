"""``pglogical run`` on a two-worker Spark standalone cluster with staging on S3 only, as a deployment runs it:
the driver in the ``pglogical`` process (``spark.master: spark://…``) or in a Spark Connect server running on the
cluster; the workers hold the staging credentials, the driver another key (``DRIVER_KEY``) or none.

An initial snapshot and the native-equivalence workload (row filters with UPDATE→INSERT/DELETE, key changes,
TOAST, TRUNCATE cascades) end as a native ``copy_data`` subscriber's tables, with tasks on both workers and no
row-change file read by a driver; a worker killed while its executor reads a batch loses nothing: Spark runs
the task again on the other worker and the target still ends as the native subscriber's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from airflow_provider_pglogical.hooks import PgLogicalHook
from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import run_script, unsubscribe, wait_for_subscriber
from scripts.harness.userenv import run_as_user, venv_script
from tests.integration.test_native_equivalence import (
    BATCH_ONE,
    BATCH_TWO,
    PRE_EXISTING_SQL,
    PUBLICATIONS_SQL,
    TABLES,
    TABLES_SQL,
    table_rows,
)
from tests.integration.test_snapshot_native import wait_ready
from tests.integration.test_spark_connect import SPEC_TABLES
from tests.support.cluster import Cluster, cluster_connect, spark_cluster  # noqa: F401 (fixtures)
from tests.support.sparkconnect import DRIVER_KEY, EXECUTOR_KEY, s3_env

# The snapshot's rows besides PRE_EXISTING_SQL's: enough chunks of work for both workers' executors.
SNAPSHOT_SQL = PRE_EXISTING_SQL + """
INSERT INTO cols SELECT g, 'a' || g, 's' || g, g FROM generate_series(1000, 5999) g;
INSERT INTO toasty SELECT g, g, repeat(md5(g::text), 300) FROM generate_series(1000, 1049) g;
"""


class Databases:
    """A source, a native subscriber of ``pub_native`` and our target, on the test server; dropped afterwards."""

    def __init__(self, pg_server, *, copy_data: bool) -> None:
        self.server = pg_server
        self.names = [make_database(pg_server) for _ in range(3)]
        self.source, self.native, self.ours = (pg_server.dsn(n) for n in self.names)
        self.copy_data = copy_data

    def subscribe(self) -> None:
        execute(self.source, "SELECT pg_create_logical_replication_slot('sub_native', 'pgoutput')")
        execute(self.native, f"CREATE SUBSCRIPTION sub_native CONNECTION '{self.source}' PUBLICATION pub_native "
                             f"WITH (create_slot = false, slot_name = sub_native, copy_data = {self.copy_data})")
        if self.copy_data:
            wait_ready(self.native)

    def drop(self) -> None:
        unsubscribe(self.native)
        for name in self.names:
            execute(self.server.dsn(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def databases(pg_server, request) -> Iterator[Databases]:
    dbs = Databases(pg_server, copy_data=request.param)
    execute(dbs.source, TABLES_SQL + PUBLICATIONS_SQL + (SNAPSHOT_SQL if dbs.copy_data else PRE_EXISTING_SQL))
    execute(dbs.native, TABLES_SQL)
    execute(dbs.ours, TABLES_SQL)
    try:
        dbs.subscribe()
        yield dbs
    finally:
        dbs.drop()


def write_spec(path: Path, dbs: Databases, cluster: Cluster, spark: dict, *, snapshot: bool) -> Path:
    path.write_text(yaml.safe_dump({
        "source": {"dsn": dbs.server.uri(dbs.names[0]), "publication": "pub_all", "slot": "ours"},
        "staging": {"uri": f"s3://{cluster.s3.bucket}/{path.parent.name}/staging"},
        "target": {"kind": "postgres", "dsn": dbs.server.uri(dbs.names[2])},
        "tables": SPEC_TABLES,
        "snapshot": {"initial": snapshot},
        "spark": spark,
    }))
    return path


def run(spec: Path, cluster: Cluster) -> dict:
    """``pglogical run`` as the user types it, with the driver's S3 key (not the executors')."""
    result = run_as_user([venv_script("pglogical"), "run", "--spec", str(spec)], s3_env(cluster.s3, DRIVER_KEY),
                         timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def tasks_per_worker(cluster: Cluster) -> list[int]:
    return [sum(len(w.task_attempts(app)) for app in cluster.spark.apps()) for w in cluster.spark.workers]


def assert_equal_to_native(dbs: Databases) -> None:
    wait_for_subscriber(dbs.source, dbs.native)
    for table in TABLES:
        if table == "toast_rf":  # test_native_equivalence's stated deviation is not part of this workload
            assert table_rows(dbs.ours, table) == [(120, 2, "w" * 9000)]
            continue
        assert table_rows(dbs.ours, table) == table_rows(dbs.native, table), table
    assert table_rows(dbs.native, "rf_full") == [(2, 6, "b"), (4, 9, "d2")]  # the transforms happened
    assert table_rows(dbs.native, "child") == [(50, 5, "c5")]
    seq = "SELECT last_value, is_called FROM seqd_id_seq"
    assert query(dbs.ours, seq) == query(dbs.native, seq)


@pytest.mark.parametrize("databases", [True], indirect=True, ids=[""])
@pytest.mark.parametrize("where", ["submit", "connect"])
def test_snapshot_and_changes_on_two_workers_match_a_native_subscriber(
        spark_cluster, request, databases, tmp_path, where):  # noqa: F811 (the fixtures imported above)
    """``spark.master: spark://…`` (the driver in ``pglogical``) and ``spark.remote`` of a Connect server whose
    application runs on the cluster (its driver without S3 credentials)."""
    spark = ({"remote": request.getfixturevalue("cluster_connect")} if where == "connect"
             else {"master": spark_cluster.spark.master_url, "conf": spark_cluster.conf()})
    spec = write_spec(tmp_path / "spec.yaml", databases, spark_cluster, spark, snapshot=True)
    tasks_before = tasks_per_worker(spark_cluster)
    recorded = spark_cluster.requests
    try:
        recorded.start()
        snapshot = run(spec, spark_cluster)
        assert snapshot["decode"]["snapshot"]["initial"]["tables"]["public.cols"]["rows"] == 5000, snapshot
        for script in (BATCH_ONE, BATCH_TWO):
            run_script(databases.source, script)
            assert run(spec, spark_cluster)["apply"]["batches_applied"] == 1
        recorded.stop()
        assert_equal_to_native(databases)
        assert table_rows(databases.ours, "cols")[-1] == (5999, "a5999", None, 5999)  # the snapshot's column list
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


@pytest.mark.parametrize("databases", [False], indirect=True, ids=[""])
def test_a_worker_killed_while_its_executor_reads_a_batch_loses_nothing(
        spark_cluster, databases, tmp_path):  # noqa: F811 (the fixture imported above)
    """Runs last in this module (the cluster keeps one worker). The S3 server holds the executors' reads of
    row-change files until both workers' executors are inside such a read; then worker 1's JVM and its executor
    are SIGKILLed. Spark runs the lost task again on worker 2, the run ends, and the target is the native
    subscriber's: nothing lost, nothing applied twice (the progress row is the batch's end)."""
    PgLogicalHook.from_dsn(databases.source).create_slot("ours")
    spark = {"master": spark_cluster.spark.master_url, "conf": spark_cluster.conf()}
    spec = write_spec(tmp_path / "spec.yaml", databases, spark_cluster, spark, snapshot=False)
    for script in (BATCH_ONE, BATCH_TWO):
        run_script(databases.source, script)
    worker1, worker2 = spark_cluster.spark.workers
    apps_before, gate = spark_cluster.spark.apps(), spark_cluster.gate
    gate.close()
    with ThreadPoolExecutor(1) as pool:
        try:
            running = pool.submit(run, spec, spark_cluster)
            deadline = time.monotonic() + 300
            while not (gate.waiting >= 2 and (apps := spark_cluster.spark.apps() - apps_before)
                       and all(w.running_tasks(app) for w in (worker1, worker2) for app in apps)):
                assert time.monotonic() < deadline, "the executors did not both reach a staged file"
                assert not running.done(), running.result()
                time.sleep(0.2)
            (app,) = apps
            worker1.kill()
        finally:
            gate.open()
        report = running.result()
    assert report["apply"]["batches_applied"] == 1
    # The task worker 1 was running ran again on worker 2 (a second attempt).
    assert any(attempt > 0 for _, attempt in worker2.task_attempts(app)), worker2.task_attempts(app)
    assert_equal_to_native(databases)
    (slot_lsn,) = query(databases.source, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                          "WHERE slot_name = 'ours'")[0]
    assert query(databases.ours, "SELECT DISTINCT end_lsn::text FROM pglogical_progress WHERE slot = 'ours'") == [(slot_lsn,)]
