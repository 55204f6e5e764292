"""``pglogical drop`` through the real CLI: a pipeline torn down on a real source and target, the target tables kept."""

from __future__ import annotations

from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest
import yaml

from airflow_provider_pglogical.apply.targets.postgres.plan import staging_prefix
from scripts.harness.pgserver import drop_database, execute, make_database, query
from tests.support.cli import error_line, pglogical, run_ok
from tests.support.spark import TEST_SPARK_CONF

SLOT = "drop_slot"


@pytest.fixture
def pipeline(pg_server, pg_dsn, pg_dbname, tmp_path):
    """A source table with two rows, an empty target, and a spec whose pipeline creates its publication and slot
    (``snapshot.initial``: the rows are copied, so the target also holds sync marks)."""
    target = make_database(pg_server)
    execute(pg_dsn, "CREATE TABLE public.items (id int PRIMARY KEY, name text)",
            "INSERT INTO public.items VALUES (1, 'a'), (2, 'b')")

    def spec(publication: str, **sections: object) -> str:
        doc = {"source": {"dsn": pg_server.uri(pg_dbname), "publication": publication, "slot": SLOT,
                          "create": True}, **sections,
               "staging": {"uri": str(tmp_path / "staging")},
               "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
               "tables": {"public.items": {}}, "spark": {"master": "local[1]", "conf": dict(TEST_SPARK_CONF)}}
        path = tmp_path / f"{publication}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return str(path)

    try:
        yield {"spec": spec, "source": pg_dsn, "target": pg_server.dsn(target), "staging": tmp_path / "staging"}
    finally:
        drop_database(pg_server, target)


def slots(source: str) -> list[tuple]:
    return query(source, "SELECT slot_name FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))


def publications(source: str) -> list[str]:
    return [name for (name,) in query(source, "SELECT pubname FROM pg_publication ORDER BY 1")]


def bookkeeping(target: str) -> dict[str, list[str]]:
    """Slot per row of each bookkeeping table."""
    return {table: [s for (s,) in query(target, f"SELECT slot FROM public.{table} ORDER BY slot")]
            for table in ("pglogical_progress", "pglogical_sync", "pglogical_rejects")}


def test_drop_tears_down_a_pipeline_that_ran_and_keeps_the_target_tables(pipeline):
    p = pipeline
    spec = p["spec"]("drop_pub", snapshot={"initial": True})
    execute(p["source"], "INSERT INTO public.items VALUES (3, 'c')")  # before the slot: in the snapshot
    run_ok("run", "--spec", spec)
    execute(p["source"], "INSERT INTO public.items VALUES (4, 'd')")
    assert run_ok("run", "--spec", spec)["apply"]["batches_applied"] == 1
    # Another pipeline's rows in the same bookkeeping tables, a reject of this one, a staging table a crashed
    # apply of this one left.
    leftover = staging_prefix(SLOT, "public.items") + "00000000DEADBEEF"
    execute(p["target"],
            "INSERT INTO public.pglogical_progress (slot, target_table, end_lsn) VALUES ('other', 'public.x', '0/1')",
            "INSERT INTO public.pglogical_sync (slot, target_table, sync_lsn, rows) VALUES ('other', 'public.x', '0/1', 0)",
            f"INSERT INTO public.pglogical_rejects (slot, table_name, reason) VALUES ('{SLOT}', 'public.items', 'x')",
            f'CREATE UNLOGGED TABLE public."{leftover}" (id int)')
    assert bookkeeping(p["target"]) == {"pglogical_progress": [SLOT, "other"], "pglogical_sync": [SLOT, "other"],
                                        "pglogical_rejects": [SLOT]}
    assert slots(p["source"]) == [(SLOT,)] and publications(p["source"]) == ["drop_pub"]
    assert (p["staging"] / SLOT / "batches").is_dir()

    # --dry-run lists what would go and drops nothing.
    plan = run_ok("drop", "--spec", spec, "--dry-run", "--staging")
    assert plan["dry_run"] is True
    assert plan["slot"]["name"] == SLOT and plan["slot"]["exists"] is True
    assert plan["publications"] == {"drop": ["drop_pub"], "keep": {}}
    assert plan["target"]["rows"] == {"public.pglogical_progress": 1, "public.pglogical_sync": 1,
                                      "public.pglogical_rejects": 1}
    assert plan["target"]["staging_tables"] == [f"public.{leftover}"]
    assert plan["staging"]["remove"] is True and plan["staging"]["files"] > 0
    assert slots(p["source"]) == [(SLOT,)] and publications(p["source"]) == ["drop_pub"]
    assert bookkeeping(p["target"])["pglogical_progress"] == [SLOT, "other"]
    assert (p["staging"] / SLOT / "batches").is_dir()

    # Without --yes: a one-line refusal naming it, nothing dropped.
    line = error_line(pglogical("drop", "--spec", spec, "--staging"))
    assert line.startswith("pglogical drop: error: drop removes slot 'drop_slot'") and "--yes" in line
    assert slots(p["source"]) == [(SLOT,)]

    dropped = run_ok("drop", "--spec", spec, "--yes", "--staging")
    assert dropped["dry_run"] is False and dropped["publications"]["drop"] == ["drop_pub"]
    # The slot is gone and the WAL it pinned with it: nothing holds a position behind the server's.
    assert slots(p["source"]) == []
    assert query(p["source"], "SELECT pg_current_wal_lsn() > %s::pg_lsn", (dropped["slot"]["restart_lsn"],)) == [(True,)]
    assert publications(p["source"]) == []
    assert bookkeeping(p["target"]) == {"pglogical_progress": ["other"], "pglogical_sync": ["other"],
                                        "pglogical_rejects": []}
    assert query(p["target"], "SELECT to_regclass(%s)", (f'public."{leftover}"',)) == [(None,)]
    assert not (p["staging"] / SLOT).exists()
    # The target table and its rows stay.
    assert query(p["target"], "SELECT id, name FROM public.items ORDER BY id") == [
        (1, "a"), (2, "b"), (3, "c"), (4, "d")]

    # A second drop finds everything gone and succeeds.
    again = run_ok("drop", "--spec", spec, "--yes", "--staging")
    assert again["slot"]["exists"] is False and again["publications"] == {"drop": [], "keep": {}}
    assert again["target"]["rows"] == {"public.pglogical_progress": 0, "public.pglogical_sync": 0,
                                       "public.pglogical_rejects": 0}
    assert again["staging"]["files"] == 0


def test_drop_keeps_a_publication_that_existed_before_the_pipeline_and_the_staging_area_without_staging(pipeline):
    p = pipeline
    execute(p["source"], "CREATE PUBLICATION shared_pub FOR TABLE public.items")
    spec = p["spec"]("shared_pub")
    ensured = run_ok("decode", "--spec", spec)["ensure"]
    assert ensured["created_publication"] is False and ensured["created_slot"] is True
    staged = sorted(Path(p["staging"]).rglob("*"))

    dropped = run_ok("drop", "--spec", spec, "--yes")
    assert dropped["publications"] == {"drop": [], "keep": {"shared_pub": "not created by this pipeline"}}
    assert slots(p["source"]) == []
    assert publications(p["source"]) == ["shared_pub"]
    assert dropped["staging"]["remove"] is False and sorted(Path(p["staging"]).rglob("*")) == staged


def test_drop_finishes_a_drop_that_stopped_after_the_slot(pipeline):
    p = pipeline
    spec = p["spec"]("drop_pub")
    staged(p, spec)
    execute(p["source"], "SELECT pg_drop_replication_slot(%s)", params=(SLOT,))
    dropped = run_ok("drop", "--spec", spec, "--yes", "--staging")
    assert dropped["slot"]["exists"] is False and dropped["publications"]["drop"] == ["drop_pub"]
    assert publications(p["source"]) == [] and not (p["staging"] / SLOT).exists()


def staged(p: dict, spec: str) -> None:
    """The pipeline's slot created and one batch staged."""
    run_ok("decode", "--spec", spec)
    execute(p["source"], "INSERT INTO public.items VALUES (5, 'e')")
    assert len(run_ok("decode", "--spec", spec)["batches"]) == 1
    assert (p["staging"] / SLOT / "batches").is_dir()


@pytest.mark.parametrize("held", ["drain lock on the source", "apply lock on the target"])
def test_drop_is_refused_while_a_run_holds_the_slot(pipeline, held):
    p = pipeline
    spec = p["spec"]("drop_pub")
    staged(p, spec)
    if held.startswith("drain"):  # what a drain holds for its whole run (staging/drain.py)
        dsn, lock = p["source"], ("SELECT pg_advisory_lock(hashtext('airflow-provider-pglogical'), hashtext(%s))",
                                  (SLOT,))
    else:  # what an apply holds (apply/targets/postgres/catalog.py)
        dsn, lock = p["target"], ("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"pglogical-apply:{SLOT}",))
    run = psycopg2.connect(dsn)
    run.autocommit = True
    try:
        with run.cursor() as cur:
            cur.execute(*lock)
        line = error_line(pglogical("drop", "--spec", spec, "--yes", "--staging"))
        assert line.startswith("pglogical drop: error: ")
        assert ("is being drained by another session" if held.startswith("drain")
                else "an apply of slot 'drop_slot' into this target is running") in line
        # Nothing was dropped.
        assert slots(p["source"]) == [(SLOT,)] and publications(p["source"]) == ["drop_pub"]
        assert (p["staging"] / SLOT).is_dir()
    finally:
        run.close()
    run_ok("drop", "--spec", spec, "--yes")
    assert slots(p["source"]) == []


def test_drop_is_refused_while_a_consumer_has_the_slot_active(pipeline):
    p = pipeline
    spec = p["spec"]("drop_pub")
    run_ok("decode", "--spec", spec)
    reader = psycopg2.connect(p["source"], connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cur = reader.cursor()
        cur.start_replication(slot_name=SLOT, decode=False,
                              options={"proto_version": "1", "publication_names": "drop_pub"})
        line = error_line(pglogical("drop", "--spec", spec, "--yes"))
        assert "replication slot 'drop_slot' is active for PID" in line
        assert slots(p["source"]) == [(SLOT,)]
    finally:
        reader.close()


def test_drop_drops_the_publication_a_pipeline_created_for_a_schema_selection(pipeline):
    p = pipeline
    spec = p["spec"]("drop_pub")
    doc = yaml.safe_load(Path(spec).read_text())
    doc["tables"] = {"public.*": {}}  # created FOR TABLES IN SCHEMA public
    Path(spec).write_text(yaml.safe_dump(doc))
    assert run_ok("decode", "--spec", spec)["ensure"]["created_publication"] is True
    assert run_ok("drop", "--spec", spec, "--yes")["publications"] == {"drop": ["drop_pub"], "keep": {}}
    assert publications(p["source"]) == [] and slots(p["source"]) == []
