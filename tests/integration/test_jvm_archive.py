"""`pglogical run` and the class archive of Spark's classes (apply/jvm_archive.py), with real JVMs: a run that
needs Spark maps Spark's classes from the machine's archive (the suite's, written by the product's writer once per
machine) and leaves it as it is, and a damaged archive costs nothing but the mapping. That a run finding no archive
starts the writer in the background, once, is tests/unit/apply/test_jvm_archive.py's (writing one takes a minute
of CPU).

Each run's driver JVM logs where every class came from, through an option of the spec's own
``spark.driver.extraJavaOptions`` (which the archive's options are appended to, so the spec's keep working)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import yaml

from airflow_provider_pglogical.apply import jvm_archive
from scripts.harness.pgserver import drop_database, execute, make_database, query
from tests.support.classarchive import ensure_archive
from tests.support.cli import pglogical

ITEMS = "SELECT id, qty, label FROM items ORDER BY id"
SPARK_CONTEXT = " org.apache.spark.SparkContext "
FROM_ARCHIVE = "source: shared objects file (top)"


@pytest.fixture
def pipeline(pg_server, pg_dsn, pg_dbname, tmp_path):
    """A source with ``items``, an empty target, a local[2] spec whose driver logs its class loading into
    ``logs/``, and a class-archive cache directory of the test's own."""
    target = make_database(pg_server)
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, label text);")
    logs = tmp_path / "logs"
    logs.mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": "archive_pub", "slot": "archive_slot", "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
        "tables": {"public.items": {}},
        "spark": {"master": "local[2]", "conf": {
            "spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={logs}/load-%p.log"}},
    }))
    # Keys repeating in every batch, netted by Spark (nothing in process): every run with changes starts a JVM.
    env = {jvm_archive.DIR_VARIABLE: str(tmp_path / "cache"), "PGLOGICAL_APPLY_INPROCESS_ROWS": "0"}
    try:
        yield {"spec": str(spec), "source": pg_dsn, "target": pg_server.dsn(target), "logs": logs, "env": env,
               "cache": tmp_path / "cache"}
    finally:
        drop_database(pg_server, target)


def run_with_changes(pipeline: dict[str, Any], base: int) -> tuple[dict[str, Any], list[str]]:
    """A batch whose keys repeat, then ``pglogical run``: its JSON and the driver's class-load lines of SparkContext."""
    execute(pipeline["source"], f"""BEGIN;
        INSERT INTO items SELECT g, g, 'new' FROM generate_series({base}, {base + 19}) g;
        UPDATE items SET qty = qty + 1, label = 'changed' WHERE id BETWEEN {base} AND {base + 9};
        COMMIT;""")
    for log in pipeline["logs"].glob("*.log"):
        log.unlink()
    result = pglogical("run", "--spec", pipeline["spec"], extra=pipeline["env"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["apply"]["batches_applied"] == 1 and summary["apply"]["spark_started"] is True
    assert query(pipeline["target"], ITEMS) == query(pipeline["source"], ITEMS)
    assert "cds" not in result.stderr.lower() and "shared archive" not in result.stdout.lower()
    loads = [line for log in pipeline["logs"].glob("load-*.log") for line in log.read_text().splitlines()
             if SPARK_CONTEXT in line]
    assert loads, "the spec's own JVM option did not reach the driver"
    return summary, loads


def test_a_run_that_needs_spark_maps_sparks_classes_from_the_machines_archive(pipeline):
    archive = ensure_archive(wait=True)
    assert archive is not None, "no class archive written: is java or pyspark missing?"
    env = {**pipeline["env"], jvm_archive.DIR_VARIABLE: str(archive.parent)}
    assert archive == jvm_archive.archive_path({**os.environ, **env})
    written = archive.stat().st_mtime_ns
    first = pglogical("run", "--spec", pipeline["spec"], extra=env)  # creates publication and slot
    assert first.returncode == 0, first.stderr[-3000:]

    _, loads = run_with_changes({**pipeline, "env": env}, 1)
    assert all(FROM_ARCHIVE in line for line in loads), loads
    assert archive.stat().st_mtime_ns == written  # used as it is, never written again


def test_a_damaged_archive_does_not_fail_the_run(pipeline):
    first = pglogical("run", "--spec", pipeline["spec"], extra=pipeline["env"])
    assert first.returncode == 0, first.stderr[-3000:]
    archive = jvm_archive.archive_path({**os.environ, **pipeline["env"]})
    assert archive is not None
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"\x00not a class archive\x00" * 4096)
    _, loads = run_with_changes(pipeline, 1)
    assert not any(FROM_ARCHIVE in line for line in loads), loads  # its classes came from the jars, as before
    assert archive.read_bytes().startswith(b"\x00not a class archive")  # left alone: not rewritten every run
