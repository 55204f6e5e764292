"""Spill directories left by killed processes (``apply/spill_dirs.py``): a process killed with ``SIGKILL`` while it
holds a spill directory leaves it, and the next netting under the same base removes it; the directory of a live
process, one without a lock file and other names are left alone; a netting's own directory is locked while the
netting runs; a sweep never blocks on a FIFO planted as a lock file, nor follows links; on a file system refusing
``flock`` the netting still runs, its directory unlocked and left alone by sweeps."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from airflow_provider_pglogical.apply import direct, partitioned, spill_dirs
from tests.unit.apply.conftest import ITEMS
from tests.unit.apply.test_kernels import _staged
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
    batch, _, net, spill = _compacted(tmp_path, monkeypatch, "1")
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
        expected = direct.compacted_rows(_staged(batch, ITEMS), net).num_rows
        assert expected and first.num_rows + sum(b.num_rows for b in netting) == expected
        assert set(spill.iterdir()) == {held, unlocked, other}  # its own removed when it ended
    finally:
        alive.kill()
        alive.wait()
    assert spill_dirs.sweep(str(spill), partitioned.SPILL_PREFIX) == [str(held)]  # once its owner is gone
    assert set(spill.iterdir()) == {unlocked, other}


def test_a_sweep_never_blocks_on_what_another_user_planted_and_skips_what_is_not_a_directory(tmp_path) -> None:
    planted = tmp_path / "pglogical-net-planted"
    planted.mkdir()
    os.mkfifo(planted / spill_dirs.LOCK_NAME)  # opening a FIFO to read waits for a writer
    (tmp_path / "pglogical-net-a-file").write_text("")
    (tmp_path / "pglogical-net-a-link").symlink_to(planted)
    swept: list[list[str]] = []
    sweeping = threading.Thread(target=lambda: swept.append(spill_dirs.sweep(str(tmp_path), "pglogical-net-")),
                                daemon=True)
    sweeping.start()
    sweeping.join(30)
    assert not sweeping.is_alive() and swept == [[]]
    assert {p.name for p in tmp_path.iterdir()} == {"pglogical-net-planted", "pglogical-net-a-file",
                                                   "pglogical-net-a-link"}


def test_on_a_file_system_refusing_flock_the_netting_spills_unlocked_and_no_sweep_takes_its_directory(
        tmp_path, monkeypatch) -> None:
    batch, _, net, spill = _compacted(tmp_path, monkeypatch, "1")

    def refused(fd: int, operation: int) -> None:  # what an NFS mount without a lock manager answers
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(spill_dirs.fcntl, "flock", refused)
    netting = direct.compacted_batches(direct.staged_chunks(net.files), net)
    first = next(netting)
    (own,) = spill.iterdir()
    monkeypatch.setattr(spill_dirs.fcntl, "flock", fcntl.flock)
    assert not (own / spill_dirs.LOCK_NAME).exists()
    assert spill_dirs.sweep(str(spill), partitioned.SPILL_PREFIX) == [] and own.exists()
    expected = direct.compacted_rows(_staged(batch, ITEMS), net).num_rows
    assert first.num_rows + sum(b.num_rows for b in netting) == expected
    assert list(spill.iterdir()) == []
