"""Builds the optional C helpers; everything else is in pyproject.toml.

``optional=True``: without a compiler (or Python headers) the install still succeeds and the
package uses its pure-Python paths (``airflow_provider_pglogical.decoding.speedups`` says which).

The helpers link libpq when its headers are found (``pg_config``, or ``PG_CONFIG=/path/to/pg_config``;
Debian/Ubuntu ``libpq-dev``, RHEL ``libpq-devel``): the drain's binary COPY fetch opens its own libpq
connections. Without them the module is built without that fetch (``PGLOGICAL_LIBPQ`` undefined) and
slot rows go through psycopg2's named cursor.

``PGLOGICAL_PURE_WHEEL=1`` builds without the extension: the ``py3-none-any`` wheel that installs where
no binary wheel fits and no compiler is at hand (``make dist`` builds it beside the manylinux wheels).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup


def libpq_dirs() -> tuple[str, str] | None:
    """(include dir, lib dir) of a libpq with headers, or None."""
    pg_config = os.environ.get("PG_CONFIG") or shutil.which("pg_config")
    if pg_config:
        try:
            include, lib = (subprocess.run([pg_config, flag], check=True, capture_output=True, text=True).stdout.strip()
                            for flag in ("--includedir", "--libdir"))
        except (OSError, subprocess.CalledProcessError):
            include = lib = ""
        if include and (Path(include) / "libpq-fe.h").is_file():
            return include, lib
    for include in ("/usr/include/postgresql", "/usr/include/pgsql", "/usr/include"):
        if (Path(include) / "libpq-fe.h").is_file():
            return include, ""
    return None


libpq = libpq_dirs()
speedups = Extension(
    "airflow_provider_pglogical.decoding._speedups", ["airflow_provider_pglogical/decoding/_speedups.c"],
    extra_compile_args=["-O2"], optional=True,
    **({"define_macros": [("PGLOGICAL_LIBPQ", "1")], "include_dirs": [libpq[0]],
        "library_dirs": [libpq[1]] if libpq[1] else [], "libraries": ["pq"]} if libpq else {}),
)
setup(ext_modules=[] if os.environ.get("PGLOGICAL_PURE_WHEEL", "").strip() not in ("", "0") else [speedups])
