"""The import recorder of the system tests (tests/support/imports.py): every process of a command keeps its own list,
so a child that outlives the command cannot replace the command's list, and a PYTHONPATH the command needs is kept."""

import os
import subprocess
import sys
import time

import pytest

from tests.support.imports import RECORDER, heavy_imports, recorded_modules, recording_env

# The command imports pandas and starts a child that imports nothing heavy and exits after it.
PARENT = """
import subprocess, sys
import pandas
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
print(child.pid)
"""


def test_a_child_outliving_the_command_does_not_replace_its_modules(tmp_path):
    record = tmp_path / "modules.txt"
    env = recording_env(record, {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path / "kept")})
    result = subprocess.run([sys.executable, "-c", PARENT], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    child = int(result.stdout.split()[-1])
    deadline = time.monotonic() + 60
    while not (tmp_path / f"modules.txt.{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (tmp_path / f"modules.txt.{child}").exists(), "the child recorded no modules"
    assert "pandas" not in (tmp_path / f"modules.txt.{child}").read_text().split()
    assert heavy_imports(record) == ["pandas"]
    assert env["PYTHONPATH"].split(os.pathsep) == [str(RECORDER), str(tmp_path / "kept")]


def test_a_command_that_recorded_nothing_fails_the_check(tmp_path):
    record = tmp_path / "modules.txt"
    (tmp_path / "modules.txt.12345").write_text("json")  # another process's list, not the command's
    with pytest.raises(AssertionError, match="no process recorded"):
        recorded_modules(record)
