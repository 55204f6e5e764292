"""Variables set in this process's environment for a block: the in-process apply of the CLI and of the Airflow
worker (a lake's credentials, an operator's ``env_vars``), and the benchmarks' switches."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


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
