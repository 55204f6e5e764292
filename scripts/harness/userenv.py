"""Run commands the way a user runs them: the venv's scripts by absolute path, nothing activated.

A user who installed the provider into a virtualenv (or with pipx) calls ``.venv/bin/pglogical`` or
``.venv/bin/airflow`` from a login shell: the venv's ``bin`` is not on PATH, ``python3`` is the
system's, no ``PYSPARK_PYTHON``, ``PYTHONPATH``, ``SPARK_*`` or ``AIRFLOW_*`` is exported, and HOME is
their own. The suite's own process has all of those set up (pytest runs from the venv, conftest may
export things), so commands users type are run through :func:`user_env` instead of ``os.environ``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
# What a login shell carries that a user would not think of as configuration.
PASSED_THROUGH = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM", "JAVA_HOME",
                  # The machine's class archive of Spark's classes (apply/jvm_archive.py): a user's cache directory
                  # outlives their commands, a throwaway HOME's would not.
                  "PGLOGICAL_JVM_ARCHIVE_DIR")


def user_path() -> str:
    """PATH without this venv's ``bin`` (and without any other active virtualenv's)."""
    venvs = {VENV_BIN.resolve()}
    if os.environ.get("VIRTUAL_ENV"):
        venvs.add((Path(os.environ["VIRTUAL_ENV"]) / "bin").resolve())
    entries = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() not in venvs]
    return os.pathsep.join(entries or ["/usr/local/bin", "/usr/bin", "/bin"])


def user_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A login shell's environment with HOME at ``home``, plus exactly ``extra`` (what the command needs)."""
    env = {key: os.environ[key] for key in PASSED_THROUGH if key in os.environ}
    env.update({"PATH": user_path(), "HOME": str(home)})
    env.update(extra or {})
    return env


_HOME: list[Path] = []


def default_home() -> Path:
    """One throwaway HOME per test process, removed at exit."""
    if not _HOME:
        _HOME.append(Path(tempfile.mkdtemp(prefix="pglogical-user-home-")))
        atexit.register(shutil.rmtree, _HOME[0], True)
    return _HOME[0]


def run_as_user(args: list[str], extra: Mapping[str, str] | None = None, *, home: Path | None = None,
                timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in :func:`user_env` from ``cwd`` (default: the user's HOME), capturing text output."""
    home = home or default_home()
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.run(args, env=user_env(home, extra), cwd=cwd or home, capture_output=True, text=True,
                          timeout=timeout)


def venv_script(name: str) -> str:
    """Absolute path of a console script of the installed package (``pglogical``, ``airflow``)."""
    return str(VENV_BIN / name)
