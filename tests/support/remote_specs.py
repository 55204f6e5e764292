"""The native-equivalence workload (``tests/integration/test_native_equivalence.py``) as a pipeline spec whose Spark
is elsewhere — a Spark Connect server, spark-submit, a standalone cluster, an Airflow DAG's spark connection — and
the comparisons of its target (PostgreSQL or Delta) with a native subscriber of ``pub_native``.

``Databases`` makes the source (the workload's tables and publications), the native subscriber and a PostgreSQL
target; ``write_spec`` the spec of slot ``ours`` over ``pub_all`` with ``SPEC_TABLES`` (the publication's filters
and column lists); ``assert_postgres_equals_native`` / ``assert_delta_equals_native`` the end state.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import unsubscribe, wait_for_subscriber
from tests.integration.test_delta_equivalence import delta_rows
from tests.integration.test_native_equivalence import (
    BATCH_ONE,
    BATCH_TWO,
    PRE_EXISTING_SQL,
    PUBLICATIONS_SQL,
    TABLES,
    TABLES_SQL,
    table_rows,
)
from tests.integration.test_snapshot_native import wait_ready

__all__ = ["BATCH_ONE", "BATCH_TWO", "PRE_EXISTING_SQL", "SNAPSHOT_SQL", "SPEC_TABLES", "Databases",
           "assert_delta_equals_native", "assert_postgres_equals_native", "native_view", "write_spec"]

SLOT = "ours"

# test_native_equivalence's APPLY_TABLES as a spec's tables.
SPEC_TABLES: dict[str, dict[str, Any]] = {
    "public.rf_full": {"row_filter": "grp >= 5"},
    "public.rf_key": {"row_filter": "id > 100"},
    "public.rf_null": {"row_filter": "flag"},
    "public.cols": {"columns": ["id", "a", "b"]},
    "public.toasty": {},
    "public.toast_rf": {"row_filter": "id > 100", "unchanged_toast": "reject_and_continue"},
    "public.parent": {},
    "public.child": {},
    "public.seqd": {},
}

# The snapshot's rows besides PRE_EXISTING_SQL's: enough chunks of work for a cluster's two workers' executors.
SNAPSHOT_SQL = PRE_EXISTING_SQL + """
INSERT INTO cols SELECT g, 'a' || g, 's' || g, g FROM generate_series(1000, 5999) g;
INSERT INTO toasty SELECT g, g, repeat(md5(g::text), 300) FROM generate_series(1000, 1049) g;
"""


class Databases:
    """A source, a native subscriber of ``pub_native`` and a PostgreSQL target (``ours``), on the test server; the
    workload's tables everywhere (``ours_sql``: the target's own DDL instead); ``drop`` removes them all."""

    def __init__(self, pg_server: Any, *, copy_data: bool = False, source_sql: str = PRE_EXISTING_SQL,
                 ours_sql: str = TABLES_SQL) -> None:
        self.server = pg_server
        self.names = [make_database(pg_server) for _ in range(3)]
        self.source, self.native, self.ours = (pg_server.dsn(n) for n in self.names)
        self.copy_data = copy_data
        execute(self.source, TABLES_SQL + PUBLICATIONS_SQL + source_sql)
        execute(self.native, TABLES_SQL)
        execute(self.ours, ours_sql)

    def uri(self, which: str) -> str:
        """The URI of ``source`` / ``native`` / ``ours`` (what a spec or an Airflow connection takes)."""
        return str(self.server.uri(self.names[("source", "native", "ours").index(which)]))

    def subscribe(self) -> None:
        """The native subscription (its slot made first: a same-server CREATE SUBSCRIPTION deadlocks otherwise)."""
        execute(self.source, "SELECT pg_create_logical_replication_slot('sub_native', 'pgoutput')")
        execute(self.native, f"CREATE SUBSCRIPTION sub_native CONNECTION '{self.source}' PUBLICATION pub_native "
                             f"WITH (create_slot = false, slot_name = sub_native, copy_data = {self.copy_data})")
        if self.copy_data:
            wait_ready(self.native)

    def drop(self) -> None:
        unsubscribe(self.native)
        # The subscription's walsender on the source outlives DROP SUBSCRIPTION for a moment (seconds on a loaded
        # machine), and DROP DATABASE refuses a database with an active slot even WITH (FORCE).
        deadline = time.monotonic() + 120
        while query(self.source, "SELECT count(*) FROM pg_replication_slots WHERE active AND database = "
                                 "current_database()")[0][0] and time.monotonic() < deadline:
            time.sleep(0.2)
        for name in self.names:
            execute(self.server.dsn(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def write_spec(path: Path, *, source: dict[str, Any], staging: str, target: dict[str, Any],
               spark: dict[str, Any] | None = None, snapshot: bool = False) -> Path:
    """The spec of slot ``ours`` over ``pub_all`` (``source``: its ``dsn`` or ``conn_id``) with ``SPEC_TABLES``."""
    raw: dict[str, Any] = {"source": {**source, "publication": "pub_all", "slot": SLOT}, "staging": {"uri": staging},
                           "target": target, "tables": SPEC_TABLES, "snapshot": {"initial": snapshot}}
    if spark is not None:
        raw["spark"] = spark
    path.write_text(yaml.safe_dump(raw))
    return path


def native_view(native_dsn: str, table: str) -> list[tuple[Any, ...]]:
    """The subscriber's rows as the Delta mirror holds them (``cols`` has a column list: id, a, b)."""
    rows = table_rows(native_dsn, table)
    return [(r[0], r[1], r[3]) for r in rows] if table == "cols" else rows


def assert_postgres_equals_native(dbs: Databases) -> None:
    """``ours`` holds the native subscriber's rows and sequence, and the transforms happened (not vacuous)."""
    wait_for_subscriber(dbs.source, dbs.native)
    for table in TABLES:
        if table == "toast_rf":  # test_native_equivalence's stated deviation is not part of this workload
            assert table_rows(dbs.ours, table) == [(120, 2, "w" * 9000)]
            continue
        assert table_rows(dbs.ours, table) == table_rows(dbs.native, table), table
    assert table_rows(dbs.native, "rf_full") == [(2, 6, "b"), (4, 9, "d2")]
    assert table_rows(dbs.native, "child") == [(50, 5, "c5")]
    seq = "SELECT last_value, is_called FROM seqd_id_seq"
    assert query(dbs.ours, seq) == query(dbs.native, seq)


def assert_delta_equals_native(dbs: Databases, lake: DeltaLocation) -> None:
    """The Delta tables under ``lake`` hold the native subscriber's rows (read with delta-rs), transforms included."""
    wait_for_subscriber(dbs.source, dbs.native)
    for table in TABLES:
        if table == "toast_rf":  # test_native_equivalence's stated deviation
            assert delta_rows(lake, table) == [(120, 2, "w" * 9000)]
            continue
        assert delta_rows(lake, table) == native_view(dbs.native, table), table
    assert delta_rows(lake, "rf_full") == [(2, 6, "b"), (4, 9, "d2")]  # the transforms happened
    assert delta_rows(lake, "child") == [(50, 5, "c5")]
