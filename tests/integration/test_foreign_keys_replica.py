"""Foreign keys on a PostgreSQL target without an initial snapshot, against a native subscriber.

A child row whose parent predates the slot: a native subscriber (``session_replication_role = replica``) applies
it; the default apply stops naming the table, the constraint, the batch and the ways out, each of which is
followed here — ``target.session_replication_role: replica`` (a non-superuser granted ``SET ON PARAMETER``;
without the grant, a one-line error naming it) and a resync of the linked tables.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import psycopg2
import pytest
import yaml

from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.exceptions import ConstraintViolationError, PrivilegeError, format_lsn
from airflow_provider_pglogical.pipeline.runs import apply_config, decode_pending
from airflow_provider_pglogical.pipeline.spec import parse_spec
from airflow_provider_pglogical.staging.reader import StagingReader
from scripts.harness.pgserver import drop_database, execute, make_database, query
from scripts.harness.subscriber import subscribe, unsubscribe, wait_for_subscriber
from scripts.harness.userenv import run_as_user, venv_script

SCHEMA = """
CREATE TABLE parent (id int PRIMARY KEY, name text);
CREATE TABLE child (id int PRIMARY KEY, parent_id int NOT NULL REFERENCES parent ON DELETE CASCADE, v text);
"""
# On both subscribers: an ordinary trigger (does not fire under replica) and an ENABLE ALWAYS one (fires);
# qualified names: a native apply worker runs with an empty search_path.
TRIGGERS = """
CREATE TABLE child_audit (id int, op text);
CREATE FUNCTION audit_child() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO public.child_audit VALUES (coalesce(NEW.id, OLD.id), TG_OP); RETURN NULL; END $$;
CREATE TRIGGER child_audit AFTER INSERT OR UPDATE OR DELETE ON child FOR EACH ROW EXECUTE FUNCTION audit_child();
CREATE TABLE parent_seen (id int, op text);
CREATE FUNCTION see_parent() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO public.parent_seen VALUES (coalesce(NEW.id, OLD.id), TG_OP); RETURN NULL; END $$;
CREATE TRIGGER parent_seen AFTER INSERT OR DELETE ON parent FOR EACH ROW EXECUTE FUNCTION see_parent();
ALTER TABLE parent ENABLE ALWAYS TRIGGER parent_seen;
"""
BEFORE_SLOT = ("INSERT INTO parent VALUES (1, 'p1'), (2, 'p2'), (3, 'p3'); "
               "INSERT INTO child VALUES (20, 2, 'c20'), (30, 3, 'c30')")
# A row only the subscribers have, referencing a parent the source deletes later: the source's ON DELETE CASCADE
# reaches only the source's rows (their deletes are replicated as changes); the subscriber's cascade trigger
# does not fire under replica, so this row stays.
TARGET_ONLY = "SET session_replication_role = replica; INSERT INTO child VALUES (99, 4, 'target only')"
# Two batches (the apply fires triggers on each key's net change of a batch: parent 4 lives across both).
WORKLOAD = [[
    "INSERT INTO child VALUES (10, 1, 'c10')",  # parent 1 predates the slot: never replicated
    "INSERT INTO parent VALUES (4, 'p4'); INSERT INTO child VALUES (40, 4, 'c40'); "
    "UPDATE child SET v = 'c30b' WHERE id = 30",
], [
    "DELETE FROM parent WHERE id = 2",  # cascades to child 20 on the source (a row neither subscriber has)
    "DELETE FROM parent WHERE id = 4",  # cascades to child 40 on the source
    "INSERT INTO parent VALUES (5, 'p5'); INSERT INTO child VALUES (50, 5, 'c50')",
]]
TABLES = ("parent", "child", "child_audit", "parent_seen")


def contents(dsn: str) -> dict[str, list[tuple]]:
    return {t: query(dsn, f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES}


@pytest.fixture
def make_role(pg_server) -> Iterator[Callable[..., str]]:
    """``make(*grants)``: a LOGIN role without superuser (cluster-wide: dropped afterwards with its grants)."""
    created: list[str] = []

    def make(*grants: str) -> str:
        name = f"r_{uuid.uuid4().hex[:10]}"
        execute(pg_server.dsn(), f'CREATE ROLE "{name}" LOGIN NOSUPERUSER')
        created.append(name)
        for grant in grants:
            execute(pg_server.dsn(), grant.format(role=f'"{name}"'))
        return name

    try:
        yield make
    finally:
        conn = psycopg2.connect(pg_server.dsn())
        conn.autocommit = True
        with conn.cursor() as cur:
            for name in created:
                cur.execute(f'REVOKE SET ON PARAMETER session_replication_role FROM "{name}"')
                cur.execute(f'DROP ROLE IF EXISTS "{name}"')
        conn.close()


@pytest.fixture
def setup(pg_server, make_role, tmp_path):
    """(spec, source, native subscriber, our target as admin, target role) with the schema everywhere, the rows from
    before both slots on the source, the subscription made and our slot created (nothing staged yet)."""
    role = make_role("GRANT SET ON PARAMETER session_replication_role TO {role}")
    source, native, ours = (make_database(pg_server) for _ in range(3))
    src, nat, dw = (pg_server.dsn(d) for d in (source, native, ours))
    execute(dw, f'ALTER DATABASE "{ours}" OWNER TO "{role}"')
    execute(src, SCHEMA, BEFORE_SLOT, "CREATE PUBLICATION pub_native FOR TABLE parent, child",
            "CREATE PUBLICATION app_pub FOR TABLE parent, child")
    for dsn in (nat, pg_server.dsn(ours, user=role)):  # the role owns its target's tables and triggers
        execute(dsn, SCHEMA, TRIGGERS)
    spec = parse_spec({"source": {"dsn": src, "publication": "app_pub", "slot": "fk_slot", "create": True},
                       "staging": {"uri": str(tmp_path / "staging")},
                       "target": {"kind": "postgres", "dsn": pg_server.dsn(ours, user=role)},
                       "tables": {"public.parent": {}, "public.child": {}}}, env={})
    subscribe(src, nat)
    try:
        decode_pending(spec)  # our slot, at about the subscription's
        yield spec, src, nat, dw, role
    finally:
        unsubscribe(nat)
        for name in (ours, native, source):
            drop_database(pg_server, name)


def run_workload(spec, src: str, *targets: str) -> None:
    """The workload on the source, staged as two batches."""
    for dsn in targets:
        execute(dsn, TARGET_ONLY)
    for batch in WORKLOAD:
        for tx in batch:
            execute(src, f"BEGIN; {tx}; COMMIT")
        decode_pending(spec)


def watermarks(dw: str) -> list[tuple]:
    return query(dw, "SELECT target_table, end_lsn::text FROM pglogical_progress ORDER BY 1")


def test_a_child_whose_parent_predates_the_slot_stops_the_batch_and_replica_role_applies_it_like_a_subscriber(
        setup, spark):
    spec, src, nat, dw, role = setup
    run_workload(spec, src, nat, dw)
    batch, _ = StagingReader.from_uri(spec.staging.uri, "fk_slot").batches()
    before = contents(dw)

    with pytest.raises(ConstraintViolationError) as info:
        apply_slot(spark, apply_config(spec), spec.target.dsn)
    err = info.value
    text = str(err)
    assert (err.table, err.constraint, err.sqlstate) == ("public.child", "child_parent_id_fkey", "23503")
    assert f"batch {format_lsn(batch.start_lsn)}-{format_lsn(batch.end_lsn)} not applied" in text
    assert "pglogical resync --table public.parent --table public.child" in text
    assert "target.session_replication_role: replica" in text
    assert "\n" not in text and "c10" not in text and "(1)" not in text  # one line, no row values
    assert contents(dw) == before and watermarks(dw) == []  # nothing committed, no watermark

    # The way out: apply as a native subscriber does (a non-superuser granted SET ON PARAMETER).
    replica = replace(spec, target=replace(spec.target, session_replication_role="replica"))
    reports = apply_slot(spark, apply_config(replica), replica.target.dsn)
    assert [r.applied for r in reports] == [True, True]
    wait_for_subscriber(src, nat)
    got, want = contents(dw), contents(nat)
    assert got == want
    # Not vacuous: the orphan child arrived, the target-only child outlived its parent's delete (no cascade on
    # the subscriber), the ordinary trigger did not fire and the ENABLE ALWAYS one did.
    assert want["child"] == [(10, 1, "c10"), (50, 5, "c50"), (99, 4, "target only")]
    assert want["parent"] == [(5, "p5")] and want["child_audit"] == []
    assert want["parent_seen"] == [(4, "DELETE"), (4, "INSERT"), (5, "INSERT")]
    assert query(dw, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)) == [(False,)]
    assert [t for t, _ in watermarks(dw)] == ["public.child", "public.parent"]


def test_replica_role_without_the_privilege_is_refused_naming_the_grant(pg_server, setup, make_role, spark):
    spec, src, nat, dw, _ = setup
    run_workload(spec, src, dw)
    plain = make_role()
    execute(dw, f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{plain}"', f'GRANT CREATE ON SCHEMA public TO "{plain}"')
    dsn = spec.target.dsn.replace(f"user={setup[4]}", f"user={plain}")
    replica = replace(spec, target=replace(spec.target, dsn=dsn, session_replication_role="replica"))
    before = contents(dw)
    with pytest.raises(PrivilegeError) as info:
        apply_slot(spark, apply_config(replica), dsn)
    assert info.value.privilege == "SET ON PARAMETER session_replication_role"
    assert f"GRANT SET ON PARAMETER session_replication_role TO {plain}" in str(info.value)
    assert "\n" not in str(info.value)
    assert contents(dw) == before
    assert query(dw, "SELECT to_regclass('pglogical_progress') IS NULL") == [(True,)]  # refused before anything


def test_the_resync_way_out_loads_the_linked_tables_and_the_apply_goes_on(setup, spark, tmp_path):
    spec, src, _, dw, _ = setup
    run_workload(spec, src, dw)
    with pytest.raises(ConstraintViolationError) as info:
        apply_slot(spark, apply_config(spec), spec.target.dsn)
    command = str(info.value).split("(pglogical resync ", 1)[1].split(")", 1)[0]
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump({
        "source": {"dsn": src, "publication": "app_pub", "slot": "fk_slot"}, "staging": {"uri": spec.staging.uri},
        "target": {"kind": "postgres", "dsn": spec.target.dsn}, "tables": {"public.parent": {}, "public.child": {}}}))
    done = run_as_user([venv_script("pglogical"), "resync", "--spec", str(spec_file), *command.split()])
    assert done.returncode == 0, done.stderr[-2000:]
    execute(src, "BEGIN; INSERT INTO child VALUES (60, 3, 'c60'); COMMIT")  # after the resync: applied on top
    decode_pending(spec)
    reports = apply_slot(spark, apply_config(spec), spec.target.dsn)
    assert reports[0].rows == {"public.parent": {"snapshot_rows": 3}, "public.child": {"snapshot_rows": 3}}
    for table in ("parent", "child"):
        # The target-only row went with the snapshot's TRUNCATE: the resync makes the tables the source's.
        assert query(dw, f"SELECT * FROM {table} ORDER BY 1") == query(src, f"SELECT * FROM {table} ORDER BY 1")
    assert (60, 3, "c60") in query(dw, "SELECT * FROM child ORDER BY 1")
