"""The ``pglogical`` console script as a user runs it (by path, venv not activated), and the two readings of its
result the CLI tests make: the JSON of a success, the one error line of a failure."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from scripts.harness.userenv import run_as_user, venv_script

PGLOGICAL = venv_script("pglogical")


def pglogical(*args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # As a user calls it: by path, venv not activated, no PYSPARK_PYTHON/SPARK_LOCAL_IP/AIRFLOW_* exported
    # beyond ``extra`` (what the user exports for this command).
    return run_as_user([PGLOGICAL, *args], extra, timeout=300)


def run_ok(*args: str, extra: dict[str, str] | None = None) -> Any:
    """``pglogical ARGS``, which must exit 0: its JSON result."""
    result = pglogical(*args, extra=extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a command that exited 1."""
    assert result.returncode == 1, result.stderr[-3000:]
    [line] = [ln for ln in result.stderr.splitlines() if "error:" in ln]
    return line


def create_replication(spec: str | Path) -> None:
    """The publication and slot of ``spec`` (``source.create``), made in this process as the first ``pglogical run``
    or ``decode`` of a pipeline makes them: before the source has changes, such a command stages and applies nothing
    and reaches no store, so a test that only needs the slot created first spares its process."""
    from airflow_provider_pglogical.pipeline.source import ensure_replication, source_client
    from airflow_provider_pglogical.pipeline.spec import load_spec

    loaded = load_spec(str(spec))
    with source_client(loaded) as client:
        ensure_replication(loaded, client)
