"""Spill directories that a killed process cannot leave behind for good.

A netting spills into a private directory it removes when it ends (``partitioned.netted``), but a process killed
meanwhile (OOM killer, ``SIGKILL``, a lost container) cannot remove it, and a scheduled pipeline would pile such
directories up in the temporary directory for months. So each directory holds a lock file that its process keeps
locked (``flock``) as long as it uses the directory: the kernel releases the lock when the process dies, however it
dies. Whoever opens a new spill directory first removes the directories of the same prefix under the same base whose
lock it can take (``sweep``): their owners are gone. The lock file takes its name only once locked, so a sweep never
sees a live directory's lock free; a directory without it (its process was killed between creating it and locking
it, or it is being created at this moment, or an older version made it) is left alone.

``flock`` is local to a machine: two machines sharing the spill directory over a network file system may not see
each other's locks, so give each machine a spill directory of its own (``PGLOGICAL_APPLY_SPILL_DIR``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator

LOCK_NAME = ".owner.lock"


@contextlib.contextmanager
def claimed(base: str, prefix: str) -> Iterator[str]:
    """A new directory ``prefix*`` under ``base``, locked for this process while the block runs and removed after it,
    whether the block succeeds or fails; first, the abandoned directories of that prefix are removed. Raises the
    ``OSError`` of creating or locking it (the caller names the way out)."""
    sweep(base, prefix)
    directory = tempfile.mkdtemp(prefix=prefix, dir=base)
    fd = -1
    try:
        # locked before it takes the name a sweep looks for, so no sweep ever sees it unlocked
        fresh = os.path.join(directory, LOCK_NAME + ".new")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a file nobody else has opened
        os.rename(fresh, os.path.join(directory, LOCK_NAME))
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if fd >= 0:
            os.close(fd)


def sweep(base: str, prefix: str) -> list[str]:
    """Remove the directories ``prefix*`` under ``base`` whose owner is gone (their lock is free); the removed ones.
    Best effort: a directory that cannot be read or removed is left for a later sweep."""
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    removed = []
    for name in names:
        directory = os.path.join(base, name)
        if not name.startswith(prefix) or not os.path.isdir(directory) or os.path.islink(directory):
            continue
        try:
            fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # no lock file yet (or not ours to read): maybe a directory being created right now
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its owner is alive
                continue
            shutil.rmtree(directory, ignore_errors=True)
            if not os.path.exists(directory):
                removed.append(directory)
        finally:
            os.close(fd)
    return removed
