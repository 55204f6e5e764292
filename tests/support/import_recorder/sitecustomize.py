"""Loaded by every Python process started with this folder on PYTHONPATH (tests/support/imports.py): writes the
names of the modules the process imported to ``$PGLOGICAL_IMPORTED_MODULES.<pid>`` when it exits (one file per
process: a child that outlives its parent must not replace the parent's list), and where each package of
$PGLOGICAL_WATCHED_IMPORTS was first imported from (the stack) to the record's ``.stacks`` twin at once. The first
process (the command itself) writes its pid to the record's ``.root`` twin, so a reader can require its list."""

import atexit
import os
import sys
import traceback

_RECORD = os.environ.get("PGLOGICAL_IMPORTED_MODULES")
_WATCHED = set(filter(None, os.environ.get("PGLOGICAL_WATCHED_IMPORTS", "").split(",")))
_ROOT_SET = "PGLOGICAL_IMPORTED_MODULES_ROOT"


def _write() -> None:
    # The pid at exit, not at start: a forked child runs this handler too, and writes its own file.
    with open(f"{_RECORD}.{os.getpid()}", "w") as out:
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
    if _ROOT_SET not in os.environ:
        os.environ[_ROOT_SET] = str(os.getpid())  # inherited: the children know they are not the command
        with open(f"{_RECORD}.root", "w") as out:
            out.write(str(os.getpid()))
    atexit.register(_write)
    if _WATCHED:
        sys.meta_path.insert(0, _Watch())
