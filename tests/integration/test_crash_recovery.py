"""Kill a drain at every durable boundary; the rerun leaves each transaction staged exactly once."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.fs as pafs
import pytest

from airflow_provider_pglogical.hooks import PgLogicalHook
from airflow_provider_pglogical.staging import StagingReader
from airflow_provider_pglogical.staging.drain import DrainConfig, drain_slot
from airflow_provider_pglogical.staging.layout import MANIFEST, PARTIAL_PREFIX
from tests.conftest import REPO_ROOT
from tests.support.drain import SCHEMA_SQL, assert_log_matches, workload
from tests.support.drain_child import KILLED


def run_child(**args) -> int:
    proc = subprocess.run([sys.executable, "-m", "tests.support.drain_child", json.dumps(args)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, KILLED), proc.stderr[-3000:]
    return proc.returncode


def leftovers(uri: str) -> list[str]:
    reader = StagingReader.from_uri(uri, "s1")
    layout = reader.layout
    if not layout.exists(layout.batches_dir):
        return []
    names = [i.base_name for i in layout.fs.get_file_info(pafs.FileSelector(layout.batches_dir))]
    return [n for n in names if n.startswith(PARTIAL_PREFIX) or not layout.exists(f"{layout.batches_dir}/{n}/{MANIFEST}")]


# One kill point per durable state a drain can leave (staging/drain.py ``_stage``, writer.py), each recovered by
# another step of the next run (``_drain_locked``):
# - "transaction:12": the batch's files mid-write under ``_partial-<start>/`` (row groups flushed, no footers), slot
#   unmoved: ``leftovers_for`` deletes the partial directory. The product's ``fetched_some`` checkpoint
#   (after the first transaction) leaves this same state with fewer bytes in it (a partial directory, possibly without
#   files: the file sinks open on their first flush), which the next run deletes without reading: it is not killed at
#   separately.
# - "files_written": every file closed and moved to the final ``<start>-<end>/`` name, no manifest, slot unmoved:
#   ``leftovers_for`` must find a manifest-less final directory (and ``finish_files`` replaces it).
# - "manifest_written": published, slot unmoved: the next run finds the batch at the slot's position and only advances.
# - "advanced": published and consumed: nothing to repair.
LEFT_BEHIND = {"transaction:12": "partial", "files_written": "final, without manifest", "manifest_written": "published",
               "advanced": "published and advanced"}


@pytest.mark.parametrize("kill_at", list(LEFT_BEHIND))
def test_a_drain_killed_at_any_boundary_recovers_to_an_exactly_once_log(kill_at, pg_conn, pg_dsn, tmp_path):
    cur = pg_conn.cursor()
    cur.execute(SCHEMA_SQL)
    hook = PgLogicalHook.from_dsn(pg_dsn)
    hook.create_slot("s1")
    xids = workload(cur, 30)
    uri = str(tmp_path / "stage")
    before = hook.slot_info("s1").confirmed_flush_lsn

    code = run_child(dsn=pg_dsn, slot="s1", publication="pub", staging_uri=uri, kill_at=kill_at,
                     max_changes=60, row_group_rows=5)

    assert code == KILLED
    visible = StagingReader.from_uri(uri, "s1").batches()
    slot_after_crash = hook.slot_info("s1").confirmed_flush_lsn
    state = LEFT_BEHIND[kill_at]
    if state.startswith("published"):
        assert len(visible) == 1  # published, and complete
        assert slot_after_crash == (visible[0].end_lsn if state.endswith("advanced") else before)
    else:
        assert visible == [] and slot_after_crash == before  # nothing visible, nothing consumed
        [leftover] = leftovers(uri)
        assert leftover.startswith(PARTIAL_PREFIX) is (state == "partial"), leftover

    xids += workload(cur, 5, start=30)  # life goes on between the crash and the retry
    for _ in range(20):
        if not drain_slot(hook, DrainConfig(slot="s1", publication="pub", staging_uri=uri, max_changes=60,
                                            row_group_rows=5)).staged:
            break
    hook.close()
    assert_log_matches(uri, "s1", xids)
    assert leftovers(uri) == []


def test_two_drains_racing_on_one_slot_stage_each_transaction_once(pg_conn, pg_dsn, tmp_path):
    cur = pg_conn.cursor()
    cur.execute(SCHEMA_SQL)
    hook = PgLogicalHook.from_dsn(pg_dsn)
    hook.create_slot("s1")
    xids = workload(cur, 30)
    uri = str(tmp_path / "stage")
    args = json.dumps({"dsn": pg_dsn, "slot": "s1", "publication": "pub", "staging_uri": uri, "kill_at": "never",
                       "max_changes": 20})
    procs = [subprocess.Popen([sys.executable, "-m", "tests.support.drain_child", args], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    for code, err in outcomes:
        assert code == 0 or "SlotActiveError" in err, err[-3000:]
    while drain_slot(hook, DrainConfig(slot="s1", publication="pub", staging_uri=uri, max_changes=20)).staged:
        pass
    hook.close()
    assert_log_matches(uri, "s1", xids)
    assert leftovers(uri) == []
