"""The example teardown DAG through the real ``airflow dags test``: refused without the slot's name, then the
pipeline dropped (slot, publication, bookkeeping, staging) with the target tables kept."""

from __future__ import annotations

from scripts.harness.pgserver import drop_database, execute, make_database, query
from tests.system.test_example_dags import SCHEMA, dags_test


def test_the_teardown_dag_drops_the_pipeline_only_when_confirmed_with_the_slot_name(pg_server, airflow, tmp_path):
    src, dw = make_database(pg_server), make_database(pg_server)
    staging = tmp_path / "staging"
    env = {"AIRFLOW_CONN_PGLOGICAL_SOURCE": pg_server.uri(src), "AIRFLOW_CONN_PGLOGICAL_TARGET": pg_server.uri(dw),
           "PGLOGICAL_STAGING_URI": str(staging)}
    source, target = pg_server.dsn(src), pg_server.dsn(dw)
    try:
        execute(source, SCHEMA)
        dags_test(airflow, env, "pglogical_example_pipeline")  # creates publication and slot
        execute(source, "INSERT INTO customers VALUES (1, 'a'), (2, 'b')")
        output = dags_test(airflow, env, "pglogical_example_pipeline")
        assert "prune_staging" in output  # every pipeline run records how far its target applied
        assert query(target, "SELECT id FROM customers ORDER BY id") == [(1,), (2,)]
        assert query(source, "SELECT slot_name FROM pg_replication_slots") == [("app_slot",)]

        refused = airflow.run("dags", "test", "pglogical_example_teardown", "--conf", '{"confirm": "other"}',
                              env=env, timeout=600)
        text = refused.stdout + refused.stderr
        assert "ConfirmationRequiredError" in text and "confirm set to 'app_slot'" in text
        assert query(source, "SELECT slot_name FROM pg_replication_slots") == [("app_slot",)]

        dags_test(airflow, env, "pglogical_example_teardown", {"confirm": "app_slot", "staging": True})
        assert query(source, "SELECT slot_name FROM pg_replication_slots") == []
        assert query(source, "SELECT pubname FROM pg_publication") == []
        assert query(target, "SELECT count(*) FROM public.pglogical_progress WHERE slot = 'app_slot'") == [(0,)]
        assert not (staging / "app_slot").exists()
        assert query(target, "SELECT id FROM customers ORDER BY id") == [(1,), (2,)]  # the target tables stay
    finally:
        drop_database(pg_server, src)
        drop_database(pg_server, dw)
