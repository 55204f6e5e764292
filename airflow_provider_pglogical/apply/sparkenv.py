"""Which Python and which ``spark-submit`` a local Spark started by this package uses: the package's own.

PySpark launches Python workers with the ``PYSPARK_PYTHON`` environment variable, read once when
the SparkContext starts (default ``python3`` from PATH); the ``spark.pyspark.python`` setting is
only read by spark-submit. A user who calls ``.venv/bin/pglogical`` without activating the venv
has the system's ``python3`` on PATH, which cannot import pyarrow or this package, so every place
that starts Spark goes through this module. A user's own ``PYSPARK_PYTHON`` always wins.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_pglogical.exceptions import SparkStartError
from airflow_provider_pglogical.text import backquoted

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_SUBMIT = "spark-submit"
SPARK_CONNECT_SCHEME = "sc://"  # a Spark Connect server's URL (``sc://host:port``)
# Local Spark talks to itself only: bind to loopback instead of whatever the hostname resolves to
# (an unresolvable container hostname would otherwise stop the driver from starting).
LOCAL_DRIVER_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
# What every Spark session the apply runs in is given (built with it, or set at runtime on a session handed over or
# a Spark Connect client's): TIME columns (time64 Parquet) are refused without timeType; timestamps without time
# zone stay wall-clock microseconds in UTC; names resolve case-sensitively, as PostgreSQL's do (columns "Val" and val
# of one table, tables "T" and t of one schema are distinct; Spark's default would merge or refuse them); no
# ${…} substitution in SQL text (it runs over backtick-quoted names too: a column "x${spark.app.name}" would read
# another column); staged Parquet read as written, with the types the apply builds for it in process
# (``executor_reads.spark_schema``): a timestamp without time zone as ``timestamp_ntz`` (not the session's local
# time), bytes as binary (not text). The last two are Spark's defaults, pinned so a server's own defaults cannot
# type a column otherwise (a Delta table created before would then get another type).
SESSION_CONF = {"spark.sql.session.timeZone": "UTC", "spark.sql.timeType.enabled": "true",
                "spark.sql.caseSensitive": "true", "spark.sql.variable.substitute": "false",
                "spark.sql.parquet.inferTimestampNTZ.enabled": "true", "spark.sql.parquet.binaryAsString": "false"}
_CONNECT_TOKEN = re.compile(r"(;\s*token\s*=)[^;]*", re.IGNORECASE)  # a Connect URL's parameters: /;key=value;…


def quoted(name: str) -> str:
    """Column ``name`` as Spark's parser reads it back as one name: backticked, backticks doubled. ``F.col``, names
    given to ``select``/``groupBy``/``Window.partitionBy`` and ``withField`` parse a bare name: ``a.b`` is field ``b``
    of column ``a`` (or another column's value), while a PostgreSQL column may be named ``"a.b"``."""
    return backquoted(name)


def quoted_all(names: Iterable[str]) -> list[str]:
    """``quoted`` of each name, for ``select``/``groupBy`` of columns by name."""
    return [quoted(n) for n in names]


def is_local(master: str | None) -> bool:
    """Whether ``master`` runs Spark on this machine: ``local``, ``local[N]``, ``local[*]`` and ``local-cluster[…]``
    (executors in JVMs of their own, still on this machine). Host names that merely start with "local"
    (``localhost``, ``local-spark.corp``, a standalone ``local:7077``) are not."""
    return master == "local" or (master or "").startswith(("local[", "local-cluster["))


def session_is_local(master: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a session asked for with ``master`` runs on this machine: a local master, and no ``SPARK_REMOTE`` in
    the environment (pyspark then builds a Spark Connect client whatever the master says)."""
    environ = os.environ if environ is None else environ
    return is_local(master) and "SPARK_REMOTE" not in environ


def is_remote(master: str | None) -> bool:
    """Whether ``master`` is a Spark Connect URL (the session is a client; no JVM in this process)."""
    return (master or "").startswith(SPARK_CONNECT_SCHEME)


def redacted(master: str | None) -> str:
    """``master`` fit for a log line: a Spark Connect URL's ``token`` parameter (``sc://h:p/;token=…``) masked."""
    return _CONNECT_TOKEN.sub(r"\1***", master or "")


def package_python_env(environ: Mapping[str, str] | None = None, python: str | None = None) -> dict[str, str]:
    """``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON``: ``python`` if given, else the user's, else this interpreter."""
    environ = os.environ if environ is None else environ
    workers = python or environ.get("PYSPARK_PYTHON") or sys.executable
    driver = python or environ.get("PYSPARK_DRIVER_PYTHON") or workers
    return {"PYSPARK_PYTHON": workers, "PYSPARK_DRIVER_PYTHON": driver}


def use_package_python() -> None:
    """Before starting a local Spark in this process: its Python workers run this interpreter
    (unless the user exported ``PYSPARK_PYTHON``)."""
    os.environ.update(package_python_env())


def spark_submit_env(master: str | None, python: str | None = None,
                     environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment additions for a ``spark-submit`` child process.

    Local masters get the package's interpreter (``find-spark-home``, the driver and the workers
    all run ``PYSPARK_*``). When ``spark-submit`` is not on PATH (venv not activated) but was
    installed with pyspark next to this interpreter, that ``bin`` directory is appended to PATH
    (after the user's own entries, so an installed Spark distribution still wins).
    """
    environ = os.environ if environ is None else environ
    env = package_python_env(environ, python) if is_local(master) else {}
    path = environ.get("PATH", os.defpath)
    package_bin = Path(sys.executable).parent
    if shutil.which(SPARK_SUBMIT, path=path) is None and (package_bin / SPARK_SUBMIT).exists():
        env["PATH"] = os.pathsep.join(p for p in (path, str(package_bin)) if p)
    return env


def task_slots(spark: SparkSession) -> int:
    """How many tasks to split a job of small tasks into, read through the session's conf (a Spark Connect
    session has no SparkContext to ask for its default parallelism): ``spark.default.parallelism`` when
    set, else ``spark.sql.shuffle.partitions``."""
    value = spark.conf.get("spark.default.parallelism", None) or spark.conf.get("spark.sql.shuffle.partitions", None)
    return max(1, int(value or 1))


def set_conf(session: SparkSession, settings: Mapping[str, str]) -> None:
    """``settings`` set on ``session``: in one request to a Spark Connect server (each ``conf.set`` is a round trip
    of its own), one by one on a classic session. A setting the server refuses raises its error; the ones before it
    in ``settings`` may be set."""
    if not settings:
        return
    set_all = getattr(session.conf, "_set_all", None) if is_connect(session) else None
    if set_all is not None:
        set_all(dict(settings), silent=False)
        return
    for key, value in settings.items():
        session.conf.set(key, value)


def is_connect(spark: object) -> bool:
    """Whether ``spark`` is a Spark Connect session (a client of a ``sc://`` server: no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def jars_version(pyspark_dir: Path) -> str | None:
    """The Spark version of the jars a pip-installed ``pyspark`` ships (``jars/spark-core_<scala>-<version>.jar``);
    None without them (``pyspark-client`` alone, or a Spark distribution's ``python/`` under ``SPARK_HOME``)."""
    for jar in sorted((pyspark_dir / "jars").glob("spark-core_*.jar")):
        return jar.name.removesuffix(".jar").rsplit("-", 1)[1]
    return None


def pyspark_mismatch(python_version: str, pyspark_dir: Path) -> str | None:
    """Why this pyspark cannot start a classic session, or None.

    ``pyspark-client`` (which the Spark provider pulls) installs its own copy of pyspark's Python files into the
    same ``pyspark/`` folder: when its version differs from ``pyspark``'s, whichever was installed last wins, and
    Python files of one Spark drive the jars of another. Reinstalling ``pyspark`` alone puts its files back.
    """
    jars = jars_version(pyspark_dir)
    if jars is None or jars == python_version:
        return None
    return (f"pyspark's Python files are {python_version} but its jars are {jars} (pyspark-client {python_version} "
            f"overwrote them): pip install --force-reinstall --no-deps pyspark=={jars}")


def check_pyspark_install() -> None:
    """Before a classic (JVM) session starts in this process: its Python files and jars are one Spark."""
    import pyspark

    problem = pyspark_mismatch(pyspark.__version__, Path(pyspark.__file__).resolve().parent)
    if problem:
        raise SparkStartError(problem)
