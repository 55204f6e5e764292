"""The suite's JVMs map Spark's classes from the product's class archive (``apply/jvm_archive.py``).

A test JVM (the CLI's spark-submit, a local session, a crash test's child) lives seconds and spends most of its
CPU loading, parsing and verifying the same few thousand Spark classes; mapped from the archive, a local session
and a small job took 5.8 CPU-seconds instead of 9.5. The product writes and uses that archive for the local JVMs
it starts; the suite uses the same one, written once per machine in the temp directory (``ARCHIVE_DIR``), shared by
the runs and the xdist workers (the product's file lock makes one of them write it while the others go on
without it). The suite's own JVMs name it in ``TEST_JVM_OPTIONS`` (tests/support/spark.py), so the product adds
nothing to theirs; a `pglogical` or Airflow command a test runs as a user gets ``PGLOGICAL_JVM_ARCHIVE_DIR``
passed through (scripts/harness/userenv.py: a throwaway HOME would otherwise make every such command write an
archive of its own in the background).

The archive only serves a JVM whose class path starts with the one it was written with (pyspark's ``jars/``, no
``SPARK_CONF_DIR`` on it: the launcher puts that directory first, and the JVM refuses non-empty directories) and
whose jars are unchanged; any other JVM silently loads its classes as before. The suite's standalone cluster
(its master, workers and executors) and Spark Connect server run from pyspark's own ``jars/`` too, so they are
given the same options (tests/support/cluster.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from airflow_provider_pglogical.apply import jvm_archive

# The suite's JIT and collector options (tests/support/spark.py): test-only choices, which the archive (written
# with the JVM's defaults) serves as well.
BASE_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
ARCHIVE_DIR = Path(tempfile.gettempdir()) / "pglogical-spark-cds"
# Every product call in the suite's processes (and, through userenv, in the commands it runs) finds it here.
os.environ.setdefault(jvm_archive.DIR_VARIABLE, str(ARCHIVE_DIR))


def archive_path() -> Path | None:
    """Where the archive of this venv's pyspark and this JDK is (or will be); None without either."""
    return jvm_archive.archive_path()


def archive_jvm_options() -> str:
    """The JVM options that use the archive (harmless before it is written, or for a JVM it does not fit)."""
    path = archive_path()
    return jvm_archive.archive_options(path) if path else ""


def ensure_archive(*, wait: bool = True, timeout: float = 600) -> Path | None:
    """Write the archive unless it is there (``jvm_archive.ensure_archive``); returns it, or None if this machine
    has no pyspark or JDK, if writing failed, or if another process is writing it and ``wait`` is false."""
    return jvm_archive.ensure_archive(wait=wait, timeout=timeout)
