"""The DAG's apply task's "nothing to apply" check (``idle_reports``, apply/without_spark.py) on random target states
against a real PostgreSQL target and a real staging area (a snapshot and three change batches, staged once by the
pipeline): the check writes nothing (no target table created, no row or watermark moved, no snapshot file verified)
and agrees with the runner run next — "nothing to apply" with the runner's own reports exactly when the runner then
applies nothing, "work" exactly when it applies a snapshot or a batch."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.apply.targets.base import BatchReport
from airflow_provider_pglogical.apply.without_spark import idle_reports
from airflow_provider_pglogical.snapshot.layout import SnapshotLayout
from scripts.harness.pgserver import drop_database, execute, make_database, make_target, query
from scripts.harness.subscriber import drain_all
from tests.support.cli import run_ok

SLOT, PUBLICATION = "idle_slot", "idle_pub"
TABLES_SQL = "CREATE TABLE items (id int PRIMARY KEY, v text); CREATE TABLE notes (id int PRIMARY KEY, body text);"
# One transaction per batch; ``notes`` only changes in the second, so its watermark and ``items``' differ.
BATCHES = [
    "INSERT INTO items SELECT g, 'b1' FROM generate_series(100, 104) g; UPDATE items SET v = 'u1' WHERE id = 1;",
    "INSERT INTO notes VALUES (7, 'n7'); DELETE FROM items WHERE id = 2;",
    "UPDATE items SET v = 'u3' WHERE id BETWEEN 100 AND 102; INSERT INTO items VALUES (200, 'b3');",
]


@pytest.fixture(scope="module")
def staged(pg_server) -> Iterator[str]:
    """A staging area holding the initial snapshot of ``items`` and ``notes`` and one batch per ``BATCHES`` entry."""
    source = make_database(pg_server)
    dsn = pg_server.dsn(source)
    root = Path(tempfile.mkdtemp(prefix="pglogical-idle-"))
    try:
        execute(dsn, TABLES_SQL + "INSERT INTO items SELECT g, 's' FROM generate_series(1, 20) g;"
                     "INSERT INTO notes VALUES (1, 'n1');"
                     f"CREATE PUBLICATION {PUBLICATION} FOR TABLE items, notes;")
        spec = root / "spec.yaml"
        spec.write_text(yaml.safe_dump({
            "source": {"dsn": pg_server.uri(source), "publication": PUBLICATION, "slot": SLOT},
            "staging": {"uri": str(root / "staging")}, "target": {"kind": "postgres", "dsn": pg_server.uri(source)},
            "tables": {"public.items": {}, "public.notes": {}},
            "snapshot": {"initial": True}}))
        assert run_ok("decode", "--spec", str(spec))["snapshot"]["initial"]["tables"]["public.items"]["rows"] == 20
        for script in BATCHES:
            execute(dsn, f"BEGIN; {script} COMMIT;")
            assert drain_all(dsn, str(root / "staging"), slot=SLOT, publication=PUBLICATION) == 1
        yield str(root / "staging")
    finally:
        execute(pg_server.dsn(), f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                 f"WHERE slot_name = '{SLOT}'")
        drop_database(pg_server, source)
        shutil.rmtree(root, ignore_errors=True)


def config(staging: str, *, configured: bool, max_batches: int | None) -> ApplyConfig:
    tables = {"public.items": TableApplyConfig(), "public.notes": TableApplyConfig()} if configured else {}
    return ApplyConfig(slot=SLOT, staging_root=staging, tables=tables, max_batches=max_batches)


def target_state(dsn: str) -> dict[str, Any]:
    """Every table of the target with its rows (the progress and sync tables' watermarks among them)."""
    names = [n for (n,) in query(dsn, "SELECT schemaname || '.' || tablename FROM pg_tables WHERE schemaname NOT IN "
                                      "('pg_catalog', 'information_schema') ORDER BY 1")]
    return {n: query(dsn, f"SELECT * FROM {n} ORDER BY 1") for n in names}  # names from the catalog


def staging_state(staging: str) -> dict[str, str]:
    """Every staged file and its digest, but the records of the targets applied to (``target-*.json``: where a
    target's bookkeeping tables are, which any session of a new target writes)."""
    return {str(p.relative_to(staging)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(staging).rglob("*")) if p.is_file() and not p.name.startswith("target-")}


def summary(reports: list[BatchReport]) -> list[tuple[int, int, bool]]:
    return [(r.start_lsn, r.end_lsn, r.applied) for r in reports]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prior=st.none() | st.integers(0, 3), created=st.booleans(), configured=st.booleans(),
       max_batches=st.none() | st.integers(0, 3))
def test_the_idle_check_writes_nothing_and_agrees_with_the_runner(pg_server, staged, request, monkeypatch, prior,
                                                                   created, configured, max_batches):
    """``prior``: None, or the number of batches a first apply took (after the snapshot it loads); ``created``: the
    target's tables made beforehand (as a user's DDL); ``configured``: the tables listed, or every staged one."""
    spark = SparkOnDemand(lambda: request.getfixturevalue("spark"))  # started only if a step needs it
    dbname, dsn = make_target(pg_server)
    staging = tempfile.mkdtemp(prefix="pglogical-idle-staging-")
    try:
        shutil.copytree(staged, staging, dirs_exist_ok=True)
        if created:
            execute(dsn, TABLES_SQL)
        if prior is not None:
            apply_slot(spark, config(staging, configured=configured, max_batches=prior), dsn)
        cfg = config(staging, configured=configured, max_batches=max_batches)
        before, files = target_state(dsn), staging_state(staging)
        verified: list[Any] = []
        real_verify = SnapshotLayout.verify
        monkeypatch.setattr(SnapshotLayout, "verify", lambda self, *a, **k: verified.append(a) or real_verify(self, *a, **k))

        idle = idle_reports(cfg, dsn)

        after = target_state(dsn)
        # The session's own bookkeeping (progress and rejects tables) is the only thing a first session may create.
        assert {n: r for n, r in after.items() if n not in before} in ({}, {
            "public.pglogical_progress": [], "public.pglogical_rejects": []}), sorted(after)
        assert {n: after[n] for n in before} == before
        assert staging_state(staging) == files
        assert verified == []
        monkeypatch.undo()

        applied = apply_slot(spark, cfg, dsn)
        if idle is None:
            assert any(r.applied for r in applied), summary(applied)
        else:
            assert summary(idle) == summary(applied)
            assert not any(r.applied for r in applied)
    finally:
        drop_database(pg_server, dbname)
        shutil.rmtree(staging, ignore_errors=True)
