"""PgLogicalApplyOperator: spark-submit of the apply app on local[2], DSN only in the environment; the batches that
need no Spark applied in the worker instead."""

from __future__ import annotations

import json
import sys

import pyarrow as pa

from airflow_provider_pglogical.hooks.dsn import libpq_dsn
from airflow_provider_pglogical.operators.apply import PgLogicalApplyOperator, build_package_zip
from scripts.harness.pgserver import make_target
from scripts.harness.pgserver import query as rows
from tests.support.spark import TEST_SPARK_CONF
from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch

REL = Rel("public", "orders", (Col("id", pa.int64(), "bigint", True), Col("amount", pa.decimal128(12, 2),
                                                                          "numeric(12,2)")))


def target_connection(monkeypatch, pg_server, dbname: str, password: str = "s3cret-pw") -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PG_TARGET", json.dumps({
        "conn_type": "postgres", "host": pg_server.host, "port": pg_server.port, "schema": dbname,
        "login": "pglogical_applier", "password": password, "extra": {"sslmode": "disable", "evil": "x"}}))


def stage_orders(tmp_path) -> None:
    write_batch(tmp_path, "slot_a", BatchSpec(0x100, 0x200, {REL: [
        Chg("I", 0x110, 0, new={"id": 1, "amount": 10}), Chg("I", 0x110, 1, new={"id": 2, "amount": 20}),
        Chg("D", 0x120, 0, old={"id": 1}, old_key_only=True)]}))


def test_the_operator_applies_through_spark_submit_without_credentials_on_the_command_line(
        monkeypatch, pg_server, tmp_path, caplog):
    dbname, dsn = make_target(pg_server)
    stage_orders(tmp_path / "staging")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    target_connection(monkeypatch, pg_server, dbname)
    op = PgLogicalApplyOperator(task_id="apply", slot="slot_a", staging_uri=str(tmp_path / "staging"),
                                target_conn_id="pg_target", conn_id="spark_local",
                                tables={"public.orders": {"target": "orders_copy"}}, apply_in_worker=False,
                                conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                      "spark.driver.host": "127.0.0.1", **TEST_SPARK_CONF}, python=sys.executable)
    caplog.set_level("INFO")
    op.execute(context={})
    assert rows(dsn, "SELECT id, amount::text FROM orders_copy") == [(2, "20.00")]
    command = " ".join(op._hook._build_spark_submit_command(op.application))
    assert "s3cret-pw" not in command and "s3cret-pw" not in caplog.text
    assert "--py-files" in command


def test_the_operator_applies_a_batch_that_needs_no_spark_in_the_worker_without_submitting(
        monkeypatch, pg_server, tmp_path):
    dbname, dsn = make_target(pg_server)
    stage_orders(tmp_path / "staging")
    # A master nothing listens on: a spark-submit would fail the task.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_NOWHERE", json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1:9"}))
    target_connection(monkeypatch, pg_server, dbname)
    op = PgLogicalApplyOperator(task_id="apply", slot="slot_a", staging_uri=str(tmp_path / "staging"),
                                target_conn_id="pg_target", conn_id="spark_nowhere",
                                tables={"public.orders": {"target": "orders_copy"}})
    summary = op.execute(context={})
    assert rows(dsn, "SELECT id, amount::text FROM orders_copy") == [(2, "20.00")]
    assert summary["applied"] == summary["batches"] == 1
    assert op._hook is None  # SparkSubmitOperator makes its hook only to submit
    assert op.execute(context={}) == {"batches": 1, "applied": 0, "rows": {}}


def test_the_package_zip_holds_the_apply_modules(tmp_path):
    import zipfile

    names = zipfile.ZipFile(build_package_zip(tmp_path)).namelist()
    assert "airflow_provider_pglogical/apply/runner.py" in names
    assert "airflow_provider_pglogical/apply/targets/postgres/target.py" in names


def test_the_dsn_takes_only_allow_listed_extras():
    class Conn:
        host, port, schema, login, password = "h", 5432, "db", "u", "p'w"
        extra_dejson = {"sslmode": "require", "sslcompression": "1", "cursor": "x"}

    assert libpq_dsn(Conn()) == "host='h' port='5432' dbname='db' user='u' password='p\\'w' sslmode='require'"
