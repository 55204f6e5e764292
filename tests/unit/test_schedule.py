"""The suite's schedule (tests/conftest.py): the modules on the shared two-worker Spark cluster run together, in
SPARK_CLUSTER_MODULES' order, and under `make test`'s xdist options on one worker; the other modules stay units of
their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SLOW_MODULES, SPARK_CLUSTER_MODULES, work_unit

REPO_ROOT = Path(__file__).resolve().parents[2]
# two modules of SLOW_MODULES outside the group, one ranked before a module of the group and one after
OTHERS = ["tests/integration/test_object_store_staging.py", "tests/integration/test_snapshot_native.py"]
# outside SLOW_MODULES: a one-test module starting services, a unit module of many tests, a unit module of one
SERVICE, MANY, ONE = ("tests/integration/test_native_equivalence.py", "tests/unit/test_row_filter.py",
                      "tests/unit/test_environ.py")


@pytest.fixture(scope="module")
def collected() -> list[str]:
    """The test ids of OTHERS, the cluster's modules and SERVICE, MANY and ONE in the suite's order (one
    ``--collect-only`` of the repository's modules, each given in an order other than the suite's)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", ONE, MANY,
                          SERVICE, *OTHERS, *reversed(SPARK_CLUSTER_MODULES)], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_the_cluster_modules_run_together_in_their_order_where_the_first_of_them_ranks(collected: list[str]) -> None:
    modules = list(dict.fromkeys(i.split("::")[0] for i in collected))
    first = min(SPARK_CLUSTER_MODULES, key=SLOW_MODULES.index)
    assert first != SPARK_CLUSTER_MODULES[0]  # not vacuous: the group moves its other modules up to the first
    start = modules.index(SPARK_CLUSTER_MODULES[0])
    assert modules[start:start + len(SPARK_CLUSTER_MODULES)] == list(SPARK_CLUSTER_MODULES)
    assert [m for m in modules if m not in SPARK_CLUSTER_MODULES][:len(OTHERS)] == OTHERS
    assert (modules.index(OTHERS[0]) < start) == (SLOW_MODULES.index(OTHERS[0]) < SLOW_MODULES.index(first))
    in_group = [i for i in collected if i.split("::")[0] in SPARK_CLUSTER_MODULES]
    # the run that loses a worker (it leaves the cluster one worker short) is the group's last
    assert in_group[-1].endswith("::test_snapshot_and_changes_on_two_workers_match_a_native_subscriber[submit]")


def test_make_test_runs_the_cluster_modules_as_one_unit_of_work_on_one_worker(tmp_path: Path) -> None:
    """`make test`'s xdist options with the suite's conftest as a plugin, over modules of two tests each at the
    paths of the cluster's modules and of OTHERS (nothing started): xdist uses the suite's scheduler, which runs
    the group's tests on one worker and hands every other module out as a unit of its own."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the node ids are relative to tmp_path, as to the repository
    # the suite's one autouse fixture, which would write the JVMs' class archive: nothing here starts a JVM
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n\n@pytest.fixture(scope='session')\ndef spark_class_archive():\n    return None\n")
    modules = [*OTHERS, *reversed(SPARK_CLUSTER_MODULES)]
    for module in modules:
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("def test_a():\n    pass\n\n\ndef test_b():\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest", "-n", "2",
                          "--dist", "loadfile", "--no-loadscope-reorder", "-v", *modules], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert "scheduling tests via SparkClusterScheduling" in lines, lines[:20]
    ran = dict(reversed(line.split(" PASSED ")) for line in lines if " PASSED " in line)  # test id → "[gwN] [ n%]"
    assert len(ran) == 2 * len(modules)
    workers = {test: where.split()[0] for test, where in ran.items()}
    assert len({workers[t] for t in workers if t.split("::")[0] in SPARK_CLUSTER_MODULES}) == 1
    assert len(set(workers.values())) == 2  # not vacuous: the other modules went to the other worker too
    units = {work_unit(f"{module}::test_x[a]") for module in SPARK_CLUSTER_MODULES}
    assert units == {work_unit(f"{SPARK_CLUSTER_MODULES[0]}::test_y")}
    assert [work_unit(f"{module}::test_x") for module in OTHERS] == OTHERS


def test_a_module_using_the_cluster_outside_the_group_is_refused_with_the_way_out(tmp_path: Path) -> None:
    """It would start a second cluster on the other xdist worker: collection stops and names the list to add it to
    (the suite's conftest loaded as a plugin over a module outside the repository's tests)."""
    (tmp_path / "test_elsewhere.py").write_text(
        "from tests.support.cluster import spark_cluster  # noqa: F401\n\n"
        "def test_on_the_cluster(spark_cluster):\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
                          "--collect-only", "-q", "test_elsewhere.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 4, out.stdout[-2000:] + out.stderr[-2000:]  # a usage error
    assert ("test_elsewhere.py::test_on_the_cluster uses the shared Spark cluster: add test_elsewhere.py to "
            "SPARK_CLUSTER_MODULES in tests/conftest.py") in out.stderr


def test_the_modules_outside_the_slow_list_run_by_number_of_tests_most_first(collected: list[str]) -> None:
    """Outside SLOW_MODULES a module of many tests goes first, whatever its folder: light unit modules run beside the
    heavy service ones rather than all at the end."""
    assert not {SERVICE, MANY, ONE} & set(SLOW_MODULES)
    ids = [i for i in collected if i.split("::")[0] in (SERVICE, MANY, ONE)]
    counts = {module: sum(i.startswith(f"{module}::") for i in ids) for module in (SERVICE, MANY, ONE)}
    assert counts[SERVICE] < counts[MANY] and counts[ONE] < counts[MANY]  # not vacuous: by folder, SERVICE would lead
    order = list(dict.fromkeys(i.split("::")[0] for i in ids))
    assert order[0] == MANY and order == sorted(order, key=lambda m: -counts[m])
