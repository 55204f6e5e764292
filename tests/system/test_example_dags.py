"""Every example DAG runs through the real `airflow dags test` against the test PostgreSQL and local Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.harness.pgserver import drop_database, execute, make_database
from scripts.harness.pgserver import query as rows
from tests.support.airflowdb import dag_runs, task_returns
from tests.support.imports import heavy_imports, recording_env

DAG_IDS = ("pglogical_example_pipeline", "pglogical_example_replay", "pglogical_example_teardown")
SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers,
                     amount numeric(12,2) NOT NULL, region text NOT NULL, note text);
-- Row-filter columns must be in the replica identity when UPDATE/DELETE are published.
CREATE UNIQUE INDEX orders_identity ON orders (id, amount, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_identity;
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;  -- out-of-line TOAST even when compressible
"""
PHASE_1 = """
INSERT INTO customers SELECT g, 'customer ' || g FROM generate_series(1, 20) g;
INSERT INTO orders SELECT g, 1 + g % 20, (g * 37) % 400, CASE WHEN g % 3 = 0 THEN 'US' ELSE 'EU' END,
                          CASE WHEN g % 5 = 0 THEN repeat('toast ', 2000) ELSE 'short' END
                   FROM generate_series(1, 60) g;
UPDATE orders SET note = note || ' updated' WHERE id % 7 = 0;
DELETE FROM orders WHERE id % 11 = 0;
"""
PHASE_2 = """
UPDATE customers SET name = name || ' (vip)' WHERE id <= 5;
UPDATE orders SET region = 'US' WHERE id = 1;           -- leaves the filter: deleted from the target
UPDATE orders SET amount = 350 WHERE id = 2 AND note = 'short';  -- enters the filter: inserted
TRUNCATE orders;
INSERT INTO orders SELECT g, 1 + g % 20, 100 + g * 3, 'EU', repeat('late ', 1500) FROM generate_series(100, 130) g;
UPDATE orders SET customer_id = 2 WHERE id = 105;       -- TOASTed note unchanged: resolved from the target
DELETE FROM customers WHERE id = 20 AND NOT EXISTS (SELECT 1 FROM orders WHERE customer_id = 20);
"""
ORDERS_SOURCE = "SELECT id, amount, region, note FROM orders WHERE amount > 100 AND region = 'EU' ORDER BY id"
ORDERS_TARGET = "SELECT id, amount, region, note FROM orders_eu ORDER BY id"
CUSTOMERS = "SELECT id, name FROM customers ORDER BY id"


def dags_test(airflow, env: dict[str, str], dag_id: str, conf: dict | None = None, logical_date: str = "") -> str:
    args = ["dags", "test", dag_id] + ([logical_date] if logical_date else []) + (
        ["--conf", json.dumps(conf)] if conf else [])
    result = airflow.run(*args, env=env, timeout=1200)  # Spark on a shared 2-core machine can take minutes
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "state=success" in output, output[-6000:]
    return output


@pytest.fixture(scope="module")
def pipeline(pg_server, airflow, tmp_path_factory):
    """Source and target databases, the example DAG's connections, and three pipeline runs."""
    src, dw = make_database(pg_server), make_database(pg_server)
    staging = tmp_path_factory.mktemp("staging")
    lineage = staging.parent / f"{staging.name}-openlineage.jsonl"
    env = {"AIRFLOW_CONN_PGLOGICAL_SOURCE": pg_server.uri(src), "AIRFLOW_CONN_PGLOGICAL_TARGET": pg_server.uri(dw),
           "PGLOGICAL_STAGING_URI": str(staging),
           # The OpenLineage provider's file transport: every event as one JSON line, no server.
           "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(lineage),
                                                          "append": True})}
    state = {"env": env, "src": pg_server.dsn(src), "dw": pg_server.dsn(dw), "staging": staging, "lineage": lineage,
             "src_db": src, "dw_db": dw, "authority": f"{pg_server.host}:{pg_server.port}", "airflow_home": str(airflow.home)}
    execute(state["src"], SCHEMA)
    try:
        dags_test(airflow, env, "pglogical_example_pipeline")  # creates publication and slot
        execute(state["src"], PHASE_1)
        state["run_1"] = dags_test(airflow, env, "pglogical_example_pipeline", {"max_changes": 1000})
        state["phase_1"] = (rows(state["src"], ORDERS_SOURCE), rows(state["src"], CUSTOMERS))
        state["phase_1_target"] = (rows(state["dw"], ORDERS_TARGET), rows(state["dw"], CUSTOMERS))
        state["phase_1_end"] = staged_end_lsns(staging)[-1]
        execute(state["src"], PHASE_2)
        dags_test(airflow, env, "pglogical_example_pipeline")
        yield state
    finally:
        drop_database(pg_server, src)
        drop_database(pg_server, dw)


def staged_end_lsns(staging: Path) -> list[str]:
    manifests = sorted(staging.glob("app_slot/batches/*/_manifest.json"))
    return [json.loads(m.read_text())["end_lsn"] for m in manifests]


def test_every_example_dag_file_imports_cleanly(airflow, tmp_path):
    # The DagBag the dag-processor uses, in the Airflow home's environment; stdout also carries
    # Airflow's log lines, so the result is the last line.
    script = ("import json; from airflow.dag_processing.dagbag import DagBag; b = DagBag(); "
              "print(json.dumps({'errors': b.import_errors, 'dags': sorted(b.dag_ids)}))")
    record = tmp_path / "modules.txt"
    result = subprocess.run([sys.executable, "-c", script], env=recording_env(record, airflow.env),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    bag = json.loads(result.stdout.strip().splitlines()[-1])
    assert bag["errors"] == {}
    assert set(bag["dags"]) >= set(DAG_IDS)
    # A DAG file is parsed by the dag-processor and again by every task's process: its imports stay light.
    assert heavy_imports(record) == []
    files = {p.name for p in (Path(__file__).parents[2] / "dags").glob("*.py")}
    assert files == {f"{d}.py" for d in DAG_IDS}, "every example DAG file must be covered here"


def test_the_pipeline_dag_applies_the_filtered_tables_after_a_triggered_run(pipeline):
    assert pipeline["phase_1_target"] == pipeline["phase_1"]
    assert pipeline["phase_1"][0], "the workload must leave rows matching the filter"


def test_the_pipeline_dags_tasks_record_every_decode_and_apply_in_the_run_history(pipeline):
    from airflow_provider_pglogical.history.store import RunHistory

    records = RunHistory.from_uri(str(pipeline["staging"]), "app_slot").records()
    assert [(r.kind, r.tool, r.outcome) for r in records] == [("decode", "airflow", "ok"), ("apply", "airflow", "ok")] * 3
    decodes, applies = records[0::2], records[1::2]
    assert decodes[1].changes > 0 and decodes[1].slot_figures.wal_status == "reserved"
    assert [a.batches_applied > 0 for a in applies] == [d.batches_staged > 0 for d in decodes]
    assert decodes[1].end_lsn == pipeline["phase_1_end"] == applies[1].end_lsn
    assert "check_slot_health" in pipeline["run_1"]


def test_the_pipeline_dag_follows_updates_deletes_and_a_truncate(pipeline):
    assert rows(pipeline["dw"], ORDERS_TARGET) == rows(pipeline["src"], ORDERS_SOURCE)
    assert rows(pipeline["dw"], CUSTOMERS) == rows(pipeline["src"], CUSTOMERS)


def test_rerunning_the_pipeline_dag_without_new_wal_stages_and_changes_nothing(airflow, pipeline, tmp_path):
    before = staged_end_lsns(pipeline["staging"])
    record = tmp_path / "modules.txt"
    output = dags_test(airflow, recording_env(record, {**airflow.env, **pipeline["env"]}),
                       "pglogical_example_pipeline")
    assert staged_end_lsns(pipeline["staging"]) == before
    # A run with nothing to do imports neither Spark's Python side nor pandas nor a lake library (seconds of every
    # such run): not the DAG file's parse, not the decode of WAL with nothing published, not the apply of no batch.
    assert heavy_imports(record) == []
    # Nothing to apply: the apply task starts no JVM (its row filter would need Spark only for a pending batch).
    assert "Spark-Submit cmd" not in output and "0 batch(es) applied in the worker, no spark-submit" in output
    # The apply task reports every staged batch as already applied, in its XCom as the spark-submit route would.
    assert task_returns(airflow.home, "pglogical_example_pipeline", "pglogical.apply")[-1] == \
        {"batches": len(before), "applied": 0, "rows": {}}
    assert rows(pipeline["dw"], ORDERS_TARGET) == rows(pipeline["src"], ORDERS_SOURCE)
    assert rows(pipeline["dw"], CUSTOMERS) == rows(pipeline["src"], CUSTOMERS)


def test_clearing_and_rerunning_the_first_past_run_neither_loses_nor_duplicates_changes(airflow, pipeline):
    execute(pipeline["src"], "INSERT INTO customers VALUES (500, 'late customer');"
                             "INSERT INTO orders VALUES (500, 500, 999, 'EU', 'late order');")
    # The first past run's logical date, read from the metadata database (what `airflow dags list-runs` lists).
    runs = dag_runs(airflow.home, "pglogical_example_pipeline")
    first = min(runs)
    cleared = airflow.run("tasks", "clear", "pglogical_example_pipeline", "--yes", env=pipeline["env"])
    assert cleared.returncode == 0, cleared.stderr[-2000:]
    dags_test(airflow, pipeline["env"], "pglogical_example_pipeline", logical_date=first)
    assert dag_runs(airflow.home, "pglogical_example_pipeline") == runs  # the first run re-ran, no run was added
    assert rows(pipeline["dw"], ORDERS_TARGET) == rows(pipeline["src"], ORDERS_SOURCE)
    assert rows(pipeline["dw"], CUSTOMERS) == rows(pipeline["src"], CUSTOMERS)
    assert (500, "late customer") in rows(pipeline["dw"], CUSTOMERS)


def test_the_replay_dag_rebuilds_the_target_up_to_a_chosen_lsn(airflow, pipeline):
    dags_test(airflow, pipeline["env"], "pglogical_example_replay", {"upto_lsn": pipeline["phase_1_end"]})
    assert (rows(pipeline["dw"], ORDERS_TARGET), rows(pipeline["dw"], CUSTOMERS)) == pipeline["phase_1"]


def test_the_replay_dag_without_a_bound_rebuilds_the_current_state_in_lsn_order(airflow, pipeline):
    dags_test(airflow, pipeline["env"], "pglogical_example_replay")
    assert rows(pipeline["dw"], ORDERS_TARGET) == rows(pipeline["src"], ORDERS_SOURCE)
    assert rows(pipeline["dw"], CUSTOMERS) == rows(pipeline["src"], CUSTOMERS)


def lineage_events(pipeline, task_id: str) -> list[dict]:
    """COMPLETE events of one task of the pipeline DAG, in the order they were written."""
    events = [json.loads(line) for line in pipeline["lineage"].read_text().splitlines() if line.strip()]
    return [e for e in events if e.get("eventType") == "COMPLETE"
            and e.get("job", {}).get("name") == f"pglogical_example_pipeline.pglogical.{task_id}"]


def names(datasets: list[dict]) -> set[tuple[str, str]]:
    return {(d["namespace"], d["name"]) for d in datasets}


def test_openlineage_events_of_the_decode_task_name_the_source_tables_and_their_staged_logs(pipeline):
    events = lineage_events(pipeline, "decode")
    assert events, "the OpenLineage file transport received no decode event"
    source = f"postgres://{pipeline['authority']}"
    for event in events:
        assert names(event["inputs"]) == {(source, f"{pipeline['src_db']}.public.orders"),
                                          (source, f"{pipeline['src_db']}.public.customers")}
        assert names(event["outputs"]) == {("pglogical://app_slot", "public.orders"),
                                           ("pglogical://app_slot", "public.customers")}
    staged = [{d["name"]: d["outputFacets"]["outputStatistics"]["rowCount"] for d in e["outputs"]} for e in events]
    assert any(s["public.orders"] > 0 and s["public.customers"] > 0 for s in staged), staged


def test_openlineage_events_of_the_apply_task_name_source_and_target_tables_with_rows_written(pipeline):
    events = lineage_events(pipeline, "apply")
    assert events, "the OpenLineage file transport received no apply event"
    source, target = f"postgres://{pipeline['authority']}", f"postgres://{pipeline['authority']}"
    for event in events:
        assert names(event["inputs"]) == {(source, f"{pipeline['src_db']}.public.orders"),
                                          (source, f"{pipeline['src_db']}.public.customers"),
                                          ("pglogical://app_slot", "public.orders"),
                                          ("pglogical://app_slot", "public.customers")}
        assert names(event["outputs"]) == {(target, f"{pipeline['dw_db']}.public.orders_eu"),
                                           (target, f"{pipeline['dw_db']}.public.customers")}
    written = [{d["name"].rsplit(".", 1)[1]: d["outputFacets"]["outputStatistics"]["rowCount"] for d in e["outputs"]}
               for e in events]
    # Phase 1 inserts 20 customers and the matching orders; the run after it writes them.
    assert any(w["customers"] >= 20 and w["orders_eu"] > 0 for w in written), written


def test_the_apply_task_emits_an_asset_event_per_target_table_with_the_rows_applied(pipeline):
    import sqlite3

    db = sqlite3.connect(Path(pipeline["airflow_home"]) / "airflow.db")
    try:
        rows = db.execute("SELECT a.uri, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                          "WHERE a.uri LIKE 'pglogical://app_slot/target/%' ORDER BY e.id").fetchall()
    finally:
        db.close()
    uris = {uri for uri, _ in rows}
    assert uris == {"pglogical://app_slot/target/public.orders_eu", "pglogical://app_slot/target/public.customers"}
    extras = [json.loads(extra) for uri, extra in rows if uri.endswith("public.customers")]
    assert any(e.get("rows", 0) >= 20 and e.get("end_lsn") for e in extras), extras


# Last in this module (pytest keeps a module's order): it drops the pipeline every test above shares.
def test_the_teardown_dag_drops_the_pipeline_only_when_confirmed_with_the_slot_name(airflow, pipeline):
    source, target, staging = pipeline["src"], pipeline["dw"], pipeline["staging"]
    assert "prune_staging" in pipeline["run_1"]  # every pipeline run records how far its target applied
    kept = (rows(target, ORDERS_TARGET), rows(target, CUSTOMERS))
    assert all(kept)  # the target's tables hold rows (what an earlier test of the module left them)
    assert rows(source, "SELECT slot_name FROM pg_replication_slots") == [("app_slot",)]
    assert (staging / "app_slot").is_dir()

    refused = airflow.run("dags", "test", "pglogical_example_teardown", "--conf", '{"confirm": "other"}',
                          env=pipeline["env"], timeout=600)
    text = refused.stdout + refused.stderr
    assert "ConfirmationRequiredError" in text and "confirm set to 'app_slot'" in text
    assert rows(source, "SELECT slot_name FROM pg_replication_slots") == [("app_slot",)]

    dags_test(airflow, pipeline["env"], "pglogical_example_teardown", {"confirm": "app_slot", "staging": True})
    assert rows(source, "SELECT slot_name FROM pg_replication_slots") == []
    assert rows(source, "SELECT pubname FROM pg_publication") == []
    assert rows(target, "SELECT count(*) FROM public.pglogical_progress WHERE slot = 'app_slot'") == [(0,)]
    assert not (staging / "app_slot").exists()
    assert (rows(target, ORDERS_TARGET), rows(target, CUSTOMERS)) == kept  # the target tables stay
