"""`pglogical run` without a JVM, and the teardown of a pipeline compared with a native subscriber: shared by the
integration modules that apply batches in the pglogical process only."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from scripts.harness.pgserver import drop_database, execute
from scripts.harness.subscriber import drop_slot_when_idle, unsubscribe
from tests.support.cli import pglogical


def tear_down(pg_server: Any, source: str, slot: str, native_name: str, ours_name: str) -> None:
    """Ends the native subscription ``n_<slot>``, drops both slots and the native and target databases."""
    native = pg_server.dsn(native_name)
    unsubscribe(native, name=f"n_{slot}")
    drop_slot_when_idle(source, f"n_{slot}")
    execute(source, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND NOT active", params=(slot,))
    drop_database(pg_server, native_name)
    drop_database(pg_server, ours_name)


def run_without_java(spec: str, tmp: Path) -> dict[str, Any]:
    """``pglogical run`` as a user runs it, JAVA_HOME pointing nowhere: a JVM start fails the run."""
    result: subprocess.CompletedProcess = pglogical("run", "--spec", spec,
                                                    extra={"JAVA_HOME": str(tmp / "no-java-here")})
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False
    assert "starting Spark" not in result.stderr
    return summary
