"""Least-privilege source roles: REPLICATION (+ SELECT) is enough to decode; a missing privilege is named.

Roles are cluster-wide, so each test creates its own (random suffix) and drops it afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg2
import pytest
import yaml

from airflow_provider_pglogical.exceptions import PrivilegeError, ReplicationPermissionError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.pipeline.runs import decode_pending
from airflow_provider_pglogical.pipeline.spec import parse_spec
from scripts.harness.pgserver import drop_database, execute, make_database
from scripts.harness.pgserver import query as rows
from tests.support.spark import TEST_SPARK_CONF

SCHEMA = """
CREATE TABLE orders (id int PRIMARY KEY, amount numeric NOT NULL);
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
"""


@pytest.fixture
def roles(pg_server, pg_dbname) -> Iterator[Callable[..., str]]:
    """``make(attributes, *grants)`` creates a LOGIN role (no superuser) and returns its name."""
    created: list[str] = []
    admin = pg_server.dsn(pg_dbname)

    def make(attributes: str = "", *grants: str) -> str:
        name = f"r_{uuid.uuid4().hex[:10]}"
        execute(admin, f'CREATE ROLE "{name}" LOGIN NOSUPERUSER {attributes}')
        created.append(name)
        for grant in grants:
            execute(admin, grant.format(role=f'"{name}"', db=f'"{pg_dbname}"'))
        return name

    try:
        yield make
    finally:
        for name in created:
            execute(pg_server.dsn(pg_dbname), f'DROP OWNED BY "{name}"')
        conn = psycopg2.connect(pg_server.dsn())
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s "
                        "AND NOT active", (pg_dbname,))
            for name in created:
                cur.execute(f'DROP ROLE IF EXISTS "{name}"')
        conn.close()


def spec_for(dsn: str, tmp_path, create: bool = True):
    return parse_spec({"source": {"dsn": dsn, "publication": "app_pub", "slot": "lp_slot", "create": create},
                       "staging": {"uri": str(tmp_path / "staging")}, "target": {"kind": "postgres", "dsn": dsn},
                       "tables": {"public.orders": {}, "public.customers": {}}}, env={})


def is_plain_role(admin_dsn: str, role: str) -> bool:
    (row,) = rows(admin_dsn, "SELECT rolsuper, pg_has_role(%s, 'pg_read_server_files', 'MEMBER'), "
                             "pg_has_role(%s, 'pg_write_server_files', 'MEMBER') FROM pg_roles WHERE rolname = %s",
                  (role, role, role))
    return row == (False, False, False)


def test_a_replication_and_select_role_decodes_a_publication_its_owner_created(pg_server, pg_dbname, roles,
                                                                                tmp_path):
    admin = pg_server.dsn(pg_dbname)
    execute(admin, SCHEMA + "CREATE PUBLICATION app_pub FOR TABLE orders, customers;")
    role = roles("REPLICATION", "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    assert is_plain_role(admin, role)
    spec = spec_for(pg_server.dsn(pg_dbname, user=role), tmp_path)
    decode_pending(spec)  # creates the slot (REPLICATION), leaves the existing publication alone
    execute(admin, "INSERT INTO customers VALUES (1, 'a'), (2, 'b'); INSERT INTO orders VALUES (1, 10)")
    result = decode_pending(spec)
    assert result["changes"] == 3
    assert rows(admin, "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (pg_dbname,)) == \
        [("lp_slot",)]


def test_a_managed_cloud_style_owner_role_creates_its_publication_and_slot_without_superuser(pg_server, pg_dbname,
                                                                                             roles, tmp_path):
    # RDS / Cloud SQL: the application's owner role has REPLICATION (or rds_replication) and CREATE on its
    # database, but no superuser and none of pg_read_server_files & co.
    admin = pg_server.dsn(pg_dbname)
    role = roles("REPLICATION", "GRANT CREATE ON DATABASE {db} TO {role}", "GRANT CREATE ON SCHEMA public TO {role}")
    assert is_plain_role(admin, role)
    dsn = pg_server.dsn(pg_dbname, user=role)
    execute(dsn, SCHEMA)
    spec = spec_for(dsn, tmp_path)
    decode_pending(spec)
    execute(dsn, "INSERT INTO customers VALUES (1, 'a'); UPDATE customers SET name = 'b'")
    assert decode_pending(spec)["changes"] == 2
    assert rows(admin, "SELECT pubname, pg_get_userbyid(pubowner) FROM pg_publication") == [("app_pub", role)]


def test_a_role_without_replication_is_told_it_lacks_replication(pg_server, pg_dbname, roles, tmp_path):
    admin = pg_server.dsn(pg_dbname)
    execute(admin, SCHEMA + "CREATE PUBLICATION app_pub FOR TABLE orders, customers;")
    role = roles("", "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    with PgLogicalHook.from_dsn(pg_server.dsn(pg_dbname, user=role)) as hook:
        with pytest.raises(ReplicationPermissionError, match="lacks the REPLICATION attribute") as precheck:
            hook.check_replication_privilege()
        with pytest.raises(ReplicationPermissionError, match="ALTER ROLE ... REPLICATION") as server:
            hook.create_slot("lp_slot")  # what the server itself says, translated
    assert precheck.value.privilege == server.value.privilege == "REPLICATION"


def test_creating_a_publication_without_create_on_the_database_names_that_privilege(pg_server, pg_dbname, roles,
                                                                                    tmp_path):
    role = roles("REPLICATION", "GRANT CREATE ON SCHEMA public TO {role}")
    dsn = pg_server.dsn(pg_dbname, user=role)
    execute(dsn, SCHEMA)
    with pytest.raises(PrivilegeError, match=f"lacks CREATE ON DATABASE {pg_dbname}") as err:
        decode_pending(spec_for(dsn, tmp_path))
    assert err.value.privilege == f"CREATE ON DATABASE {pg_dbname}"
    assert "GRANT CREATE ON DATABASE" in str(err.value)


def test_adding_tables_it_does_not_own_to_a_publication_names_the_table_owner_requirement(pg_server, pg_dbname,
                                                                                         roles, tmp_path):
    admin = pg_server.dsn(pg_dbname)
    execute(admin, SCHEMA)
    role = roles("REPLICATION", "GRANT CREATE ON DATABASE {db} TO {role}")
    with pytest.raises(PrivilegeError, match="must be the owner of table") as err:
        decode_pending(spec_for(pg_server.dsn(pg_dbname, user=role), tmp_path))
    assert err.value.privilege.startswith("owner of table ")


def test_membership_in_rds_replication_passes_the_replication_precheck(pg_server, pg_dbname, roles):
    # Amazon RDS grants the slot functions through the rds_replication role, not the REPLICATION attribute.
    admin = pg_server.dsn(pg_dbname)
    execute(admin, "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication') THEN "
                   "CREATE ROLE rds_replication NOLOGIN; END IF; END $$")
    role = roles("", "GRANT rds_replication TO {role}")
    with PgLogicalHook.from_dsn(pg_server.dsn(pg_dbname, user=role)) as hook:
        hook.check_replication_privilege()


# -- target side ------------------------------------------------------------------------------

PGLOGICAL = str(Path(sys.executable).parent / "pglogical")


@pytest.fixture
def loader_target(pg_server, roles) -> Iterator[tuple[str, str]]:
    """A target database where the loader role owns only schema ``warehouse`` (no CREATE on public)."""
    dbname = make_database(pg_server)
    admin = pg_server.dsn(dbname)
    role = roles()
    execute(admin, f'CREATE SCHEMA warehouse AUTHORIZATION "{role}"')
    try:
        yield dbname, role
    finally:
        execute(admin, f'DROP OWNED BY "{role}"')
        drop_database(pg_server, dbname)


def run_cli(spec: dict, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return subprocess.run([PGLOGICAL, "run", "--spec", str(path)], capture_output=True, text=True, timeout=900)


def loader_spec(pg_server, src_db: str, dw_db: str, role: str, tmp_path, **target: str) -> dict:
    return {"source": {"dsn": pg_server.uri(src_db), "publication": "app_pub", "slot": "lp_slot", "create": True},
            "staging": {"uri": str(tmp_path / "staging")},
            "target": {"kind": "postgres", "dsn": pg_server.uri(dw_db, user=role), **target},
            "tables": {"public.orders": {"target": "warehouse.orders"},
                       "public.customers": {"target": "warehouse.customers"}},
            "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)}}


def test_a_loader_role_owning_only_its_schema_runs_the_whole_pipeline_with_bookkeeping_there(
        pg_server, pg_dbname, loader_target, tmp_path):
    src = pg_server.dsn(pg_dbname)
    dw_db, role = loader_target
    execute(src, SCHEMA)
    execute(src, "INSERT INTO customers VALUES (1, 'a'), (2, 'b'); INSERT INTO orders VALUES (1, 10), (2, 20)")
    spec = loader_spec(pg_server, pg_dbname, dw_db, role, tmp_path)
    assert rows(pg_server.dsn(dw_db), "SELECT has_schema_privilege(%s, 'public', 'CREATE')", (role,)) == [(False,)]
    first = run_cli(spec, tmp_path)  # creates publication and slot: nothing staged before the slot
    assert first.returncode == 0, first.stderr[-3000:]
    execute(src, "INSERT INTO customers VALUES (3, 'c'); UPDATE orders SET amount = 11 WHERE id = 1; "
                 "DELETE FROM orders WHERE id = 2; INSERT INTO orders VALUES (5, 50)")
    second = run_cli(spec, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    dw = pg_server.dsn(dw_db)
    assert rows(dw, "SELECT id, name FROM warehouse.customers ORDER BY id") == [(3, "c")]
    # ids 1 and 2 predate the slot: their update and delete find no target row (as on a native subscriber)
    assert rows(dw, "SELECT id, amount::int FROM warehouse.orders ORDER BY id") == [(5, 50)]
    assert rows(dw, "SELECT to_regclass('warehouse.pglogical_progress') IS NOT NULL, "
                    "to_regclass('warehouse.pglogical_rejects') IS NOT NULL, "
                    "to_regclass('public.pglogical_progress') IS NULL") == [(True, True, True)]
    assert rows(dw, "SELECT count(*) FROM pg_class WHERE relname LIKE '\\_pglogical\\_stg\\_%'") == [(0,)]
    status = subprocess.run([PGLOGICAL, "status", "--spec", str(tmp_path / "spec.yaml")], capture_output=True,
                            text=True, timeout=300)
    assert status.returncode == 0, status.stderr[-2000:]
    assert set(json.loads(status.stdout)["target"]["watermarks"]) == {"warehouse.orders", "warehouse.customers"}


def test_a_configured_bookkeeping_schema_holds_the_bookkeeping_and_a_role_without_create_anywhere_is_told(
        pg_server, pg_dbname, loader_target, tmp_path):
    from airflow_provider_pglogical.apply.targets.postgres.bookkeeping_schema import resolve_for_dsn

    dw_db, role = loader_target
    dsn = pg_server.dsn(dw_db, user=role)
    execute(pg_server.dsn(dw_db), f'CREATE SCHEMA pgl_meta AUTHORIZATION "{role}"')
    assert resolve_for_dsn(dsn, "pgl_meta", ["warehouse.orders"]) == "pgl_meta"
    assert resolve_for_dsn(dsn, None, ["public.orders", "warehouse.orders"]) == "warehouse"
    with pytest.raises(PrivilegeError, match="may create tables in none of the schemas public") as err:
        resolve_for_dsn(dsn, None, ["public.orders"])
    assert err.value.privilege == "CREATE ON SCHEMA public"
    with pytest.raises(PrivilegeError, match="lacks CREATE on it") as err:
        resolve_for_dsn(dsn, "public", ["warehouse.orders"])
    assert err.value.privilege == "CREATE ON SCHEMA public"


def test_a_loader_role_owning_only_its_schema_loads_the_initial_snapshot_with_its_sync_marks_there(
        pg_server, pg_dbname, loader_target, tmp_path):
    src = pg_server.dsn(pg_dbname)
    dw_db, role = loader_target
    execute(src, SCHEMA)
    execute(src, "INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 50) g; "
                 "INSERT INTO orders SELECT g, g * 10 FROM generate_series(1, 80) g")
    dw = pg_server.dsn(dw_db)
    execute(dw, f'CREATE SCHEMA pgl_meta AUTHORIZATION "{role}"')
    spec = {**loader_spec(pg_server, pg_dbname, dw_db, role, tmp_path, bookkeeping_schema="pgl_meta"),
            "snapshot": {"initial": True}}
    first = run_cli(spec, tmp_path)  # slot with an exported snapshot, the pre-existing rows, then the apply
    assert first.returncode == 0, first.stderr[-3000:]
    execute(src, "UPDATE orders SET amount = 1 WHERE id = 1; DELETE FROM customers WHERE id = 2; "
                 "INSERT INTO orders VALUES (100, 5)")
    second = run_cli(spec, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert rows(dw, "SELECT id, name FROM warehouse.customers ORDER BY id") == \
        rows(src, "SELECT id, name FROM customers ORDER BY id")
    assert rows(dw, "SELECT id, amount::int FROM warehouse.orders ORDER BY id") == \
        rows(src, "SELECT id, amount::int FROM orders ORDER BY id")
    assert rows(dw, "SELECT to_regclass('pgl_meta.pglogical_sync') IS NOT NULL, "
                    "to_regclass('pgl_meta.pglogical_progress') IS NOT NULL, "
                    "to_regclass('public.pglogical_sync') IS NULL, to_regclass('warehouse.pglogical_sync') IS NULL") \
        == [(True, True, True, True)]
    assert rows(dw, "SELECT target_table FROM pgl_meta.pglogical_sync ORDER BY 1") == \
        [("warehouse.customers",), ("warehouse.orders",)]
    assert rows(dw, "SELECT count(*) FROM pg_class WHERE relname LIKE '\\_pglogical\\_stg\\_%'") == [(0,)]
    status = subprocess.run([PGLOGICAL, "status", "--spec", str(tmp_path / "spec.yaml")], capture_output=True,
                            text=True, timeout=300)
    assert status.returncode == 0, status.stderr[-2000:]
    sync = json.loads(status.stdout)["sync"]
    assert {t: s["state"] for t, s in sync.items()} == {"public.orders": "synced", "public.customers": "synced"}
