"""The ``integration`` marker: ``-m "not integration"`` keeps the service-free tests and only those."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# a service-free unit module, one whose tests use PostgreSQL (through a fixture), an integration module whose test
# uses none of SERVICE_FIXTURES (marked for its folder alone) and a system module
MODULES = ["tests/unit/apply/test_planning.py", "tests/unit/apply/test_arrowtext.py",
           "tests/integration/test_spark_harness.py", "tests/system/test_demo.py"]


def collected(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args,
                          *MODULES], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_not_integration_selects_exactly_the_tests_without_services() -> None:
    ids = collected("-m", "not integration")
    assert ids and all(i.startswith("tests/unit/") for i in ids)
    assert "tests/unit/apply/test_planning.py" in {i.split("::")[0] for i in ids}
    assert not any("::test_arrays_printed_from_arrow_equal_the_jvm_text" in i for i in ids)  # uses PostgreSQL
    assert any("::test_arrays_of_other_element_types_are_not_printed_from_arrow" in i for i in ids)


def test_integration_selects_the_tests_with_services() -> None:
    ids = collected("-m", "integration")
    assert {i.split("/")[1] for i in ids} == {"unit", "integration", "system"}
    assert all(i.startswith("tests/unit/apply/test_arrowtext.py") for i in ids if i.startswith("tests/unit/"))
