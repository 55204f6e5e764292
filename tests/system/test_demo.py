"""`make demo` as a new user runs it, then the command its closing hint prints.

`make demo` is `make bootstrap` (done for the suite already) plus ``.venv/bin/python scripts/demo.py``;
the script runs its own PostgreSQL, the workload and `airflow dags test` in a user-like environment.
Here the script itself also starts from one: venv not activated, nothing exported but where the demo
keeps its files, so nothing the suite's process has set up can make it pass.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.harness.userenv import run_as_user, venv_script
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_dir(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "demo"
    try:
        yield where
    finally:  # `make demo-stop`: stops the demo's server and removes its files, also after a failure
        run_as_user([venv_script("python"), "scripts/demo.py", "stop"], {"PGLOGICAL_DEMO_DIR": str(where)},
                    cwd=REPO_ROOT, timeout=120)


def test_the_demo_ends_with_source_and_targets_equal_and_its_hint_command_works(demo_dir: Path, tmp_path: Path):
    demo = run_as_user([venv_script("python"), "scripts/demo.py"], {"PGLOGICAL_DEMO_DIR": str(demo_dir)},
                       cwd=REPO_ROOT, timeout=1500)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out[-6000:]
    checks = re.findall(r"^\s+(OK|DIFF)\s", demo.stdout, re.M)
    assert checks and set(checks) == {"OK"}, demo.stdout[-4000:]

    # The closing hint: `env AIRFLOW_CONN_…=… PGLOGICAL_STAGING_URI=… .venv/bin/pglogical status --spec …`,
    # typed from the repository in a shell where nothing is activated.
    hint = demo.stdout[demo.stdout.index("env AIRFLOW_CONN_PGLOGICAL_SOURCE"):].split("\nStop it")[0]
    words = shlex.split(hint.replace("\\\n", " "))
    assert words[0] == "env"
    assignments = dict(word.split("=", 1) for word in words[1:] if "=" in word and not word.startswith("-"))
    command = [word for word in words[1:] if "=" not in word]
    status = run_as_user([str(REPO_ROOT / command[0]), *command[1:]], assignments, cwd=REPO_ROOT,
                         home=tmp_path / "home", timeout=300)
    assert status.returncode == 0, status.stderr[-3000:]
    assert '"confirmed_flush_lsn"' in status.stdout
