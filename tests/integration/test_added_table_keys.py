"""Target tables the apply creates for tables added to a running pipeline get the source's primary key (none
where the source has none), not the REPLICA IDENTITY FULL matching key of every column: a TOASTed value larger
than a btree entry loads, and the rows then follow a native subscriber's (whose tables have the source's keys)."""

from __future__ import annotations

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.snapshot.run import (
    SnapshotJob,
    SnapshotSettings,
    initial_snapshot,
    request_added_tables,
    sync_pending,
)
from scripts.harness.pgserver import execute, make_database, make_target, query
from scripts.harness.subscriber import drain_all, wait_for_subscriber

# items: REPLICA IDENTITY FULL for a row filter on a non-key column (grp), the usual reason for it; notes: no
# primary key at all, REPLICA IDENTITY FULL (its rows are matched by every column).
TABLES_SQL = """
CREATE TABLE base (id int PRIMARY KEY, v text);
CREATE TABLE items (id int PRIMARY KEY, grp int NOT NULL, body text);
ALTER TABLE items REPLICA IDENTITY FULL;
CREATE TABLE notes (a int, b text, c text);
ALTER TABLE notes REPLICA IDENTITY FULL;
"""
# 3200 characters of md5 hex: pglz finds nothing to compress, so a btree entry holding it is > 2704 bytes.
INCOMPRESSIBLE = "(SELECT string_agg(md5(random()::text || g::text), '') FROM generate_series(1, 100) g)"
ADDED_ROWS_SQL = f"""
INSERT INTO items SELECT g, g % 10, 'i' || g FROM generate_series(1, 300) g;
UPDATE items SET body = {INCOMPRESSIBLE} WHERE id IN (5, 17, 26);
INSERT INTO notes SELECT g % 50, 'n' || g, repeat('x', g % 7) FROM generate_series(1, 200) g;
INSERT INTO notes VALUES (90, NULL, NULL), (91, 'n91', NULL), (92, NULL, 'c92');
"""
CHANGES_SQL = [
    f"UPDATE items SET body = {INCOMPRESSIBLE} WHERE id IN (7, 15)",  # new TOASTed values
    "UPDATE items SET grp = grp + 1 WHERE id IN (5, 36)",  # unchanged TOAST (id 5), and across the filter
    "UPDATE items SET grp = 1 WHERE id = 17",  # leaves the filter: a DELETE
    "DELETE FROM items WHERE id IN (26, 45)",
    f"INSERT INTO items VALUES (1000, 9, {INCOMPRESSIBLE})",
    "UPDATE notes SET b = b || '!' WHERE a = 3",
    "DELETE FROM notes WHERE a = 4",
    "INSERT INTO notes VALUES (77, 'late', 'l')",
    "UPDATE notes SET a = 93 WHERE a = 90",  # rows with NULLs: matched by every column, NULL equal to NULL
    "DELETE FROM notes WHERE a = 91",
    "UPDATE notes SET b = 'b92' WHERE a = 92",
]


def key_of(dsn: str, table: str) -> list[str]:
    return [r[0] for r in query(dsn, "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                                     "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
                                params=(table,))]


def rows(dsn: str, table: str) -> list[tuple]:
    return sorted(query(dsn, f"SELECT * FROM {table}"), key=repr)  # this module's constants


def test_tables_added_to_a_running_pipeline_are_created_with_the_source_primary_key(pg_server, spark, tmp_path):
    source, native = make_database(pg_server), make_database(pg_server)
    _, ours = make_target(pg_server)
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, TABLES_SQL, "INSERT INTO base SELECT g, 'b' || g FROM generate_series(1, 50) g",
            "CREATE PUBLICATION pub_all FOR TABLE base", "CREATE PUBLICATION pub_native FOR TABLE base")
    execute(native_dsn, TABLES_SQL)  # a native subscriber's tables: the source's definitions
    uri = str(tmp_path / "staging")
    tables: dict[str, tuple[tuple[str, ...] | None, str | None]] = {"public.base": (None, None)}

    def job() -> SnapshotJob:
        return SnapshotJob(dsn=source_dsn, slot="ours", publication="pub_all", staging_uri=uri, tables=dict(tables),
                           settings=SnapshotSettings(initial=True))

    def config() -> ApplyConfig:
        return ApplyConfig(slot="ours", staging_root=uri, tables={t: TableApplyConfig() for t in tables})

    execute(source_dsn, "SELECT pg_create_logical_replication_slot('sub_native', 'pgoutput')")
    execute(native_dsn, "CREATE SUBSCRIPTION sub_native CONNECTION '" + source_dsn + "' PUBLICATION pub_native "
                        "WITH (create_slot = false, slot_name = sub_native, copy_data = true)")
    try:
        initial_snapshot(job())
        drain_all(source_dsn, uri)
        apply_slot(spark, config(), ours)

        # two tables added to the running pipeline, with rows before they are added
        execute(source_dsn, ADDED_ROWS_SQL)
        for pub in ("pub_all", "pub_native"):
            execute(source_dsn, f"ALTER PUBLICATION {pub} ADD TABLE items WHERE (grp >= 5), notes")
        execute(native_dsn, "ALTER SUBSCRIPTION sub_native REFRESH PUBLICATION")
        tables.update({"public.items": (None, None), "public.notes": (None, None)})
        assert request_added_tables(job()) == ["public.items", "public.notes"]
        sync_pending(job())
        execute(source_dsn, *CHANGES_SQL)
        drain_all(source_dsn, uri)
        apply_slot(spark, config(), ours)

        assert key_of(ours, "items") == ["id"] and key_of(ours, "notes") == []
        wait_for_native(source_dsn, native_dsn)
        for table in ("base", "items", "notes"):
            assert rows(ours, table) == rows(native_dsn, table), table
        assert query(ours, "SELECT count(*) FROM items WHERE length(body) > 3000") == [(4,)]  # not vacuous
    finally:
        execute(native_dsn, "ALTER SUBSCRIPTION sub_native DISABLE", "ALTER SUBSCRIPTION sub_native SET (slot_name = NONE)",
                "DROP SUBSCRIPTION sub_native")
        execute(source_dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name IN ('sub_native', 'ours')")


def test_tables_added_without_snapshots_are_created_from_the_staged_relation_with_the_source_primary_key(
        pg_server, spark, tmp_path):
    source, native = make_database(pg_server), make_database(pg_server)
    _, ours = make_target(pg_server)
    source_dsn, native_dsn = pg_server.dsn(source), pg_server.dsn(native)
    execute(source_dsn, TABLES_SQL, "CREATE PUBLICATION pub_all FOR TABLE base",
            "CREATE PUBLICATION pub_native FOR TABLE base")
    execute(native_dsn, TABLES_SQL)
    uri = str(tmp_path / "staging")
    execute(source_dsn, "SELECT pg_create_logical_replication_slot('ours', 'pgoutput')",
            "SELECT pg_create_logical_replication_slot('sub_native', 'pgoutput')")
    execute(native_dsn, "CREATE SUBSCRIPTION sub_native CONNECTION '" + source_dsn + "' PUBLICATION pub_native "
                        "WITH (create_slot = false, slot_name = sub_native, copy_data = false)")
    try:
        for pub in ("pub_all", "pub_native"):
            execute(source_dsn, f"ALTER PUBLICATION {pub} ADD TABLE items WHERE (grp >= 5), notes")
        execute(native_dsn, "ALTER SUBSCRIPTION sub_native REFRESH PUBLICATION WITH (copy_data = false)")
        config = ApplyConfig(slot="ours", staging_root=uri, tables={
            t: TableApplyConfig() for t in ("public.base", "public.items", "public.notes")})
        execute(source_dsn, ADDED_ROWS_SQL)
        drain_all(source_dsn, uri)
        apply_slot(spark, config, ours)  # creates the tables
        execute(source_dsn, *CHANGES_SQL)  # changes of rows the targets hold
        drain_all(source_dsn, uri)
        apply_slot(spark, config, ours)

        assert key_of(ours, "items") == ["id"] and key_of(ours, "notes") == []
        wait_for_native(source_dsn, native_dsn)
        for table in ("items", "notes"):
            assert rows(ours, table) == rows(native_dsn, table), table
        assert query(ours, "SELECT count(*) FROM items WHERE length(body) > 3000") == [(4,)]  # not vacuous
    finally:
        execute(native_dsn, "ALTER SUBSCRIPTION sub_native DISABLE", "ALTER SUBSCRIPTION sub_native SET (slot_name = NONE)",
                "DROP SUBSCRIPTION sub_native")
        execute(source_dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name IN ('sub_native', 'ours')")


def wait_for_native(source_dsn: str, native_dsn: str) -> None:
    """The native subscriber's table syncs finished and its apply caught up."""
    import time

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        states = query(native_dsn, "SELECT srsubstate FROM pg_subscription_rel")
        if states and all(s == "r" for (s,) in states):
            break
        time.sleep(0.2)
    else:
        raise TimeoutError("native table sync did not finish")
    wait_for_subscriber(source_dsn, native_dsn)
