"""This process's environment: variables set for a block (the in-process apply of the CLI and of the Airflow
worker: a lake's credentials, an operator's ``env_vars``; the benchmarks' switches), tuning variables read as
whole numbers, and the user's cache directory."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def scoped(variables: Mapping[str, str]) -> Iterator[None]:
    """``variables`` set in ``os.environ`` for the block, the previous values (or their absence) put back after it."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update({name: str(value) for name, value in variables.items()})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def whole_number(name: str, default: int, unit: str, zero: str, error: Callable[[str], Exception]) -> int:
    """Variable ``name`` as a count of ``unit`` (``default`` when unset or blank; ``zero``: what 0 means). Anything
    else, or a negative count, raises ``error`` with one line naming 0 and the default."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise error(f"{name}={text!r} is not a whole number of {unit} ({zero}; unset means {default})") from None
    if value < 0:
        raise error(f"{name}={value} is negative ({zero}; unset means {default})")
    return value


def user_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """This package's directory in the user's cache: ``$XDG_CACHE_HOME/pglogical``, else ``~/.cache/pglogical``."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("XDG_CACHE_HOME") or Path(environ.get("HOME") or Path.home()) / ".cache") / "pglogical"
