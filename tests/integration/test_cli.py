"""The `pglogical` console script against the real test PostgreSQL: exit codes, stderr, JSON on stdout."""

from __future__ import annotations

import copy
import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from scripts.harness.pgserver import drop_database, execute, make_database, query
from scripts.harness.userenv import VENV_BIN, run_as_user
from tests.support.cli import pglogical
from tests.support.spark import TEST_SPARK_CONF

# The console script's main() in the venv's Python, reporting on stderr's last line which of the packages an
# empty run must not pay for the process imported (pyspark/py4j: a JVM can only be started through them).
IMPORT_PROBE = ("import sys\nfrom airflow_provider_pglogical.cli import main\ncode = main(sys.argv[1:])\n"
                "heavy = [m for m in ('airflow', 'pyspark', 'py4j') if m in sys.modules]\n"
                "print('imported:', *heavy, file=sys.stderr)\nsys.exit(code)\n")
SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int REFERENCES customers, amount numeric(12,2) NOT NULL,
                     region text NOT NULL, note text);
CREATE UNIQUE INDEX orders_identity ON orders (id, amount, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_identity;
"""

# The spec's tables: a filtered, column-listed, renamed table and a plain one (shared with test_cli_delta).
TABLES = {"public.orders": {"row_filter": "amount > 100 AND region = 'EU'",
                            "columns": ["id", "amount", "region", "note"], "target": "public.orders_eu"},
          "public.customers": {}}


@pytest.fixture
def pipeline(pg_server, pg_dsn, pg_dbname, tmp_path):
    """A source database with the example schema, an empty target, and a spec file for both."""
    target = make_database(pg_server)
    execute(pg_dsn, SCHEMA)
    doc = {
        "source": {"dsn": pg_server.uri(pg_dbname), "publication": "cli_pub", "slot": "cli_slot", "create": True},
        "staging": {"uri": str(tmp_path / "staging")},
        "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
        "tables": copy.deepcopy(TABLES),  # tests change their spec in place
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        yield {"spec": str(path), "doc": doc, "source": pg_dsn, "target": pg_server.dsn(target), "tmp": tmp_path}
    finally:
        drop_database(pg_server, target)


def pglogical_probed(*args: str, extra: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``pglogical ARGS`` as a user runs it, and the heavy packages the process imported."""
    result = run_as_user([str(VENV_BIN / "python"), "-c", IMPORT_PROBE, *args], extra, timeout=300)
    last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    assert last.startswith("imported:"), result.stderr[-3000:]
    return result, last.split()[1:]


def write_spec(pipeline, **changes) -> str:
    doc = json.loads(json.dumps(pipeline["doc"]))
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        doc[section][key] = value
    path = pipeline["tmp"] / "changed.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_validate_prints_the_tables_of_a_valid_spec(pipeline):
    result = pglogical("validate", "--spec", pipeline["spec"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"spec": pipeline["spec"], "valid": True,
                                         "tables": ["public.customers", "public.orders"]}


def test_an_invalid_spec_fails_with_one_line_naming_the_key_and_no_traceback(pipeline):
    spec = write_spec(pipeline, source__crate=True)
    result = pglogical("decode", "--spec", spec)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"pglogical decode: error: {spec}: source.crate: unknown key (did you mean 'create'?)"]


def test_debug_shows_the_traceback(pipeline):
    result = pglogical("--debug", "status", "--spec", write_spec(pipeline, source__crate=True))
    assert result.returncode != 0 and "Traceback" in result.stderr and "SpecError" in result.stderr


def test_a_missing_publication_without_create_is_a_typed_one_line_error(pipeline):
    result = pglogical("decode", "--spec", write_spec(pipeline, source__create=False))
    assert result.returncode == 1
    assert result.stderr.strip() == ("pglogical decode: error: publication 'cli_pub' does not exist; create it or set "
                                     "source.create: true in the spec")


def test_an_unreachable_source_fails_with_one_line(pipeline):
    result = pglogical("status", "--spec", write_spec(pipeline, source__dsn="postgresql://nobody@127.0.0.1:1/x"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pglogical status: error: OperationalError:")


def test_status_before_the_first_decode_reports_no_slot_and_no_batches(pipeline):
    result = pglogical("status", "--spec", pipeline["spec"])
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["source"]["slot"] is None
    assert status["staging"]["batch_count"] == 0 and status["target"]["watermarks"] == {}
    assert status["staging"]["oldest_start_lsn"] is None and "batches" not in status["staging"]


def test_decode_then_run_stages_and_applies_the_filtered_changes_and_status_shows_them(pipeline):
    first = pglogical("decode", "--spec", pipeline["spec"])
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["ensure"]["created_slot"] is True
    execute(pipeline["source"], """
        INSERT INTO customers VALUES (1, 'a'), (2, 'b');
        INSERT INTO orders VALUES (1, 1, 150, 'EU', 'x'), (2, 2, 50, 'EU', 'y'), (3, 1, 500, 'US', 'z');
        UPDATE orders SET amount = 200 WHERE id = 2;
        DELETE FROM orders WHERE id = 1;
    """)
    result = pglogical("run", "--spec", pipeline["spec"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["decode"]["changes"] == 7 and summary["apply"]["batches_applied"] == 1
    assert summary["apply"]["batches_replayed_in_order"] == 0
    assert "pglogical: staged" in result.stderr  # progress goes to stderr
    assert query(pipeline["target"], "SELECT id, amount, region, note FROM orders_eu ORDER BY id") == \
        query(pipeline["source"], "SELECT id, amount, region, note FROM orders WHERE amount > 100 AND region = 'EU' "
                                  "ORDER BY id")

    staged_summary = json.loads(pglogical("status", "--spec", pipeline["spec"]).stdout)["staging"]
    assert "batches" not in staged_summary  # listed only with --batches
    status = json.loads(pglogical("status", "--spec", pipeline["spec"], "--batches").stdout)
    [batch] = status["staging"]["batches"]
    assert {k: v for k, v in status["staging"].items() if k != "batches"} == staged_summary
    assert staged_summary["batch_count"] == 1 and staged_summary["pending_batches"] == 0 and staged_summary["bytes"] == batch["bytes"]
    assert staged_summary["oldest_start_lsn"] == batch["start_lsn"] and staged_summary["staged_changes"] == 7
    assert staged_summary["retention"] is None and staged_summary["pruned"] is None
    assert list(staged_summary["targets"].values()) == [batch["end_lsn"]]  # the run recorded how far its target applied
    # (lag is not 0: the target lives on the same server and apply wrote WAL after the drain)
    assert status["source"]["slot"]["confirmed_flush_lsn"] == batch["end_lsn"] == status["staging"]["last_end_lsn"]
    assert status["source"]["slot"]["wal_retention"] == "ok"
    assert batch["tables"] == {"public.customers": 2, "public.orders": 5}
    assert status["target"]["watermarks"] == {"public.customers": batch["end_lsn"], "public.orders_eu": batch["end_lsn"]}

    # The spec's filter (amount > 100 AND region = 'EU') is one this process evaluates: a small batch starts no JVM.
    assert "starting Spark" not in result.stderr
    assert summary["spark"]["started"] is None and summary["apply"]["spark_started"] is False

    again = pglogical("run", "--spec", pipeline["spec"])  # nothing new: nothing staged or applied twice
    assert again.returncode == 0 and json.loads(again.stdout)["apply"]["batches_applied"] == 0
    assert json.loads(again.stdout)["spark"] == {"started": None, "start_s": None, "apply_waited_s": None}


def test_validate_with_filters_rejects_an_expression_the_apply_cannot_evaluate_like_postgres(pipeline):
    spec = pipeline["doc"]
    spec["tables"]["public.orders"]["row_filter"] = "amount / 2 > 100"  # a publication takes it; 7 / 2 is 3.5 in Spark
    path = pipeline["tmp"] / "filters.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert pglogical("validate", "--spec", str(path)).returncode == 0
    result = pglogical("validate", "--filters", "--spec", str(path))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"pglogical validate: error: {path}: tables.public.orders.row_filter: row filter: operator / is not supported")


SECRET = """
CREATE TABLE secret (id int PRIMARY KEY, v text NOT NULL);
INSERT INTO secret SELECT g, 'hidden' || g FROM generate_series(1, 20) g;
CREATE PUBLICATION secret_pub FOR TABLE secret WHERE (id <= 5);
"""


def secret_spec(pipeline, row_filter: str, name: str) -> str:
    """A spec snapshotting ``public.secret`` (20 rows, published WHERE id <= 5) with the given row filter."""
    execute(pipeline["source"], SECRET)
    doc = {**pipeline["doc"], "snapshot": {"initial": True},
           "source": {**pipeline["doc"]["source"], "publication": "secret_pub", "create": False},
           "tables": {"public.secret": {"row_filter": row_filter}}}
    path = pipeline["tmp"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def nothing_ran_on_the_source(pipeline) -> bool:
    return query(pipeline["source"], "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'cli_slot'") == [] \
        and not (pipeline["tmp"] / "staging").exists()


def test_a_filter_whose_comments_would_escape_its_parentheses_is_refused_and_the_publication_filter_holds(pipeline):
    # Pasted into the snapshot's WHERE, the text would read "(id <= 5) AND (true) OR (true)": every row.
    spec = secret_spec(pipeline, "/* ( */ true) OR (true /* ) */", "bypass")
    refused = pglogical("run", "--spec", spec)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        f'pglogical run: error: {spec}: tables.public.secret.row_filter: does not parse: syntax error at or near ")" '
        "(at character 13)"]
    assert nothing_ran_on_the_source(pipeline)

    # A filter with comments PostgreSQL reads as one expression is evaluated as its tree: the publication's
    # five rows reach the target, no more.
    spec = secret_spec_again(pipeline, "true /* ) OR (true */", "commented")
    ran = pglogical("run", "--spec", spec)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["decode"]["snapshot"]["initial"]["tables"]["public.secret"]["rows"] == 5
    assert query(pipeline["target"], "SELECT id FROM public.secret ORDER BY id") == [(i,) for i in range(1, 6)]


def secret_spec_again(pipeline, row_filter: str, name: str) -> str:
    doc = yaml.safe_load((pipeline["tmp"] / "bypass.yaml").read_text())
    doc["tables"]["public.secret"]["row_filter"] = row_filter
    path = pipeline["tmp"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_a_volatile_function_in_a_filter_is_refused_before_anything_runs_on_the_source(pipeline):
    spec = secret_spec(pipeline, "pg_sleep(0.2) IS NOT NULL", "sleep")
    for command in ("decode", "run"):
        refused = pglogical(command, "--spec", spec)
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr.strip().splitlines() == [
            f"pglogical {command}: error: {spec}: tables.public.secret.row_filter: function pg_sleep is not allowed "
            "(only immutable built-in functions)"]
    assert nothing_ran_on_the_source(pipeline)


def test_a_subquery_in_a_filter_is_refused_at_load_without_another_rows_value_in_the_error(pipeline):
    spec = secret_spec(pipeline, "id > (SELECT v FROM public.secret WHERE id = 17)::int", "subquery")
    refused = pglogical("decode", "--spec", spec)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"pglogical decode: error: {spec}: tables.public.secret.row_filter: subqueries are not allowed"]
    assert "hidden" not in refused.stderr
    assert nothing_ran_on_the_source(pipeline)


def test_a_function_created_on_the_source_under_a_built_in_name_is_never_called_by_the_snapshot(pipeline):
    # lower(integer) is no built-in: only this function would match (and select every row). A native table sync
    # resolves names with an empty search_path, where it does not exist.
    execute(pipeline["source"], "CREATE FUNCTION public.lower(integer) RETURNS text IMMUTABLE LANGUAGE sql "
                                "AS $$ SELECT 'match' $$")
    spec = secret_spec(pipeline, "lower(id) = 'match'", "shadow")
    failed = pglogical("decode", "--spec", spec)
    assert failed.returncode == 1, failed.stdout
    assert "SQLSTATE 42883: function lower(integer) does not exist" in failed.stderr.strip().splitlines()[-1]


def test_a_filter_failing_on_a_rows_value_in_the_snapshot_names_the_condition_not_the_value(pipeline):
    # Publication rules allow the cast (an immutable built-in); the source fails on the first row's value.
    spec = secret_spec(pipeline, "v::int > 0", "cast")
    failed = pglogical("decode", "--spec", spec)
    assert failed.returncode == 1 and failed.stdout == ""
    errors = [line for line in failed.stderr.splitlines() if line.startswith("pglogical decode: error:")]
    assert len(errors) == 1 and "hidden" not in failed.stderr
    assert errors[0] == failed.stderr.strip().splitlines()[-1]
    assert "reading public.secret chunk 0 failed (SQLSTATE 22P02: invalid_text_representation while evaluating " \
           "the row filter or reading a row" in errors[0]


def test_a_filter_failing_on_a_staged_value_in_the_apply_names_the_condition_not_the_value(pipeline):
    # As a publication with this filter would stop the walsender, the apply stops, without quoting the value.
    execute(pipeline["source"], "CREATE TABLE secret (id int PRIMARY KEY, v text NOT NULL)")
    doc = {**pipeline["doc"], "tables": {"public.secret": {"row_filter": "v::int > 0"}}}
    path = pipeline["tmp"] / "apply_cast.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert pglogical("decode", "--spec", str(path)).returncode == 0  # creates the slot
    execute(pipeline["source"], "INSERT INTO secret VALUES (1, 'hidden1')")
    failed = pglogical("run", "--spec", str(path))
    assert failed.returncode == 1
    error = failed.stderr.strip().splitlines()[-1]
    assert error.startswith("pglogical run: error: ") and "hidden" not in error
    assert "[CAST_INVALID_INPUT] SQLSTATE 22018 while the apply evaluated a staged value" in error


def test_decode_with_an_initial_snapshot_stages_pre_existing_rows_and_resync_restages_one_table(pipeline):
    execute(pipeline["source"], "INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 50) g",
            "INSERT INTO orders SELECT g, 1 + g % 50, g * 10, CASE WHEN g % 2 = 0 THEN 'EU' ELSE 'US' END, 'n' "
            "FROM generate_series(1, 40) g")
    spec = pipeline["tmp"] / "snap.yaml"
    spec.write_text(yaml.safe_dump({**pipeline["doc"], "snapshot": {"initial": True}}))
    decoded = pglogical("decode", "--spec", str(spec))
    assert decoded.returncode == 0, decoded.stderr
    initial = json.loads(decoded.stdout)["snapshot"]["initial"]
    # the row filter and the column list were applied by the source: 20 EU orders, amount > 100
    assert initial["tables"]["public.orders"]["rows"] == len(query(
        pipeline["source"], "SELECT 1 FROM orders WHERE amount > 100 AND region = 'EU'"))
    assert initial["tables"]["public.customers"]["rows"] == 50
    status = json.loads(pglogical("status", "--spec", str(spec)).stdout)
    assert {t: s["state"] for t, s in status["sync"].items()} == {"public.customers": "staged",
                                                                 "public.orders": "staged"}
    assert status["sync"]["public.orders"]["lsn"] == initial["lsn"]
    assert status["source"]["slot"]["confirmed_flush_lsn"] == initial["lsn"]

    resynced = pglogical("resync", "--spec", str(spec), "--table", "public.customers")
    assert resynced.returncode == 0, resynced.stderr
    later = json.loads(resynced.stdout)
    assert set(later["tables"]) == {"public.customers"} and later["lsn"] > initial["lsn"]
    status = json.loads(pglogical("status", "--spec", str(spec)).stdout)
    assert status["sync"]["public.customers"]["lsn"] == later["lsn"]

    unknown = pglogical("resync", "--spec", str(spec), "--table", "public.nope")
    assert unknown.returncode == 1 and "public.nope" in unknown.stderr
    # a spec asking for an initial snapshot of a slot created without one: the typed error names the way out
    other = pipeline["tmp"] / "other.yaml"
    doc = {**pipeline["doc"], "snapshot": {"initial": True}, "staging": {"uri": str(pipeline["tmp"] / "other")}}
    other.write_text(yaml.safe_dump(doc))
    refused = pglogical("decode", "--spec", str(other))
    assert refused.returncode == 1 and "pglogical resync" in refused.stderr and "cli_slot" in refused.stderr


def test_apply_with_a_target_conn_id_keeps_the_connections_libpq_extras(pipeline, pg_server):
    """`target.conn_id` goes through the one DSN builder (hooks/dsn.py): its sslmode reaches libpq.

    The test server speaks no SSL, so ``sslmode=require`` must make the target connection fail,
    while ``sslmode=disable`` on the same connection works; a builder dropping the extras passes both.
    """
    target_db = pipeline["target"].split("dbname=")[1].split()[0]
    doc = {**pipeline["doc"], "target": {"kind": "postgres", "conn_id": "pgl_target"}}
    spec = pipeline["tmp"] / "conn_id.yaml"
    spec.write_text(yaml.safe_dump(doc))

    def connection(sslmode: str) -> str:
        return json.dumps({"conn_type": "postgres", "host": pg_server.host, "port": pg_server.port,
                           "schema": target_db, "login": pg_server.superuser, "extra": {"sslmode": sslmode}})

    ok = pglogical("apply", "--spec", str(spec), extra={"AIRFLOW_CONN_PGL_TARGET": connection("disable")})
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["batches_applied"] == 0

    refused = pglogical("apply", "--spec", str(spec), extra={"AIRFLOW_CONN_PGL_TARGET": connection("require")})
    assert refused.returncode != 0
    assert "SSL" in refused.stderr


def test_run_decode_and_status_on_an_empty_slot_import_neither_airflow_nor_spark(pipeline):
    """An empty run pays no Airflow import (seconds: the slot client is plain psycopg2) and starts no JVM."""
    created = pglogical("run", "--spec", pipeline["spec"])  # creates publication and slot; nothing to drain
    assert created.returncode == 0, created.stderr
    results = {}
    for command in ("run", "decode", "status"):
        results[command], heavy = pglogical_probed(command, "--spec", pipeline["spec"])
        assert results[command].returncode == 0, results[command].stderr
        assert heavy == [], f"pglogical {command} on an empty slot imported {heavy}"
    assert json.loads(results["run"].stdout)["spark"]["started"] is None
    assert "starting Spark" not in results["run"].stderr


def test_a_source_given_by_conn_id_is_read_through_the_airflow_hook(pipeline, pg_server, pg_dbname):
    """``source.conn_id``: the slot client connects through ``PgLogicalHook`` (the Airflow connection and its
    extras); that path, and only that one, imports Airflow."""
    doc = {**pipeline["doc"], "source": {**pipeline["doc"]["source"], "conn_id": "pgl_source"}}
    del doc["source"]["dsn"]
    spec = pipeline["tmp"] / "source_conn_id.yaml"
    spec.write_text(yaml.safe_dump(doc))

    def connection(sslmode: str) -> dict[str, str]:
        return {"AIRFLOW_CONN_PGL_SOURCE": json.dumps({
            "conn_type": "postgres", "host": pg_server.host, "port": pg_server.port, "schema": pg_dbname,
            "login": pg_server.superuser, "extra": {"sslmode": sslmode}})}

    decoded, heavy = pglogical_probed("decode", "--spec", str(spec), extra=connection("disable"))
    assert decoded.returncode == 0, decoded.stderr
    assert json.loads(decoded.stdout)["ensure"]["created_slot"] is True
    assert "airflow" in heavy and "pyspark" not in heavy
    refused = pglogical("status", "--spec", str(spec), extra=connection("require"))  # the extras reach libpq
    assert refused.returncode == 1 and "SSL" in refused.stderr


def test_a_spark_that_does_not_start_fails_the_run_after_the_drain_staged_and_advanced(pipeline):
    """The JVM starts while the drain runs; when it cannot start, the drain still stages and advances the slot
    (after the manifest, as always), the run fails with one line naming Spark, and a later apply applies it."""
    assert pglogical("decode", "--spec", pipeline["spec"]).returncode == 0
    execute(pipeline["source"], "INSERT INTO customers VALUES (1, 'a'), (2, 'b')")
    # The Spark transforms forced (the spec's filter is one the process evaluates): Spark starts during the drain.
    failed = pglogical("run", "--spec", pipeline["spec"], extra={"JAVA_HOME": str(pipeline["tmp"] / "no-java"),
                                                                 "PGLOGICAL_APPLY_DIRECT": "0"})
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.index("starting Spark (local[2]) in the background") < failed.stderr.index("pglogical: staged")
    error = failed.stderr.strip().splitlines()[-1]
    assert error.startswith(
        "pglogical run: error: Spark (local[2]) did not start: PySparkRuntimeError: [JAVA_GATEWAY_EXITED]")
    # The JVM's output is kept where the error says (a successful run removes its log file).
    log_file = Path(error.rsplit("(Spark's own output: ", 1)[1].rstrip(")"))
    assert f"{pipeline['tmp'] / 'no-java'}/bin/java: No such file or directory" in log_file.read_text()
    status = json.loads(pglogical("status", "--spec", pipeline["spec"], "--batches").stdout)
    [batch] = status["staging"]["batches"]
    assert batch["tables"] == {"public.customers": 2} and status["staging"]["pending_batches"] == 1
    assert status["source"]["slot"]["confirmed_flush_lsn"] == batch["end_lsn"]
    assert status["target"]["watermarks"] == {}

    applied = pglogical("apply", "--spec", pipeline["spec"])
    assert applied.returncode == 0, applied.stderr[-3000:]
    assert query(pipeline["target"], "SELECT id, name FROM customers ORDER BY id") == [(1, "a"), (2, "b")]


def sessions_opened(pg_server, dbname: str) -> int:
    """How many sessions were ever opened on ``dbname`` (``pg_stat_database.sessions``), read once none is left
    open: a backend publishes its count by the time it leaves ``pg_stat_activity``. Read from another database."""
    deadline = time.monotonic() + 60
    while True:
        [(open_now, opened)] = query(pg_server.dsn(), "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                     "%s), (SELECT sessions FROM pg_stat_database WHERE datname = %s)", (dbname, dbname))
        if open_now == 0:
            return int(opened)
        assert time.monotonic() < deadline, f"{open_now} session(s) on {dbname} stay open"
        time.sleep(0.1)


def test_apply_and_status_ask_the_postgres_target_on_one_connection_before_spark_starts(pipeline, pg_server):
    """The spec's target is resolved once: the bookkeeping schema, the watermarks and the snapshot sync marks are
    asked on one target connection, closed before Spark starts (the apply's own target opens its connections then).
    The retention step after the apply (how far the target applied) asks on one more."""
    target_db = pipeline["target"].split("dbname=")[1].split()[0]
    before = sessions_opened(pg_server, target_db)
    nothing = pglogical("apply", "--spec", pipeline["spec"])  # nothing staged: no Spark at all
    assert nothing.returncode == 0, nothing.stderr
    assert json.loads(nothing.stdout)["batches_seen"] == 0
    after_nothing = sessions_opened(pg_server, target_db)
    assert after_nothing - before == 2

    assert pglogical("decode", "--spec", pipeline["spec"]).returncode == 0
    # A batch the Spark transforms apply (PGLOGICAL_APPLY_DIRECT=0 below: the direct path would start no Spark).
    execute(pipeline["source"], "INSERT INTO customers VALUES (1, 'a'); INSERT INTO orders VALUES (1, 1, 150, 'EU', 'x')")
    assert pglogical("decode", "--spec", pipeline["spec"]).returncode == 0
    # A Spark that cannot start: every target connection the apply opened came before the JVM — the one that
    # resolved the spec's target, and the apply's own session (Spark starts when a step first needs it, here the
    # transforms: the filter is one this process evaluates, so validating it asks Spark nothing).
    failed = pglogical("apply", "--spec", pipeline["spec"], extra={"JAVA_HOME": str(pipeline["tmp"] / "no-java"),
                                                                   "PGLOGICAL_APPLY_DIRECT": "0"})
    assert failed.returncode == 1 and "did not start" in failed.stderr
    after_failed = sessions_opened(pg_server, target_db)
    assert after_failed - after_nothing == 2

    status = pglogical("status", "--spec", pipeline["spec"])
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["target"] == {"kind": "postgres", "watermarks": {}}
    assert sessions_opened(pg_server, target_db) - after_failed == 1


def test_reset_target_empties_the_target_tables_and_forgets_the_watermarks_on_one_connection(pipeline, pg_server):
    """Replay's reset (``ResetTargetOperator``): the existing target tables are emptied and the slot's watermarks
    forgotten in one transaction, on the handle's one connection; another slot's watermark stays."""
    from airflow_provider_pglogical.pipeline.runs import reset_target
    from airflow_provider_pglogical.pipeline.spec import load_spec
    from airflow_provider_pglogical.pipeline.target import spec_target

    execute(pipeline["target"], "CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL)",
            "INSERT INTO customers VALUES (1, 'a')",
            "CREATE TABLE pglogical_progress (slot text NOT NULL, target_table text NOT NULL, end_lsn pg_lsn NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (slot, target_table))",
            "INSERT INTO pglogical_progress (slot, target_table, end_lsn) VALUES ('cli_slot', 'public.customers', "
            "'0/10'), ('other_slot', 'public.customers', '0/20')")
    spec = load_spec(pipeline["spec"])
    with spec_target(spec) as target:
        assert target.watermarks() == {"public.customers": 0x10}
    target_db = pipeline["target"].split("dbname=")[1].split()[0]
    before = sessions_opened(pg_server, target_db)
    lines: list[str] = []
    assert reset_target(spec, log=lines.append) == {"truncated": ["public.customers"]}
    assert sessions_opened(pg_server, target_db) - before == 1
    assert lines == ["emptied 1 target table(s) and reset the watermarks of slot cli_slot"]
    assert query(pipeline["target"], "SELECT count(*) FROM customers") == [(0,)]
    assert query(pipeline["target"], "SELECT slot, end_lsn::text FROM pglogical_progress") == [("other_slot", "0/20")]
