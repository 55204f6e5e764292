"""SlotLagSensor(deferrable=True) defers to SlotLagTrigger and resumes, in a real `airflow dags test` run."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from scripts.harness.pgserver import execute
from scripts.harness.userenv import venv_script

TEST_DAGS = Path(__file__).parent / "dags"


def test_the_deferrable_lag_sensor_waits_in_the_trigger_and_resumes_once_the_slot_catches_up(airflow, pg_server,
                                                                                             pg_dbname):
    dsn = pg_server.dsn(pg_dbname)
    execute(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    hook = PgLogicalHook.from_dsn(dsn)
    hook.create_slot("lag_wait_slot")
    # ~4 MB of WAL: above the DAG's 1 MiB bound, so the first check must defer
    execute(dsn, "INSERT INTO t SELECT generate_series(1, 50000)")
    info = hook.slot_info("lag_wait_slot")
    assert info is not None and (info.pending_bytes or 0) > 1 << 20
    env = {**airflow.env, "AIRFLOW_CONN_PGLOGICAL_SOURCE": pg_server.uri(pg_dbname),
           "PGLOGICAL_TEST_SLOT": "lag_wait_slot", "AIRFLOW__CORE__DAGS_FOLDER": str(TEST_DAGS)}
    lines: list[str] = []
    polls_seen = threading.Event()
    proc = subprocess.Popen([venv_script("airflow"), "dags", "test",
                             "pglogical_test_lag_wait"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "polling again in" in line and sum("polling again in" in x for x in lines) >= 2:
                polls_seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # The trigger polls (and logs) while the lag is above 0; only then does the slot catch up.
        assert polls_seen.wait(240), "".join(lines)[-6000:]
        hook.advance_slot("lag_wait_slot", hook.current_wal_flush_lsn())
        assert proc.wait(240) == 0, "".join(lines)[-6000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(10)
        hook.close()
    output = "".join(lines)
    assert "state=success" in output, output[-6000:]
    assert "[DAG TEST] running trigger in line" in output
    # the trigger's final poll, after the slot caught up
    assert re.search(r"lag \d+ bytes is within 1048576 after", output), output[-6000:]
    assert "in the triggerer" in output  # execute_complete ran on resume
