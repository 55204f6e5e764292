"""Spill directories left by killed processes (``apply/spill_dirs.py``): a process killed with ``SIGKILL`` while it
holds a spill directory leaves it, and the next netting under the same base removes it; the directory of a live
process, one without a lock file and other names are left alone; a netting's own directory is locked while the
netting runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from airflow_provider_pglogical.apply import direct, partitioned, spill_dirs
from tests.unit.apply.test_partitioned import _compacted

HOLDER = """
import sys, time
from airflow_provider_pglogical.apply import spill_dirs
with spill_dirs.claimed(sys.argv[1], "pglogical-net-") as directory:
    with open(directory + "/part-0.arrow", "wb") as f:
        f.write(b"x" * 4096)
    print(directory, flush=True)
    time.sleep(600)
"""


def _holder(base: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process holding a spill directory under ``base`` (with a partial spill file), and that directory."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(base)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    return child, Path(child.stdout.readline().strip())


def test_a_killed_processs_spill_directory_is_removed_by_the_next_netting(tmp_path, monkeypatch) -> None:
    _, _, net, spill = _compacted(tmp_path, monkeypatch, "1")
    killed, abandoned = _holder(spill)
    alive, held = _holder(spill)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        assert (abandoned / "part-0.arrow").exists()  # SIGKILL: nothing of the process's own cleanup ran
        unlocked = spill / "pglogical-net-being-created"  # no lock file yet: maybe a process between two steps
        unlocked.mkdir()
        other = spill / "someone-else"
        other.mkdir()

        netting = direct.compacted_batches(direct.staged_chunks(net.files), net)
        first = next(netting)
        assert not abandoned.exists()
        (own,) = set(spill.iterdir()) - {held, unlocked, other}
        assert spill_dirs.sweep(str(spill), partitioned.SPILL_PREFIX) == []  # the netting's own is locked
        assert (own / spill_dirs.LOCK_NAME).exists() and held.exists()
        assert first.num_rows + sum(b.num_rows for b in netting)
        assert set(spill.iterdir()) == {held, unlocked, other}  # its own removed when it ended
    finally:
        alive.kill()
        alive.wait()
    assert spill_dirs.sweep(str(spill), partitioned.SPILL_PREFIX) == [str(held)]  # once its owner is gone
    assert set(spill.iterdir()) == {unlocked, other}
