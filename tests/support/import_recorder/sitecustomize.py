"""Loaded by every Python process started with this folder on PYTHONPATH (tests/support/imports.py): writes the
names of the modules the process imported to $PGLOGICAL_IMPORTED_MODULES when it exits, and where each package of
$PGLOGICAL_WATCHED_IMPORTS was first imported from (the stack) to that file's ``.stacks`` twin at once."""

import atexit
import os
import sys
import traceback

_RECORD = os.environ.get("PGLOGICAL_IMPORTED_MODULES")
_WATCHED = set(filter(None, os.environ.get("PGLOGICAL_WATCHED_IMPORTS", "").split(",")))


def _write() -> None:
    with open(_RECORD, "w") as out:
        out.write("\n".join(sorted(sys.modules)))


class _Watch:
    """A finder that finds nothing: it only notes the stack of a watched package's first import."""

    def find_spec(self, name, path=None, target=None):
        if name in _WATCHED and name not in sys.modules:
            _WATCHED.discard(name)
            with open(f"{_RECORD}.stacks", "a") as out:
                out.write(f"== {name} (process {os.getpid()}: {' '.join(sys.argv)[:200]})\n")
                out.write("".join(traceback.format_stack(limit=40)))
        return None


if _RECORD:
    atexit.register(_write)
    if _WATCHED:
        sys.meta_path.insert(0, _Watch())
