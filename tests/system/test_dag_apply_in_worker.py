"""The pipeline DAG's PostgreSQL apply task in a real ``airflow dags test``: the batches that need no Spark are
applied in the Airflow worker (no spark-submit, no JVM), a batch that needs Spark is spark-submitted with every
batch before it applied once in the worker, and ``spark.apply_in_worker: false`` spark-submits everything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from scripts.harness.pgserver import drop_database, execute, make_database
from scripts.harness.pgserver import query as rows
from tests.support.airflowdb import task_returns

TEST_DAGS = Path(__file__).parent / "dags"
DAG_ID = "pglogical_test_in_worker"
# What the apache-spark provider's SparkSubmitHook logs before it starts spark-submit: one line per JVM.
SUBMIT_LINE = "Spark-Submit cmd"
ITEMS = "CREATE TABLE items (id int PRIMARY KEY, name text, price int NOT NULL)"
ITEMS_ROWS = "SELECT id, name, price FROM items ORDER BY id"
# Every row change of the target's items, by the target's own trigger (the apply runs with session_replication_role
# origin, so ordinary triggers fire): a batch applied twice would leave its changes twice.
AUDIT = """
CREATE TABLE items_audit (id int NOT NULL, op text NOT NULL);
CREATE FUNCTION audit_items() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO items_audit VALUES (CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END, TG_OP);
  RETURN NULL;
END $$;
CREATE TRIGGER items_audit AFTER INSERT OR UPDATE OR DELETE ON items FOR EACH ROW EXECUTE FUNCTION audit_items();
"""


class Pipeline:
    """A source and a target database, a publication and slot on ``items``, the test DAG's spec and environment."""

    def __init__(self, pg_server: Any, tmp_path: Path, slot: str, spark: dict[str, Any] | None = None) -> None:
        self.server, self.slot = pg_server, slot
        self.src_db, self.dw_db = make_database(pg_server), make_database(pg_server)
        self.src, self.dw = pg_server.dsn(self.src_db), pg_server.dsn(self.dw_db)
        self.staging = tmp_path / "staging"
        spec: dict[str, Any] = {"source": {"conn_id": "pgl_source", "publication": f"{slot}_pub", "slot": slot},
                                "staging": {"uri": str(self.staging)},
                                "target": {"kind": "postgres", "conn_id": "pgl_target"},
                                "tables": {"public.items": {}}}
        if spark is not None:
            spec["spark"] = spark
        self.spec = spec
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        self.env = {"AIRFLOW_CONN_PGL_SOURCE": pg_server.uri(self.src_db),
                    "AIRFLOW_CONN_PGL_TARGET": pg_server.uri(self.dw_db),
                    "PGLOGICAL_TEST_IN_WORKER_SPEC": str(path), "AIRFLOW__CORE__DAGS_FOLDER": str(TEST_DAGS)}
        execute(self.src, ITEMS, f"CREATE PUBLICATION {slot}_pub FOR TABLE items",
                f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")

    def run(self, airflow: Any, conf: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> str:
        args = ["dags", "test", DAG_ID] + (["--conf", json.dumps(conf)] if conf else [])
        result = airflow.run(*args, env={**self.env, **(env or {})}, timeout=1500)
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "state=success" in output, output[-6000:]
        return output

    def stage(self, max_changes: int) -> None:
        """Drain the slot into staging here, in batches of about ``max_changes`` changes (as the decode of a run whose
        apply did not run would have left them): the next DAG run's apply finds them all pending."""
        from airflow_provider_pglogical.pipeline.runs import drain
        from airflow_provider_pglogical.pipeline.spec import parse_spec

        source = {**self.spec["source"], "dsn": self.src, "max_changes": max_changes}
        del source["conn_id"]
        drain(parse_spec({**self.spec, "source": source, "target": {"kind": "postgres", "dsn": self.dw}}, env={}))

    def staged_end_lsns(self) -> list[str]:
        return [json.loads(m.read_text())["end_lsn"]
                for m in sorted(self.staging.glob(f"{self.slot}/batches/*/_manifest.json"))]

    def watermark(self) -> list[tuple[Any, ...]]:
        return rows(self.dw, "SELECT target_table, end_lsn::text FROM pglogical_progress WHERE slot = %s",
                    (self.slot,))

    def close(self) -> None:
        execute(self.src, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                          f"WHERE slot_name = '{self.slot}'")
        drop_database(self.server, self.dw_db)
        drop_database(self.server, self.src_db)


def apply_records(pipeline: Pipeline) -> list[Any]:
    from airflow_provider_pglogical.history.store import RunHistory

    return [r for r in RunHistory.from_uri(str(pipeline.staging), pipeline.slot).records() if r.kind == "apply"]


def apply_xcoms(airflow: Any) -> list[dict[str, Any]]:
    """The apply task's return values, oldest first (the Airflow home's metadata database)."""
    return task_returns(airflow.home, DAG_ID, "pglogical.apply")


def test_batches_the_worker_covers_are_applied_there_without_a_spark_submit(pg_server, airflow, tmp_path):
    pipeline = Pipeline(pg_server, tmp_path, "in_worker_slot")
    try:
        execute(pipeline.src, "INSERT INTO items SELECT g, 'item ' || g, g * 10 FROM generate_series(1, 60) g",
                "UPDATE items SET price = price + 1 WHERE id % 4 = 0", "DELETE FROM items WHERE id % 9 = 0")
        output = pipeline.run(airflow)
        assert SUBMIT_LINE not in output, output[-6000:]
        assert "applied in the worker, no spark-submit" in output
        assert rows(pipeline.dw, ITEMS_ROWS) == rows(pipeline.src, ITEMS_ROWS)
        assert pipeline.watermark() == [("public.items", pipeline.staged_end_lsns()[-1])]
        # The task reports as the spark-submit route does: its XCom, one run-history record by "airflow".
        [record] = apply_records(pipeline)
        assert (record.tool, record.outcome, record.batches_applied) == ("airflow", "ok", 1)
        assert record.end_lsn == pipeline.staged_end_lsns()[-1]
        summary = apply_xcoms(airflow)[-1]
        assert (summary["batches"], summary["applied"], set(summary["rows"])) == (1, 1, {"public.items"})
        # A run with nothing new (no spark-submit, the batches reported as already applied, in the XCom too) is the
        # example pipeline DAG's rerun (tests/system/test_example_dags.py), a DAG of the same factory and apply task.
    finally:
        pipeline.close()


def test_a_batch_that_needs_spark_is_submitted_after_the_worker_applied_the_ones_before_it_once(
        pg_server, airflow, tmp_path):
    pipeline = Pipeline(pg_server, tmp_path, "in_worker_then_submit_slot")
    try:
        execute(pipeline.dw, ITEMS, AUDIT)
        # Two transactions, staged as two batches before the run (max_changes 5 closes a batch at the first commit
        # after 5 changes): the first with each key once (the direct path), the second repeating its keys, which
        # with PGLOGICAL_APPLY_INPROCESS_ROWS=0 only Spark's compaction nets.
        execute(pipeline.src, "INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 20) g")
        execute(pipeline.src, "BEGIN; INSERT INTO items SELECT g, 'late ' || g, g FROM generate_series(21, 30) g; "
                              "UPDATE items SET price = price * 100 WHERE id > 20; "
                              "UPDATE items SET name = 'renamed' WHERE id = 3; COMMIT")
        pipeline.stage(max_changes=5)
        output = pipeline.run(airflow, env={"PGLOGICAL_APPLY_INPROCESS_ROWS": "0"})
        staged = pipeline.staged_end_lsns()
        assert len(staged) == 2, staged
        assert "1 batch(es) applied in the worker; a step of the next one needs Spark" in output, output[-6000:]
        assert output.count(SUBMIT_LINE) == 1, output[-6000:]
        assert rows(pipeline.dw, ITEMS_ROWS) == rows(pipeline.src, ITEMS_ROWS)
        # Exactly once: the first batch's 20 inserts, then the second's 10 inserts and one update, each once.
        assert rows(pipeline.dw, "SELECT op, count(*), count(DISTINCT id) FROM items_audit GROUP BY op ORDER BY op") \
            == [("INSERT", 30, 30), ("UPDATE", 1, 1)]
        assert pipeline.watermark() == [("public.items", staged[-1])]
        [record] = apply_records(pipeline)  # one record for the task, both routes' batches in it
        assert (record.tool, record.outcome, record.batches_applied, record.end_lsn) == ("airflow", "ok", 2, staged[-1])
        assert apply_xcoms(airflow)[-1] == {"batches": 2, "applied": 2, "rows": {"public.items": 31}}
    finally:
        pipeline.close()


def test_with_apply_in_worker_off_every_batch_goes_through_spark_submit(pg_server, airflow, tmp_path):
    pipeline = Pipeline(pg_server, tmp_path, "submit_only_slot", spark={"apply_in_worker": False})
    try:
        execute(pipeline.src, "INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 20) g",
                "DELETE FROM items WHERE id = 7")
        output = pipeline.run(airflow)
        assert output.count(SUBMIT_LINE) == 1, output[-6000:]
        assert "apply_in_worker is off" in output
        assert rows(pipeline.dw, ITEMS_ROWS) == rows(pipeline.src, ITEMS_ROWS)
        assert pipeline.watermark() == [("public.items", pipeline.staged_end_lsns()[-1])]
        [record] = apply_records(pipeline)
        assert (record.tool, record.batches_applied) == ("airflow", 1)
    finally:
        pipeline.close()
