"""What the crash tests' child processes share: they die with ``KILLED`` (no cleanup) at a named checkpoint."""

from __future__ import annotations

import os
from collections.abc import Callable

KILLED = 137  # the exit status of a process killed with SIGKILL, as the parent test expects it


def die() -> None:
    os._exit(KILLED)


def dying_at(kill_at: str) -> Callable[[str], None]:
    """An ``on_checkpoint`` callback that dies at ``kill_at``: a checkpoint name, or ``name:n`` for its n-th time."""
    name, _, nth = kill_at.partition(":")
    times = int(nth or 1)
    seen = 0

    def checkpoint(point: str) -> None:
        nonlocal seen
        if point == name:
            seen += 1
            if seen >= times:
                die()

    return checkpoint
