"""A class-data-sharing (AppCDS) archive of Spark's classes for the JVMs this package starts on this machine.

A local Spark JVM that applies a small batch lives seconds and spends much of its CPU loading, parsing and
verifying the same few thousand Spark classes. The JVM can map them ready-made from an archive written at the exit
of one representative run (JDK 13+: ``-XX:ArchiveClassesAtExit``, a dynamic archive on top of the JDK's own), which
later JVMs name with ``-XX:SharedArchiveFile``.

Which JVMs: the driver of a local master (``local``, ``local[*]``) that the ``pglogical`` CLI starts
(``pipeline/runs.py``) or the DAG's spark-submit starts (``operators/apply.py``). Never a cluster's JVMs (a
``spark://``, ``yarn`` or ``k8s://`` master's): they are not ours, and a path of this machine means nothing there.

Where: one file per (JDK, pyspark's jars, this training app) in ``$PGLOGICAL_JVM_ARCHIVE_DIR``, else
``$XDG_CACHE_HOME/pglogical/jvm``, else ``~/.cache/pglogical/jvm``; a directory that cannot be written means no
archive, silently. The first local JVM that finds none starts a writer in the background (a niced process of its
own, which runs ``TRAINING_APP`` through spark-submit and outlives the command); a file lock makes one writer of
concurrent ones write it, and the file appears by an atomic rename, so no JVM maps half of it. A writer that fails
leaves a marker so later runs do not try again for the same JDK and jars.

When the JVM cannot use it, it loads its classes from the jars as before, silently (``QUIET``): a stale or damaged
file, another JDK, a class path that does not start with the one it was written with. The known case is a
``SPARK_CONF_DIR``: spark-submit puts that directory first on the driver's class path and the JVM refuses an
archive whose class path held a non-empty directory, so with ``SPARK_CONF_DIR`` (or a ``SPARK_HOME`` other than
pyspark's own) this module adds nothing.

Off: ``PGLOGICAL_JVM_ARCHIVE=off``, or any class-sharing choice of the user's own in the driver's options
(``-Xshare:off``, ``-XX:SharedArchiveFile=…`` in the spec's ``spark.driver.extraJavaOptions``, ``SPARK_SUBMIT_OPTS``
or ``JAVA_TOOL_OPTIONS``), which this module then leaves alone. Otherwise its options are appended to the user's
``spark.driver.extraJavaOptions``, never replacing them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from airflow_provider_pglogical.environ import user_cache_dir

SWITCH = "PGLOGICAL_JVM_ARCHIVE"  # "off" (or 0, false, no): no archive options, no writer
DIR_VARIABLE = "PGLOGICAL_JVM_ARCHIVE_DIR"
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
OFF_VALUES = {"0", "off", "false", "no"}
# Options of the user's that already decide about class sharing: the module then adds nothing.
USER_CHOICES = ("-Xshare", "-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit", "-XX:+AutoCreateSharedArchive")
# A JVM that cannot use the archive says so on stdout (unified logging's default), which a command's output would
# carry: those lines are off.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# JDK 17 maps the archive at a random address and then relocates every pointer in it (most of a second of CPU for
# Spark's classes); mapped where it was written (it falls back to relocating when that address is taken) it costs
# about half a CPU-second less per JVM.
AT_ITS_ADDRESS = "-XX:+UnlockDiagnosticVMOptions -XX:ArchiveRelocationMode=0"
# What the archive is written from: a local session through spark-submit (the route of the CLI's and the DAG's
# JVMs) running the kinds of job an apply runs (SQL, a shuffle, a window, Parquet written and read, Arrow batches
# through Python both ways, a persisted frame). A class it does not load is loaded from its jar as before.
TRAINING_APP = """
import sys
from pyspark.sql import SparkSession, Window, functions as F
spark = SparkSession.builder.getOrCreate()
out = sys.argv[1]
df = spark.createDataFrame([(i, str(i), i % 3) for i in range(200)], "id long, v string, p int")
df.groupBy((df.id % 7).alias("k")).count().orderBy("k").collect()
df.write.mode("overwrite").partitionBy("p").parquet(out)
spark.read.parquet(out).where("id > 3").join(df.select("id"), "id").selectExpr("sum(id)", "max(v)").collect()
kept = df.mapInArrow(lambda batches: (b for b in batches), df.schema).persist()
kept.withColumn("r", F.row_number().over(Window.partitionBy("p").orderBy(F.col("id").desc()))).where("r = 1").toArrow()
spark.createDataFrame(kept.toArrow()).count()
kept.unpersist()
spark.stop()
"""
WRITE_TIMEOUT_S = 900
# All the writer's environment: what finds the JDK and the cache directory (never a task's secrets).
WRITER_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "JAVA_HOME", "XDG_CACHE_HOME",
              DIR_VARIABLE)


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get(SWITCH, "").strip().lower() not in OFF_VALUES


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the archives live: ``$PGLOGICAL_JVM_ARCHIVE_DIR``, else the user's cache directory's ``pglogical/jvm``."""
    environ = os.environ if environ is None else environ
    if environ.get(DIR_VARIABLE):
        return Path(environ[DIR_VARIABLE])
    return user_cache_dir(environ) / "jvm"


def pyspark_dir() -> Path | None:
    """pyspark's installed folder (its ``jars/`` and ``bin/spark-submit``), found without importing it."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).resolve().parent
    return folder if (folder / "jars").is_dir() else None


def java_binary(environ: Mapping[str, str] | None = None) -> Path | None:
    """The ``java`` spark-submit runs: ``$JAVA_HOME/bin/java``, else the one on PATH (resolved: the JDK's own file)."""
    environ = os.environ if environ is None else environ
    home = environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java", path=environ.get("PATH"))
    return Path(java).resolve() if java and Path(java).exists() else None


def archive_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The archive of this JDK and pyspark's jars (there or not yet); None without either."""
    jars, java = pyspark_dir(), java_binary(environ)
    if jars is None or java is None:
        return None
    key = hashlib.sha256(TRAINING_APP.encode())
    key.update(f"{java}:{java.stat().st_mtime_ns}".encode())
    for jar in sorted((jars / "jars").glob("*.jar")):
        stat = jar.stat()
        key.update(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache_dir(environ) / f"spark-{key.hexdigest()[:20]}.jsa"


def archive_options(path: Path) -> str:
    """The JVM options that map ``path`` (harmless where it is missing or does not fit: the JVM goes on without)."""
    return f"-XX:SharedArchiveFile={path} {AT_ITS_ADDRESS} {QUIET}"


def user_chose(options: str) -> bool:
    """Whether JVM options ``options`` already decide about class sharing (the user's choice wins)."""
    # Split as the shell splits SPARK_SUBMIT_OPTS (on blanks, quotes kept): none of these options holds a blank.
    return any(word.startswith(USER_CHOICES) for word in options.split())


def _fits(master: str | None, environ: Mapping[str, str], user_options: str) -> bool:
    if not (master or "").startswith("local") or not enabled(environ):
        return False
    if environ.get("SPARK_CONF_DIR"):
        return False  # first on the driver's class path: the JVM would refuse the archive
    home, own = environ.get("SPARK_HOME"), pyspark_dir()
    if home and (own is None or Path(home).resolve() != own):
        return False  # another Spark's jars
    return not any(user_chose(text) for text in (user_options, environ.get("SPARK_SUBMIT_OPTS", ""),
                                                 environ.get("JAVA_TOOL_OPTIONS", "")))


def driver_conf(master: str | None, conf: Mapping[str, str], environ: Mapping[str, str] | None = None,
                *, write: bool = True) -> dict[str, str]:
    """``conf`` with the archive's options appended to ``spark.driver.extraJavaOptions`` for a local master.

    Unchanged (a copy) for any other master, when switched off, when the user's options already decide about class
    sharing, or when there is no archive yet — then, with ``write``, a background writer is started for the next
    JVMs (``start_writer``).
    """
    environ = os.environ if environ is None else environ
    out = dict(conf)
    user_options = out.get(DRIVER_OPTIONS, "")
    if not _fits(master, environ, user_options):
        return out
    path = archive_path(environ)
    if path is None or any(c.isspace() or c in "'\"\\" for c in str(path)):
        return out  # Spark splits extraJavaOptions on blanks: such a path would become the JVM's main class
    if not path.exists():
        if write:
            start_writer(environ)
        return out
    out[DRIVER_OPTIONS] = f"{user_options} {archive_options(path)}".strip()
    return out


def _writer_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {key: environ[key] for key in WRITER_ENV if key in environ}


def _marker(path: Path) -> Path:
    return path.with_suffix(".failed")


def start_writer(environ: Mapping[str, str] | None = None) -> bool:
    """Start writing the archive in a background process of its own (niced, detached: it outlives this command)
    unless it is there, a writer holds its lock, or writing failed before for this JDK and these jars. Returns
    whether a writer started. An unwritable cache directory means no writer, silently."""
    environ = os.environ if environ is None else environ
    path = archive_path(environ)
    if path is None or path.exists() or _marker(path).exists():
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released at once: the writer takes it for good
        subprocess.Popen([sys.executable, "-m", __name__], env=_writer_env(environ), start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         cwd=path.parent)
    except OSError:  # unwritable, or a writer holds the lock (BlockingIOError)
        return False
    return True


def ensure_archive(*, wait: bool = True, timeout: float = WRITE_TIMEOUT_S,
                   environ: Mapping[str, str] | None = None) -> Path | None:
    """Write the archive unless it is there; returns it. None without pyspark or a JDK, with an unwritable cache
    directory, if writing failed (now or before: the ``.failed`` marker), or if another process is writing it and
    ``wait`` is false. JVMs started meanwhile load their classes as before; those started once it is in place use
    it (its path is fixed)."""
    environ = os.environ if environ is None else environ
    path = archive_path(environ)
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 - held across the write below
    except OSError:
        return None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        if path.exists():
            return path
        if _marker(path).exists():
            return None
        try:
            written = _write(path, environ, timeout)
        except subprocess.TimeoutExpired:
            return None  # a busy machine, not a JVM that cannot write: a later run tries again
        except (OSError, subprocess.SubprocessError):
            written = False
        if written is None:
            return None
        if not written:
            with contextlib.suppress(OSError):
                _marker(path).touch()
            return None
    return path


def _write(path: Path, environ: Mapping[str, str], timeout: float) -> bool | None:
    """Run the training app with ``-XX:ArchiveClassesAtExit`` into a scratch file, check that a JVM starts with it
    and the options its users get, then publish it by rename. False: this JDK and these jars cannot have one;
    None: the writer was killed, a later run may try again."""
    spark = pyspark_dir()
    if spark is None:
        return False
    with tempfile.TemporaryDirectory(prefix="pglogical-cds-") as scratch:
        app, dumped = Path(scratch) / "train.py", Path(scratch) / "spark.jsa"
        app.write_text(TRAINING_APP)
        # The class path the archive is written with must be the one its users start with: pyspark's jars alone
        # (no SPARK_CONF_DIR, no SPARK_HOME of another Spark).
        env = {**_writer_env(environ), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        command = [str(spark / "bin" / "spark-submit"), "--master", "local[2]",
                   "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
                   "--conf", "spark.driver.bindAddress=127.0.0.1",
                   "--conf", f"{DRIVER_OPTIONS}=-XX:ArchiveClassesAtExit={dumped} {QUIET}",
                   str(app), str(Path(scratch) / "out")]
        result = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                                check=False)
        if result.returncode < 0:
            return None
        if result.returncode != 0 or not dumped.exists() or dumped.stat().st_size == 0:
            return False
        java = java_binary(environ)
        # Every option a user's JVM gets with the archive must start a JVM of this JDK (an option it does not know
        # would stop every local driver from starting).
        if java is None or subprocess.run([str(java), *archive_options(dumped).split(), "-version"], env=env,
                                          stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                                          check=False).returncode != 0:
            return False
        # Copied next to its final name (the scratch directory may be another file system), then renamed there:
        # a JVM opening the final name finds the whole file or none.
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        shutil.copyfile(dumped, partial)
        os.replace(partial, path)
    return True


def main(argv: list[str] | None = None) -> int:
    """The background writer (``python -m airflow_provider_pglogical.apply.jvm_archive``)."""
    parser = argparse.ArgumentParser(description="Write the class archive of Spark's classes for local JVMs.")
    parser.add_argument("--wait", action="store_true", help="wait for another writer instead of leaving")
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError):
        os.nice(10)  # the user's own work comes first
    return 0 if ensure_archive(wait=args.wait) is not None else 1


if __name__ == "__main__":
    sys.exit(main())
