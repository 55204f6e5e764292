"""The suite's schedule (tests/conftest.py): the modules on the shared two-worker Spark cluster run together, in
SPARK_CLUSTER_MODULES' order, and under `make test`'s xdist options on one worker; the other modules stay units of
their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import SLOW_MODULES, SPARK_CLUSTER_MODULES, work_unit

REPO_ROOT = Path(__file__).resolve().parents[2]
# two modules of SLOW_MODULES outside the group, one ranked before a module of the group and one after
OTHERS = ["tests/integration/test_object_store_staging.py", "tests/integration/test_snapshot_native.py"]


def pytest_run(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, *OTHERS,
                          *reversed(SPARK_CLUSTER_MODULES)], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout.splitlines()


def test_the_cluster_modules_run_together_in_their_order_where_the_first_of_them_ranks() -> None:
    ids = [line for line in pytest_run("--collect-only", "-q") if "::" in line]
    modules = list(dict.fromkeys(i.split("::")[0] for i in ids))
    first = min(SPARK_CLUSTER_MODULES, key=SLOW_MODULES.index)
    assert first != SPARK_CLUSTER_MODULES[0]  # not vacuous: the group moves its other modules up to the first
    start = modules.index(SPARK_CLUSTER_MODULES[0])
    assert modules[start:start + len(SPARK_CLUSTER_MODULES)] == list(SPARK_CLUSTER_MODULES)
    assert [m for m in modules if m not in SPARK_CLUSTER_MODULES] == OTHERS
    assert (modules.index(OTHERS[0]) < start) == (SLOW_MODULES.index(OTHERS[0]) < SLOW_MODULES.index(first))
    in_group = [i for i in ids if i.split("::")[0] in SPARK_CLUSTER_MODULES]
    assert "killed" in in_group[-1]  # the test that kills a worker is the group's last


def test_make_test_schedules_with_the_cluster_modules_as_one_unit_of_work() -> None:
    """``--setup-plan`` under `make test`'s xdist options (scheduled, nothing started): xdist uses the suite's
    scheduler, which makes the group's tests one unit and every other module a unit of its own."""
    lines = pytest_run("-n", "2", "--dist", "loadfile", "--no-loadscope-reorder", "--setup-plan", "-v")
    assert any(line.startswith("scheduling tests via SparkClusterScheduling") for line in lines), lines[:20]
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


def test_the_modules_outside_the_slow_list_run_service_folders_first_then_unit_modules_by_number_of_tests() -> None:
    """A one-test module starting services (an Airflow run, a Spark job) goes before a unit module of many tests,
    so the run ends on unit modules of few tests: short units that even out both workers' ends."""
    service, many, one = ("tests/integration/test_native_equivalence.py", "tests/unit/test_row_filter.py",
                          "tests/unit/test_environ.py")
    assert not {service, many, one} & set(SLOW_MODULES)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", one, many,
                          service], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    counts = {module: sum(i.startswith(f"{module}::") for i in ids) for module in (service, many, one)}
    assert counts[service] < counts[many] and counts[one] < counts[many]  # not vacuous: by count, many would lead
    assert list(dict.fromkeys(i.split("::")[0] for i in ids)) == [service, many, one]
