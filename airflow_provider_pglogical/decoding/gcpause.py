"""Pause Python's cyclic garbage collector around bulk decoding.

Decoding a batch allocates millions of small acyclic objects (message bytes, row changes) that
live until their row group is written. The cyclic collector cannot free any of them, yet it
keeps re-scanning the growing buffer: measured here it took ~40% of the time spent feeding
rows. Reference counting still frees everything as usual; only cycle detection waits until the
block ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic GC inside the block; restore the previous state after (nesting is safe)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
