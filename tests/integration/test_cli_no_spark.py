"""`pglogical run` without a JVM: a run whose every table-batch the direct path covers applies in the pglogical
process and starts no Spark — keys changed once, and small batches whose keys change twice or keep unchanged-TOAST
values (netted in process by ``apply/kernels.py``); a batch that needs Spark's transforms (a row filter outside the
subset evaluated in process, keys that repeat with ``PGLOGICAL_APPLY_INPROCESS_ROWS=0``) still starts it; a batch
above the in-process bounds is netted in key partitions (``test_partitioned_inprocess_native.py``).
Filters the process evaluates: ``test_cli_row_filter_no_spark.py``. Either way the target ends equal to the
source."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts.harness.pgserver import drop_database, execute, make_database, query
from tests.integration.test_cli import pglogical
from tests.support.cli import create_replication
from tests.support.spark import TEST_SPARK_CONF

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, label text, price numeric(12,2), seen timestamptz);
CREATE TABLE docs (id int PRIMARY KEY, title text, body text);
"""
ITEMS = "SELECT id, qty, label, price, seen FROM items ORDER BY id"
DOCS = "SELECT id, title, md5(body) FROM docs ORDER BY id"
# On the replica identity: UPDATEs and DELETEs pass it. The cast leaves it to Spark (``apply/filter_eval.py``).
FILTER = "id::bigint % 2 = 0"


@pytest.fixture
def pipeline(pg_server, pg_dsn, pg_dbname, tmp_path):
    """Source with ``items`` and ``docs``, an empty target, a spec of both tables (plain: no filter, every action)."""
    target = make_database(pg_server)
    execute(pg_dsn, SCHEMA)
    doc = {
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": "nojvm_pub", "slot": "nojvm_slot", "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
        "tables": {"public.items": {}, "public.docs": {}},
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    try:
        yield {"doc": doc, "source": pg_dsn, "target": pg_server.dsn(target), "tmp": tmp_path}
    finally:
        drop_database(pg_server, target)


def spec_file(pipeline: dict[str, Any], name: str, row_filter: str | None = None, *, snapshot: bool = False) -> str:
    doc = json.loads(json.dumps(pipeline["doc"]))
    if snapshot:
        doc["snapshot"] = {"initial": True}
    if row_filter:
        doc["tables"]["public.items"]["row_filter"] = row_filter
    path = pipeline["tmp"] / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def run(spec: str, tmp: Path, *, java: bool, env: dict[str, str] | None = None) -> tuple[dict[str, Any], list[Path]]:
    """``pglogical run`` as a user runs it, with a temporary directory of its own; ``java=False``: with no Java
    (JAVA_HOME pointing nowhere: a JVM start fails the run). Its JSON (with its progress lines as ``stderr``) and
    the Spark log files it left there."""
    tmpdir = tmp / f"tmp-{len(list(tmp.glob('tmp-*')))}"
    tmpdir.mkdir()
    extra = {"TMPDIR": str(tmpdir), **(env or {})}
    if not java:
        extra["JAVA_HOME"] = str(tmp / "no-java-here")
    result: subprocess.CompletedProcess = pglogical("run", "--spec", spec, extra=extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return {**json.loads(result.stdout), "stderr": result.stderr}, sorted(tmpdir.glob("pglogical-spark-*.log"))


@pytest.mark.parametrize("read", ["sql", "stream"])
def test_plain_small_batches_are_applied_without_starting_spark(pipeline, read):
    """``source.read: stream`` too: the run reads the slot over a replication connection, the target ends equal."""
    pipeline["doc"]["source"]["read"] = read
    spec = spec_file(pipeline, "plain.yaml")
    first, _ = run(spec, pipeline["tmp"], java=False)  # creates publication and slot: nothing to apply
    assert first["apply"]["batches_seen"] == 0
    execute(pipeline["source"], """BEGIN;
        INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, '2026-01-01 00:00+00'::timestamptz + g * interval '1 h'
          FROM generate_series(1, 60) g;
        INSERT INTO docs VALUES (1, 'one', 'short'), (2, 'two', NULL);
        COMMIT;""")
    summary, logs = run(spec, pipeline["tmp"], java=False)
    assert summary["apply"]["batches_applied"] == 1 and summary["decode"]["changes"] == 62
    assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False and logs == []
    assert "applied without Spark" in summary["stderr"] and "starting Spark" not in summary["stderr"]
    assert query(pipeline["target"], ITEMS) == query(pipeline["source"], ITEMS)
    assert query(pipeline["target"], DOCS) == query(pipeline["source"], DOCS)

    # Updates (one moving its key), deletes and inserts, each key once in the batch: still no JVM.
    execute(pipeline["source"], """BEGIN;
        UPDATE items SET qty = qty + 100, label = NULL WHERE id BETWEEN 1 AND 20;
        UPDATE items SET id = 1000 WHERE id = 30;
        DELETE FROM items WHERE id BETWEEN 41 AND 50;
        INSERT INTO items SELECT g, g, NULL, NULL, NULL FROM generate_series(61, 80) g;
        DELETE FROM docs WHERE id = 2;
        COMMIT;""")
    summary, logs = run(spec, pipeline["tmp"], java=False)
    assert summary["apply"]["batches_applied"] == 1 and summary["apply"]["batches_replayed_in_order"] == 0
    assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False and logs == []
    assert summary["apply"]["rows"]["public.items"] == {"inserted": 21, "updated": 20, "deleted": 11,
                                                       "skipped_missing_update": 0}
    assert query(pipeline["target"], ITEMS) == query(pipeline["source"], ITEMS)
    assert query(pipeline["target"], DOCS) == query(pipeline["source"], DOCS)


def test_an_initial_snapshot_and_the_changes_after_it_load_without_starting_spark(pipeline):
    execute(pipeline["source"], """
        INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, now() FROM generate_series(1, 500) g;
        INSERT INTO docs VALUES (1, 'one', 'short');""")
    spec = spec_file(pipeline, "snapshot.yaml", snapshot=True)
    summary, logs = run(spec, pipeline["tmp"], java=False)  # slot created with the snapshot, which is loaded
    assert summary["decode"]["snapshot"]["initial"]["tables"]["public.items"]["rows"] == 500
    assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False and logs == []
    assert query(pipeline["target"], ITEMS) == query(pipeline["source"], ITEMS)
    execute(pipeline["source"], "UPDATE items SET qty = 0 WHERE id <= 50; DELETE FROM items WHERE id > 450;")
    summary, logs = run(spec, pipeline["tmp"], java=False)
    assert summary["apply"]["batches_applied"] == 1 and summary["spark"]["started"] is None and logs == []
    assert query(pipeline["target"], ITEMS) == query(pipeline["source"], ITEMS)
    assert query(pipeline["target"], DOCS) == query(pipeline["source"], DOCS)


def test_keys_changed_twice_a_key_change_and_unchanged_toast_are_netted_without_spark(pipeline):
    spec = spec_file(pipeline, "kernels.yaml")
    create_replication(spec)  # what a first run would create, before the source changes
    execute(pipeline["source"], """BEGIN;
        INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, now() FROM generate_series(1, 40) g;
        INSERT INTO docs SELECT d, 'doc', string_agg(md5((g * d)::text), '') FROM generate_series(1, 4000) g,
          generate_series(1, 3) d GROUP BY d;
        COMMIT;""")
    summary, logs = run(spec, pipeline["tmp"], java=False)
    assert summary["apply"]["batches_applied"] == 1 and summary["spark"]["started"] is None
    execute(pipeline["source"], """
        UPDATE items SET qty = qty + 1 WHERE id <= 5;
        UPDATE items SET label = 'x' WHERE id <= 3;
        UPDATE items SET id = 1000 WHERE id = 10;
        UPDATE items SET qty = -1 WHERE id = 1000;
        DELETE FROM items WHERE id = 20;
        INSERT INTO items VALUES (20, 7, 'again', NULL, NULL);
        UPDATE docs SET title = 'renamed' WHERE id = 1;
        UPDATE docs SET title = 'twice' WHERE id = 1;
        UPDATE docs SET id = 30 WHERE id = 2;
        DELETE FROM docs WHERE id = 3;""")
    summary, logs = run(spec, pipeline["tmp"], java=False)  # no Java: a JVM start would fail the run
    assert summary["apply"]["batches_applied"] == 1 and summary["apply"]["batches_replayed_in_order"] == 0
    assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False and logs == []
    assert "applied without Spark" in summary["stderr"] and "starting Spark" not in summary["stderr"]
    assert query(pipeline["target"], ITEMS) == query(pipeline["source"], ITEMS)
    assert query(pipeline["target"], DOCS) == query(pipeline["source"], DOCS)  # the TOASTed bodies kept and moved


# What a batch holds that only Spark's transforms apply, with the run's Spark start it leads to.
NEEDS_SPARK = {
    # keys changed twice with the in-process netting switched off: Spark's compaction nets them
    "repeated key": (None, "UPDATE items SET qty = qty + 1 WHERE id <= 5; UPDATE items SET label = 'x' WHERE id <= 3;",
                     "for the apply", {"PGLOGICAL_APPLY_INPROCESS_ROWS": "0"}),
    # a row filter with a cast: the spec rules the direct path out, so Spark starts while the drain runs
    "row filter": (FILTER, "UPDATE items SET qty = qty + 1 WHERE id <= 10; DELETE FROM items WHERE id = 20;",
                   "during the drain", {}),
}


@pytest.mark.parametrize("case", list(NEEDS_SPARK))
def test_a_batch_that_needs_spark_starts_it_and_ends_equal(pipeline, case):
    row_filter, changes, started, env = NEEDS_SPARK[case]
    spec = spec_file(pipeline, "spark.yaml", row_filter)
    create_replication(spec)  # what a first run would create, before the source changes
    execute(pipeline["source"], """BEGIN;
        INSERT INTO items SELECT g, g, md5(g::text), g * 0.01, now() FROM generate_series(1, 40) g;
        INSERT INTO docs SELECT 1, 'one', string_agg(md5(g::text), '') FROM generate_series(1, 4000) g;
        COMMIT;""")
    if row_filter is None:
        summary, logs = run(spec, pipeline["tmp"], java=False)
        assert summary["apply"]["batches_applied"] == 1 and summary["spark"]["started"] is None  # plain inserts: no JVM
    else:
        # The spec rules the direct path out for every batch: the inserts are only staged here (no JVM), and the run
        # below applies them and the changes on the one Spark it starts.
        decoded = pglogical("decode", "--spec", spec)
        assert decoded.returncode == 0, decoded.stderr[-3000:]
        assert json.loads(decoded.stdout)["changes"] == 41
    execute(pipeline["source"], changes)
    summary, logs = run(spec, pipeline["tmp"], java=True, env=env)
    assert summary["apply"]["batches_applied"] == (1 if row_filter is None else 2)
    assert summary["spark"]["started"] == started and summary["apply"]["spark_started"] is True
    # The JVM's own output went to a log file in the run's temporary directory, not to the terminal, and the file
    # went with the run's success.
    assert logs == [] and "log4j" not in summary["stderr"]
    when = "in the background: the drain has changes" if row_filter else "for the apply: a staged batch needs Spark"
    assert f"starting Spark (local[2]) {when}" in summary["stderr"]
    source_items = ITEMS.replace("ORDER BY", f"WHERE {row_filter} ORDER BY") if row_filter else ITEMS
    assert query(pipeline["target"], ITEMS) == query(pipeline["source"], source_items)
    assert query(pipeline["target"], DOCS) == query(pipeline["source"], DOCS)
