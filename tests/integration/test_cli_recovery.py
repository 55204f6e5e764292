"""Exactly once across pipelines sharing a target, and every error's way out followed through the real CLI."""

from __future__ import annotations

import json

import pytest
import yaml

from scripts.harness.pgserver import drop_database, execute, make_database, query
from tests.integration.test_cli import pglogical
from tests.support.cli import create_replication
from tests.support.spark import TEST_SPARK_CONF


@pytest.fixture
def two_pipelines(pg_server, pg_dsn, pg_dbname, tmp_path):
    """Two pipelines from one source into one target database: ``r028.events`` (keyless, insert-only) and
    ``public.accounts``, each with its own publication, slot and staging area."""
    target = make_database(pg_server)
    execute(pg_dsn, "CREATE SCHEMA r028",
            "CREATE TABLE r028.events (id int, note text)", "ALTER TABLE r028.events REPLICA IDENTITY FULL",
            "CREATE TABLE public.accounts (id int PRIMARY KEY, balance int)")
    execute(pg_server.dsn(target), "CREATE SCHEMA r028")

    def spec(name: str, table: str) -> str:
        doc = {"source": {"dsn": pg_server.uri(pg_dbname), "publication": f"{name}_pub", "slot": f"{name}_slot",
                          "create": True},
               "staging": {"uri": str(tmp_path / f"staging_{name}")},
               "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
               "tables": {table: {}}, "spark": {"master": "local[1]", "conf": dict(TEST_SPARK_CONF)}}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return str(path)

    try:
        yield {"events": spec("events", "r028.events"), "accounts": spec("accounts", "public.accounts"),
               "source": pg_dsn, "target": pg_server.dsn(target)}
    finally:
        drop_database(pg_server, target)


def run_ok(*args: str) -> dict:
    result = pglogical(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def events(dsn: str) -> list[tuple]:
    return query(dsn, "SELECT id, note FROM r028.events ORDER BY id")


def test_a_second_pipeline_creating_a_progress_table_elsewhere_does_not_make_the_first_apply_twice(two_pipelines):
    p = two_pipelines
    create_replication(p["events"])
    execute(p["source"], "INSERT INTO r028.events VALUES (16, 'a'), (17, 'b')")
    assert run_ok("run", "--spec", p["events"])["apply"]["batches_applied"] == 1
    # the other pipeline's tables are in public: its bookkeeping goes there, on the search path
    create_replication(p["accounts"])
    execute(p["source"], "INSERT INTO public.accounts VALUES (1, 10)")
    assert run_ok("run", "--spec", p["accounts"])["apply"]["batches_applied"] == 1
    assert query(p["target"], "SELECT to_regclass('pglogical_progress')::text") == [("pglogical_progress",)]

    execute(p["source"], "INSERT INTO r028.events VALUES (18, 'c')")
    assert run_ok("run", "--spec", p["events"])["apply"]["batches_applied"] == 1
    assert events(p["target"]) == events(p["source"]) == [(16, "a"), (17, "b"), (18, "c")]
    status = run_ok("status", "--spec", p["events"])
    assert set(status["target"]["watermarks"]) == {"r028.events"}


def test_watermarks_gone_after_batches_were_applied_stop_the_run_and_reset_is_the_way_out(two_pipelines):
    p = two_pipelines
    create_replication(p["events"])
    execute(p["source"], "INSERT INTO r028.events VALUES (16, 'a'), (17, 'b')")
    run_ok("run", "--spec", p["events"])
    execute(p["target"], "DROP TABLE r028.pglogical_progress")
    execute(p["source"], "INSERT INTO r028.events VALUES (18, 'c')")

    failed = pglogical("run", "--spec", p["events"])
    assert failed.returncode == 1
    [line] = [ln for ln in failed.stderr.splitlines() if "error:" in ln]
    assert line.startswith("pglogical run: error: slot events_slot has applied batches to this target")
    assert "`pglogical reset --spec FILE --yes`" in line
    assert events(p["target"]) == [(16, "a"), (17, "b")]  # nothing applied twice

    reset = run_ok("reset", "--spec", p["events"], "--yes")
    assert reset == {"truncated": ["r028.events"]}
    assert run_ok("run", "--spec", p["events"])["apply"]["batches_applied"] == 2
    assert events(p["target"]) == events(p["source"]) == [(16, "a"), (17, "b"), (18, "c")]


def accounts(dsn: str) -> list[tuple]:
    return query(dsn, "SELECT id, balance FROM public.accounts ORDER BY id")


def recreate_slot_losing_a_change(p: dict) -> None:
    """Stage and apply one row, then drop the slot, change the source, and let the next run recreate it."""
    create_replication(p["accounts"])
    execute(p["source"], "INSERT INTO public.accounts VALUES (1, 10)")
    run_ok("run", "--spec", p["accounts"])
    execute(p["source"], "SELECT pg_drop_replication_slot('accounts_slot')")
    execute(p["source"], "INSERT INTO public.accounts VALUES (2, 20)", "UPDATE public.accounts SET balance = 11")


def test_a_recreated_slot_stops_the_run_and_resyncing_the_named_tables_lets_it_run_again(two_pipelines):
    p = two_pipelines
    recreate_slot_losing_a_change(p)
    for _ in range(2):  # the same error every time: nothing was staged or advanced past it
        failed = pglogical("run", "--spec", p["accounts"])
        assert failed.returncode == 1
        [line] = [ln for ln in failed.stderr.splitlines() if "error:" in ln]
        assert "the slot was moved outside this drain (or recreated)" in line
        assert "pglogical resync --spec FILE --table public.accounts" in line and "--allow-gap" in line
    status = pglogical("status", "--spec", p["accounts"])
    assert status.returncode == 3 and "moved outside" in " ".join(json.loads(status.stdout)["problems"])

    run_ok("resync", "--spec", p["accounts"], "--table", "public.accounts")
    execute(p["source"], "INSERT INTO public.accounts VALUES (3, 30)")
    ran = run_ok("run", "--spec", p["accounts"])
    assert ran["apply"]["batches_applied"] >= 1
    assert accounts(p["target"]) == accounts(p["source"]) == [(1, 11), (2, 11), (3, 30)]
    assert pglogical("status", "--spec", p["accounts"]).returncode == 0


def test_allow_gap_accepts_losing_the_changes_a_recreated_slot_missed_and_the_pipeline_runs_on(two_pipelines):
    p = two_pipelines
    recreate_slot_losing_a_change(p)
    assert pglogical("run", "--spec", p["accounts"]).returncode == 1
    run_ok("run", "--spec", p["accounts"], "--allow-gap")
    execute(p["source"], "INSERT INTO public.accounts VALUES (3, 30)")
    run_ok("run", "--spec", p["accounts"])
    # the insert and update made while no slot existed are lost, as --allow-gap says; later changes apply
    assert accounts(p["target"]) == [(1, 10), (3, 30)]


def test_status_exits_non_zero_with_its_json_when_the_slot_of_a_staged_pipeline_is_missing(two_pipelines):
    p = two_pipelines
    create_replication(p["accounts"])
    execute(p["source"], "INSERT INTO public.accounts VALUES (1, 10)")
    run_ok("decode", "--spec", p["accounts"])
    assert pglogical("status", "--spec", p["accounts"]).returncode == 0
    execute(p["source"], "SELECT pg_drop_replication_slot('accounts_slot')")
    status = pglogical("status", "--spec", p["accounts"])
    assert status.returncode == 3
    body = json.loads(status.stdout)
    assert body["source"]["slot"] is None and body["problems"] == [
        "slot 'accounts_slot' does not exist but batches of it are staged"]


def test_a_column_list_naming_a_missing_column_fails_before_anything_is_staged(two_pipelines, tmp_path):
    p = two_pipelines
    doc = yaml.safe_load(open(p["accounts"]))
    doc["tables"]["public.accounts"] = {"columns": ["id", "balanse"]}
    spec = tmp_path / "columns.yaml"
    spec.write_text(yaml.safe_dump(doc))
    create_replication(p["accounts"])  # the slot exists
    execute(p["source"], "INSERT INTO public.accounts VALUES (1, 10)")
    before = query(p["source"], "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                "WHERE slot_name = 'accounts_slot'")
    for command, *flags in (("validate", "--source"), ("run",)):
        failed = pglogical(command, "--spec", str(spec), *flags)
        assert failed.returncode == 1
        assert failed.stderr.strip().splitlines()[-1] == (
            f"pglogical {command}: error: {spec}: tables.public.accounts.columns: column 'balanse' does not exist "
            "in public.accounts on the source")
    # A row filter's names too, with or without a column list: a quoted name keeps its case, as in PostgreSQL.
    doc["tables"]["public.accounts"] = {"row_filter": '"Balance" > 0'}
    spec.write_text(yaml.safe_dump(doc))
    failed = pglogical("validate", "--spec", str(spec), "--source")
    assert failed.returncode == 1 and failed.stderr.strip().splitlines()[-1] == (
        f"pglogical validate: error: {spec}: tables.public.accounts.row_filter: column(s) Balance do not exist in "
        'public.accounts on the source: "Balance" matches balance apart from case: quoted names keep their case, as '
        "in PostgreSQL; drop the quotes")
    doc["tables"]["public.accounts"] = {"row_filter": "Balance > 0"}  # the way out it names
    spec.write_text(yaml.safe_dump(doc))
    run_ok("validate", "--spec", str(spec), "--source")
    assert query(p["source"], "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                              "WHERE slot_name = 'accounts_slot'") == before
    assert not (tmp_path / "staging_accounts" / "accounts_slot" / "batches").exists() or not any(
        (tmp_path / "staging_accounts" / "accounts_slot" / "batches").iterdir())
    # the way out the error names: fix the column list; the run then stages and applies
    doc["tables"]["public.accounts"] = {"columns": ["id", "balance"]}
    spec.write_text(yaml.safe_dump(doc))
    run_ok("run", "--spec", str(spec))
    assert accounts(p["target"]) == [(1, 10)]


def test_a_target_refusing_a_batch_in_the_spark_apply_prints_one_line_on_stderr(two_pipelines):
    p = two_pipelines
    create_replication(p["accounts"])
    # a trigger on the target refuses the batch Spark staged (the Spark path, not the direct one)
    execute(p["target"], "CREATE TABLE public.accounts (id int PRIMARY KEY, balance int)",
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN RAISE EXCEPTION 'accounts are frozen'; END$$",
            "CREATE TRIGGER frozen BEFORE INSERT OR UPDATE ON public.accounts FOR EACH ROW EXECUTE FUNCTION refuse()")
    execute(p["source"], "INSERT INTO public.accounts VALUES (1, 100000)")
    spark_path = {"PGLOGICAL_APPLY_DIRECT": "0"}
    failed = pglogical("run", "--spec", p["accounts"], extra=spark_path)
    assert failed.returncode == 1
    lines = [ln for ln in failed.stderr.splitlines() if not ln.startswith("pglogical: ")]
    assert len(lines) == 1 and lines[0].startswith("pglogical run: error: "), failed.stderr[-5000:]
    assert "100000" not in lines[0]  # errors never carry row values
    # --debug re-raises whatever the command raised (cli.main), whichever path applied: the same refused batch on
    # the direct path shows its traceback without a second JVM (the Spark path's error is the run's, above)
    debug = pglogical("--debug", "apply", "--spec", p["accounts"])
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "accounts are frozen" in debug.stderr
    assert "py4j" not in debug.stderr and "pyspark" not in debug.stderr  # the direct path's traceback


def test_an_initial_snapshot_asked_of_an_existing_slot_runs_after_the_way_out_its_error_names(two_pipelines, tmp_path):
    p = two_pipelines
    execute(p["source"], "INSERT INTO public.accounts VALUES (1, 10), (2, 20)")
    create_replication(p["accounts"])  # the slot exists, created without a snapshot
    doc = yaml.safe_load(open(p["accounts"]))
    spec = tmp_path / "initial.yaml"
    spec.write_text(yaml.safe_dump({**doc, "snapshot": {"initial": True}}))
    failed = pglogical("run", "--spec", str(spec))
    assert failed.returncode == 1
    assert "Set snapshot.initial: false and resync tables one by one (pglogical resync --spec FILE --table " \
           "schema.table)" in failed.stderr
    # the way out: initial: false, then resync the tables
    spec.write_text(yaml.safe_dump({**doc, "snapshot": {"initial": False}}))
    run_ok("resync", "--spec", str(spec), "--table", "public.accounts")
    execute(p["source"], "INSERT INTO public.accounts VALUES (3, 30)")
    run_ok("run", "--spec", str(spec))
    assert accounts(p["target"]) == accounts(p["source"]) == [(1, 10), (2, 20), (3, 30)]


def test_status_sees_no_gap_where_the_drain_replays_a_published_batch(two_pipelines, tmp_path):
    """A drain killed between a batch's manifest and the slot's advance leaves the slot at that batch's start,
    behind the staged log's end: the next run replays the batch, so status reports no problem (the drain's check)."""
    import subprocess
    import sys

    p = two_pipelines
    create_replication(p["accounts"])
    execute(p["source"], "INSERT INTO public.accounts VALUES (1, 10)")
    run_ok("run", "--spec", p["accounts"])
    execute(p["source"], "INSERT INTO public.accounts VALUES (2, 20)")
    killed = subprocess.run([sys.executable, "-m", "tests.support.drain_child", json.dumps(
        {"dsn": p["source"], "slot": "accounts_slot", "publication": "accounts_pub", "kill_at": "manifest_written",
         "staging_uri": str(tmp_path / "staging_accounts")})], check=False)
    assert killed.returncode != 0
    status = pglogical("status", "--spec", p["accounts"])
    assert json.loads(status.stdout)["problems"] == [] and status.returncode == 0
    run_ok("run", "--spec", p["accounts"])
    assert accounts(p["target"]) == accounts(p["source"]) == [(1, 10), (2, 20)]
