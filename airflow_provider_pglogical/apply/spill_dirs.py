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
each other's locks, so give each machine a spill directory of its own (``PGLOGICAL_APPLY_SPILL_DIR``). On a file
system that refuses ``flock`` the directory is used without a lock, as a directory no sweep removes. A sweep only
looks at directories of this user, and never blocks on what another user may have planted in a shared ``/tmp``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator

LOCK_NAME = ".owner.lock"
# flock refused by the file system itself (not a lock held by someone): such a directory is used unlocked
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


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
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a file nobody else has opened
        except OSError as e:
            if e.errno not in NO_LOCKS:
                raise
        else:  # a file system without flock (some NFS mounts): unnamed, so no sweep ever takes it for abandoned
            os.rename(fresh, os.path.join(directory, LOCK_NAME))
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if fd >= 0:
            os.close(fd)


def sweep(base: str, prefix: str) -> list[str]:
    """Remove the directories ``prefix*`` under ``base`` that this user owns and whose owner process is gone (their
    lock is free); the removed ones. Best effort: a directory that cannot be read or removed is left for a later
    sweep (its lock file goes last, so it stays recognisable). Never waits: in a shared temporary directory another
    user may plant anything under the prefix (a FIFO for a lock file would block an ``open``)."""
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    removed = []
    for name in names:
        directory = os.path.join(base, name)
        try:
            found = os.lstat(directory)
        except OSError:
            continue
        if not name.startswith(prefix) or not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
            continue
        try:
            fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # no lock file (being created, made without flock, or by an older version): left alone
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its owner is alive
                continue
            if _remove_lock_last(directory):
                removed.append(directory)
        finally:
            os.close(fd)
    return removed


def _remove_lock_last(directory: str) -> bool:
    """Remove an abandoned directory, its lock file last; whether it is gone."""
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name == LOCK_NAME:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
        os.unlink(os.path.join(directory, LOCK_NAME))
        os.rmdir(directory)
    except OSError:
        return False
    return True
