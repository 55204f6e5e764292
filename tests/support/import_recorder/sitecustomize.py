"""Loaded by every Python process started with this folder on PYTHONPATH (tests/support/imports.py): writes the
names of the modules the process imported to $PGLOGICAL_IMPORTED_MODULES when it exits."""

import atexit
import os
import sys


def _write() -> None:
    with open(os.environ["PGLOGICAL_IMPORTED_MODULES"], "w") as out:
        out.write("\n".join(sorted(sys.modules)))


if os.environ.get("PGLOGICAL_IMPORTED_MODULES"):
    atexit.register(_write)
