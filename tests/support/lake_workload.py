"""Scripted workloads staged once per test process for the lake targets' tests, which apply the same staged batches
into different targets (Delta, Iceberg; local disk, S3; mirror, change feed; crashed, clean).

Each workload is drained into a staging directory of its own that no test writes: a test copies it to its own
staging root (a local directory, or a prefix on S3) first, since an apply records its targets there. A staged batch
is the drain's output whatever reads it, so a copy applies as a fresh drain would; what the drain writes to S3 is
checked by the staging tests and ``test_cli_delta``. The native subscriber's rows are read once the subscriber has
caught up with both batches.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from scripts.harness.pgserver import PgServer, drop_database, execute, make_database
from scripts.harness.subscriber import (
    drain_all,
    drop_slot_when_idle,
    run_script,
    subscribe,
    unsubscribe,
    wait_for_subscriber,
)
from tests.support.s3server import S3Server

SLOT = "ours"


@dataclass(frozen=True)
class StagedWorkload:
    """A workload's two staged batches (slot ``ours``, dropped once they were drained) and, when it had one, what
    its native subscriber holds."""

    staging: Path
    native: Mapping[str, list[tuple]]
    source_dsn: str  # the source after both batches (kept until the end of the run)

    def copy_to(self, uri: str, s3: S3Server | None = None) -> str:
        """The staged batches under ``uri`` (a local directory, or ``s3://<bucket>/<prefix>`` on ``s3``); ``uri``."""
        if s3 is None:
            shutil.copytree(self.staging, uri)
            return uri
        import boto3

        from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY

        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        client = boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name=REGION)
        for path in sorted(self.staging.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(self.staging).as_posix()}")
        return uri


@contextmanager
def staged_workload(server: PgServer, root: Path, setup_sql: str, batches: tuple[list[str], list[str]], *,
                    native_sql: str | None = None, tables: tuple[str, ...] = ()) -> Iterator[StagedWorkload]:
    """``batches`` run on a new source made by ``setup_sql`` (publication ``pub_all``), each drained into one
    batch under ``root``. With ``native_sql``, a native subscriber made by it (subscribed to ``pub_native``) follows
    the source, and ``tables``' rows are read from it once it has caught up."""
    source = make_database(server)
    source_dsn = server.dsn(source)
    native = make_database(server) if native_sql is not None else None
    # slot names are the server's, and this workload lives for the test process: a name of its own, slot dropped
    subscription = f"n_{source}".lower()
    try:
        execute(source_dsn, setup_sql)
        if native is not None:
            execute(server.dsn(native), native_sql or "")
            subscribe(source_dsn, server.dsn(native), name=subscription)
        from airflow_provider_pglogical.hooks import PgLogicalHook

        PgLogicalHook.from_dsn(source_dsn).create_slot(SLOT)
        staging = root / "staging"
        try:
            for batch in batches:
                run_script(source_dsn, batch)
                assert drain_all(source_dsn, str(staging)) == 1
        finally:  # slot names are the server's: the tests of the run that stage their own use this one too
            PgLogicalHook.from_dsn(source_dsn).drop_slot(SLOT)
        rows: dict[str, list[tuple]] = {}
        if native is not None:
            from tests.integration.test_native_equivalence import table_rows

            wait_for_subscriber(source_dsn, server.dsn(native), name=subscription)
            rows = {table: table_rows(server.dsn(native), table) for table in tables}
            _unsubscribe(server, source_dsn, native, subscription)
            native = None
        yield StagedWorkload(staging, rows, source_dsn)
    finally:
        if native is not None:
            _unsubscribe(server, source_dsn, native, subscription)
        drop_database(server, source)


def _unsubscribe(server: PgServer, source_dsn: str, native: str, subscription: str) -> None:
    """Drop the native subscriber and its slot on the source (``unsubscribe`` leaves the slot: ``slot_name = NONE``)."""
    unsubscribe(server.dsn(native), name=subscription)
    drop_slot_when_idle(source_dsn, subscription)
    drop_database(server, native)


@contextmanager
def native_workload(server: PgServer, root: Path) -> Iterator[StagedWorkload]:
    """``test_native_equivalence``'s two batches, the deviation in the second, with its native subscriber."""
    from tests.integration.test_native_equivalence import (
        BATCH_ONE,
        BATCH_TWO,
        DEVIATION_SQL,
        PRE_EXISTING_SQL,
        PUBLICATIONS_SQL,
        TABLES,
        TABLES_SQL,
    )

    with staged_workload(server, root, TABLES_SQL + PUBLICATIONS_SQL + PRE_EXISTING_SQL,
                         (BATCH_ONE, [*BATCH_TWO, DEVIATION_SQL]), native_sql=TABLES_SQL, tables=TABLES) as staged:
        yield staged


@contextmanager
def extremes_workload(server: PgServer, root: Path) -> Iterator[StagedWorkload]:
    """Every built-in type at its extremes (``test_delta_equivalence``): the source stays for the oracle's query."""
    from tests.integration.test_delta_equivalence import EXTREMES_ONE, EXTREMES_SQL, EXTREMES_TWO

    with staged_workload(server, root, EXTREMES_SQL, (EXTREMES_ONE, EXTREMES_TWO)) as staged:
        yield staged


@contextmanager
def scripted_workload(server: PgServer, root: Path) -> Iterator[StagedWorkload]:
    """``test_native_equivalence``'s two batches as they are (no deviation, no subscriber): the crash tests'."""
    from tests.integration.test_native_equivalence import (
        BATCH_ONE,
        BATCH_TWO,
        PRE_EXISTING_SQL,
        PUBLICATIONS_SQL,
        TABLES_SQL,
    )

    with staged_workload(server, root, TABLES_SQL + PUBLICATIONS_SQL + PRE_EXISTING_SQL, (BATCH_ONE, BATCH_TWO)) \
            as staged:
        yield staged


def replay_feed(feed: pa.Table) -> list[tuple[Any, ...]]:
    """A change feed (Delta's or Iceberg's, as its reader returns it) replayed in (_commit_lsn, _tx_order) order, as
    the native apply worker would: the rows it leaves, sorted."""
    feed = feed.sort_by([("_commit_lsn", "ascending"), ("_tx_order", "ascending")])
    columns = [c for c in feed.column_names if not c.startswith("_")]
    state: dict[object, dict[str, Any]] = {}
    for ch in feed.to_pylist():
        new = {c: ch[c] for c in columns}
        match = ch["_old"]["id"] if ch["_old"] is not None else new["id"]
        if ch["_op"] == "truncate":
            state.clear()
        elif ch["_op"] == "delete":
            state.pop(match, None)
        elif ch["_op"] == "update":
            if match in state:
                old = state.pop(match)
                state[new["id"]] = {c: old[c] if c in ch["_unchanged_toast"] else new[c] for c in columns}
        elif ch["_unchanged_toast"]:  # insert that keeps a value: only from a row already at the key
            if new["id"] in state:
                old = state[new["id"]]
                state[new["id"]] = {c: old[c] if c in ch["_unchanged_toast"] else new[c] for c in columns}
        else:
            state[new["id"]] = new
    return sorted(tuple(r[c] for c in columns) for r in state.values())
