"""A class-data-sharing (AppCDS) archive of Spark's classes for the JVMs the suite starts.

A test JVM (the CLI's spark-submit, a local session, a crash test's child) lives seconds and spends most of its
CPU loading, parsing and verifying the same few thousand Spark classes. The JVM can map them ready-made from an
archive written at the exit of one representative run (``-XX:ArchiveClassesAtExit``, a dynamic archive on top
of the JDK's own): a local session and a small job took 9.5 CPU-seconds without it and 5.8 with it.

The archive only serves a JVM whose class path starts with the one it was written with (pyspark's ``jars/``, no
``SPARK_CONF_DIR`` on it: the launcher puts that directory first, and the JVM refuses non-empty directories) and
whose jars are unchanged; any other JVM (a standalone worker, a Spark Connect server, a stale archive) silently
loads its classes as before, because the options below turn the archive's log lines off. Its file name hashes the
JVM, the jars and the options, so a new pyspark or JDK gets a new archive; it lives in the temp directory, shared by
the runs and the xdist workers of the machine (a file lock makes one of them write it while the
others go on without it).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The suite's JIT and collector options (tests/support/spark.py): the archive is written with them, and its users
# run with the same collector.
BASE_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# A JVM that cannot use the archive says so on stdout (unified logging's default), which a command's output
# would carry: those lines are off.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# JDK 17 maps the archive at a random address and then relocates every pointer in it (most of a second of CPU
# for Spark's classes); mapped where it was written (it falls back to relocating when that address is taken)
# it costs about half a CPU-second less per JVM.
AT_ITS_ADDRESS = "-XX:+UnlockDiagnosticVMOptions -XX:ArchiveRelocationMode=0"
# What the archive is written from: a local session through spark-submit (the CLI's route) running the kinds of
# job the suite's Spark runs (SQL, a shuffle, a window, Parquet written and read, Arrow batches through Python
# both ways, a persisted frame). A class it does not load is loaded from its jar as before.
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


def _jars_dir() -> Path | None:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    jars = Path(spec.origin).parent / "jars"
    return jars if jars.is_dir() else None


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    return Path(java).resolve() if java and Path(java).exists() else None


def archive_path() -> Path | None:
    """Where the archive of this venv's pyspark and this JDK is (or will be); None without either."""
    jars, java = _jars_dir(), _java()
    if jars is None or java is None:
        return None
    key = hashlib.sha1(f"{BASE_JVM_OPTIONS}\n{TRAINING_APP}".encode())
    key.update(f"{java}:{java.stat().st_mtime_ns}".encode())
    for jar in sorted(jars.glob("*.jar")):
        stat = jar.stat()
        key.update(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return Path(tempfile.gettempdir()) / "pglogical-spark-cds" / f"spark-{key.hexdigest()[:16]}.jsa"


def archive_jvm_options() -> str:
    """The JVM options that use the archive (harmless before it is written, or for a JVM it does not fit)."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {AT_ITS_ADDRESS} {QUIET}" if path else ""


def ensure_archive(*, wait: bool = True, timeout: float = 600) -> Path | None:
    """Write the archive unless it is there; returns it. None if this machine has no pyspark or JDK, if writing
    failed, or if another process is writing it and ``wait`` is false: the JVMs started meanwhile load their
    classes as they would without it, and those started once it is in place use it (its path is fixed)."""
    path = archive_path()
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another xdist worker is writing it
            return None
        if path.exists():
            return path
        with tempfile.TemporaryDirectory(prefix="pglogical-cds-") as scratch:
            app, partial = Path(scratch) / "train.py", Path(scratch) / "spark.jsa"
            app.write_text(TRAINING_APP)
            env = {key: value for key, value in os.environ.items() if not key.startswith(("SPARK_", "PYSPARK_"))}
            env["PYSPARK_PYTHON"] = sys.executable
            command = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
                       "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
                       "--conf", "spark.driver.bindAddress=127.0.0.1",
                       "--conf", f"spark.driver.extraJavaOptions={BASE_JVM_OPTIONS} "
                                 f"-XX:ArchiveClassesAtExit={partial} {QUIET}",
                       str(app), str(Path(scratch) / "out")]
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
            if result.returncode != 0 or not partial.exists() or partial.stat().st_size == 0:
                return None
            shutil.move(partial, path.with_suffix(".partial"))  # then renamed: readers never see half a file
            os.replace(path.with_suffix(".partial"), path)
    return path
