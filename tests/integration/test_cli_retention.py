"""Staging retention through the real CLI: batches pruned only once every target of a staging area applied them,
crash-safe and idempotent pruning, the replay window's error and its way out, and ``status``'s summary."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from airflow_provider_pglogical.exceptions import StagingPrunedError
from airflow_provider_pglogical.pipeline.operators import WalRetentionCheckOperator
from airflow_provider_pglogical.pipeline.retention import check_window, prune
from airflow_provider_pglogical.pipeline.runs import decode_pending
from airflow_provider_pglogical.pipeline.spec import load_spec
from airflow_provider_pglogical.staging.layout import MANIFEST, StagingLayout
from airflow_provider_pglogical.staging.reader import StagingReader
from airflow_provider_pglogical.staging.retention import CHECKPOINTS, read_pruned
from scripts.harness.pgserver import drop_database, execute, make_database, query
from tests.support.cli import create_replication, error_line, pglogical, run_ok
from tests.support.spark import TEST_SPARK_CONF

SLOT, PUBLICATION = "keep_slot", "keep_pub"


@pytest.fixture
def pipeline(pg_server, pg_dsn, pg_dbname, tmp_path):
    """A source table, two empty target databases, and ``spec(name, target, retention)`` writing a spec over the one
    slot and staging area into target ``a`` or ``b``."""
    targets = {"a": make_database(pg_server), "b": make_database(pg_server)}
    execute(pg_dsn, "CREATE TABLE public.items (id int PRIMARY KEY, name text)")

    def spec(name: str, target: str = "a", retention: dict | None = None, staging: str | None = None) -> str:
        doc = {"source": {"dsn": pg_server.uri(pg_dbname), "publication": PUBLICATION, "slot": SLOT, "create": True},
               "staging": {"uri": staging or str(tmp_path / "staging"),
                           **({"retention": retention} if retention else {})},
               "target": {"kind": "postgres", "dsn": pg_server.uri(targets[target])},
               "tables": {"public.items": {}}, "spark": {"master": "local[1]", "conf": dict(TEST_SPARK_CONF)}}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return str(path)

    try:
        yield {"spec": spec, "source": pg_dsn, "staging": tmp_path / "staging",
               "target": {k: pg_server.dsn(v) for k, v in targets.items()}}
    finally:
        for name in targets.values():
            drop_database(pg_server, name)


def stage(p, spec: str, *ids: int) -> None:
    """One staged batch per id: a row inserted on the source, then a drain in this process (``decode_pending``, what
    `pglogical decode` runs, after ``create_replication`` made the slot: a process per batch would only add its
    start-up to the setup of the retention under test, which the commands below run as processes). An S3 staging's
    credentials are in this process's environment (the ``s3`` fixture)."""
    for i in ids:
        execute(p["source"], f"INSERT INTO public.items VALUES ({i}, 'n{i}')")
        assert decode_pending(load_spec(spec))["changes"] == 1


def rows(dsn: str) -> list[tuple]:
    return query(dsn, "SELECT id, name FROM public.items ORDER BY id")


def staged(spec: str) -> list[tuple[int, int]]:
    s = load_spec(spec)
    return [(b.start_lsn, b.end_lsn) for b in StagingReader.from_uri(s.staging.uri, s.source.slot).batches()]


def verify_all(spec: str) -> None:
    s = load_spec(spec)
    reader = StagingReader.from_uri(s.staging.uri, s.source.slot)
    for ref in reader.batches():  # contiguous (raises on a gap), and every file as its manifest records it
        reader.verify(ref)


def test_a_second_target_on_the_same_staging_keeps_the_batches_it_has_not_applied(pipeline):
    p = pipeline
    keep = {"keep_batches": 1}
    spec_a, spec_b = p["spec"]("a", "a", keep), p["spec"]("b", "b", keep)
    create_replication(spec_a)
    stage(p, spec_a, 1)
    first = staged(spec_a)
    run_ok("apply", "--spec", spec_b)  # b applies the first batch and is known to the staging area from now on
    stage(p, spec_a, 2, 3, 4)
    assert len(staged(spec_a)) == 4

    applied_a = run_ok("apply", "--spec", spec_a)
    assert applied_a["batches_applied"] == 4
    retention = applied_a["retention"]
    # a has applied all four, b only the first: only that one may go (b's position holds the rest)
    assert retention["pruned_batches"] == 1 and retention["kept_batches"] == 3
    assert len(retention["targets"]) == 2 and retention["held_by"] != [retention["target"]]
    assert staged(spec_a) == staged(spec_b)[-3:] and staged(spec_a)[0][0] == first[0][1]
    verify_all(spec_a)

    status_a = run_ok("status", "--spec", spec_a)["staging"]
    status_b = run_ok("status", "--spec", spec_b)["staging"]
    assert status_a["batch_count"] == 3 and status_a["pending_batches"] == 0 and "batches" not in status_a
    assert status_b["pending_batches"] == 3 and status_a["targets"] == status_b["targets"]
    assert status_a["pruned"]["batches"] == 1 and status_a["oldest_start_lsn"] == status_a["pruned"]["through_lsn"]

    applied_b = run_ok("apply", "--spec", spec_b)  # b catches up: now both have applied everything
    assert applied_b["batches_applied"] == 3 and applied_b["retention"]["pruned_batches"] == 2
    assert len(staged(spec_a)) == 1
    assert rows(p["target"]["a"]) == rows(p["target"]["b"]) == rows(p["source"]) == [
        (i, f"n{i}") for i in range(1, 5)]
    again = run_ok("prune", "--spec", spec_a)
    assert again["pruned_batches"] == 0 and again["kept_batches"] == 1 and again["pruned"]["batches"] == 3


def test_a_crashed_prune_leaves_verifiable_staging_and_the_next_prune_finishes_it(pipeline):
    p = pipeline
    spec = p["spec"]("plain")
    create_replication(spec)
    stage(p, spec, 1, 2, 3, 4, 5)
    assert run_ok("apply", "--spec", spec)["retention"]["retention"] is None  # no retention: nothing pruned
    batches = staged(spec)
    assert len(batches) == 5
    assert "staging.retention is not set" in error_line(pglogical("prune", "--spec", spec))
    kept = p["spec"]("kept", retention={"keep_batches": 1})
    layout = StagingLayout.from_uri(str(p["staging"]), SLOT)
    plan = run_ok("prune", "--spec", kept, "--dry-run")
    assert plan["dry_run"] is True and plan["pruned_batches"] == 4 and plan["kept_batches"] == 1
    assert staged(kept) == batches and read_pruned(layout) is None  # a dry run removes and records nothing

    class Crash(Exception):
        pass

    def crash_at(name: str, nth: int):
        seen = []

        def checkpoint(point: str) -> None:
            seen.append(point)
            if seen.count(name) == nth:
                raise Crash(point)
        return checkpoint

    for name, nth in (("recorded", 1), ("manifest_removed", 1), ("batch_removed", 1), ("manifest_removed", 2)):
        with pytest.raises(Crash):
            prune(load_spec(kept), on_checkpoint=crash_at(name, nth))
        verify_all(kept)  # whatever is visible is whole and contiguous
        visible = staged(kept)
        assert visible == batches[len(batches) - len(visible):] and visible[-1] == batches[-1]
    assert set(CHECKPOINTS) == {"recorded", "manifest_removed", "batch_removed"}
    # the last crash removed a manifest but not its files: a directory no reader sees
    assert any(not (Path(path) / MANIFEST).exists() for _s, _e, path in layout.list_batch_dirs())

    done = run_ok("prune", "--spec", kept)
    assert staged(kept) == batches[-1:] and done["pruned"]["batches"] == 4  # each batch counted once
    assert len(layout.list_batch_dirs()) == 1
    assert read_pruned(layout).through_lsn == batches[-1][0]
    assert run_ok("prune", "--spec", kept)["pruned_batches"] == 0  # idempotent
    verify_all(kept)
    execute(p["source"], "INSERT INTO public.items VALUES (6, 'n6')")
    run_ok("run", "--spec", kept)  # the drain goes on from the newest batch, which always stays
    assert rows(p["target"]["a"]) == rows(p["source"])


def test_replay_of_a_pruned_range_fails_naming_it_and_a_resync_is_the_way_out(pipeline):
    p = pipeline
    spec = p["spec"]("a", retention={"keep_batches": 1})
    create_replication(spec)
    stage(p, spec, 1, 2, 3)
    assert run_ok("apply", "--spec", spec)["retention"]["pruned_batches"] == 2
    through = read_pruned(StagingLayout.from_uri(str(p["staging"]), SLOT)).through_lsn
    s = load_spec(spec)
    check_window(s)  # the target applied the pruned range: nothing to refuse
    with pytest.raises(StagingPrunedError, match="outside the replay window"):
        check_window(s, upto_lsn=through - 1)

    run_ok("reset", "--spec", spec, "--yes")
    status = run_ok("status", "--spec", spec)["staging"]
    assert None in status["targets"].values()  # the reset target holds every batch meanwhile
    with pytest.raises(StagingPrunedError, match="is pruned up to"):  # the pipeline DAG's check before its decode
        WalRetentionCheckOperator(task_id="check_wal_retention", spec=load_spec(spec)).execute({})
    line = error_line(pglogical("apply", "--spec", spec))
    assert "StagingPrunedError" not in line and "is pruned up to" in line and "2 batch(es)" in line
    assert "pglogical resync --spec" in line and "--table public.items" in line
    assert "n1" not in line  # names LSNs and tables, never row values
    assert rows(p["target"]["a"]) == []  # nothing was applied

    run_ok("resync", "--spec", spec, "--table", "public.items")  # the way out the error names
    run_ok("apply", "--spec", spec)
    assert rows(p["target"]["a"]) == rows(p["source"]) == [(i, f"n{i}") for i in range(1, 4)]


def test_retention_prunes_s3_staging_and_status_summarises_it(pipeline, s3):
    p = pipeline
    env = s3.env()
    spec = p["spec"]("s3", retention={"keep_batches": 2}, staging=f"s3://{s3.bucket}/staging")
    create_replication(spec)
    stage(p, spec, 1, 2, 3, 4)
    names = [f"{s:016X}-{e:016X}" for s, e in staged(spec)]
    run = run_ok("run", "--spec", spec, extra=env)
    assert run["retention"]["pruned_batches"] == 2
    keys = s3.keys(f"staging/{SLOT}/batches/")
    assert not [k for k in keys if names[0] in k or names[1] in k]
    assert [k for k in keys if names[3] in k and k.endswith(MANIFEST)]
    verify_all(spec)
    status = run_ok("status", "--spec", spec, extra=env)
    summary = status["staging"]
    assert summary["batch_count"] == 2 and summary["pending_batches"] == 0 and summary["bytes"] > 0
    assert summary["retention"] == {"keep_batches": 2, "keep_for_seconds": None}
    assert summary["last_end_lsn"] == status["target"]["watermarks"]["public.items"]
    listed = run_ok("status", "--spec", spec, "--batches", extra=env)["staging"]["batches"]
    assert [b["batch"] for b in listed] == names[2:]
    assert rows(p["target"]["a"]) == rows(p["source"])


def test_an_apply_whose_staging_cannot_be_written_stands_and_prunes_nothing(pipeline, monkeypatch):
    """The retention step after an apply, with staging credentials that may only read (the apply's own target record
    is then a warning too): a logged line, no failure, nothing pruned; ``pglogical prune`` itself fails."""
    from airflow_provider_pglogical.pipeline import retention

    p = pipeline
    spec = p["spec"]("a", retention={"keep_batches": 1})
    create_replication(spec)
    stage(p, spec, 1, 2)

    def refused(*_args: object, **_kwargs: object) -> None:
        raise PermissionError("AccessDenied")

    monkeypatch.setattr(retention, "record_position", refused)
    lines: list[str] = []
    result = prune(load_spec(spec), log=lines.append)
    assert result["recorded"] is False and result["pruned_batches"] == 0 and len(staged(spec)) == 2
    assert lines == [f"could not record how far target {result['target']} applied the staging of slot {SLOT}: "
                     "PermissionError; nothing pruned"]
    with pytest.raises(PermissionError):
        prune(load_spec(spec), require_settings=True)
