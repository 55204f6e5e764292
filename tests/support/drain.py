"""Shared workload and staged-log readers for the drain and crash-recovery tests."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds

from airflow_provider_pglogical.staging import StagingReader

SCHEMA_SQL = """
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2));
CREATE TABLE events (id bigserial PRIMARY KEY, account int, kind text, payload text);
ALTER TABLE events REPLICA IDENTITY FULL;
CREATE TABLE docs (id int PRIMARY KEY, body text, note text);
CREATE PUBLICATION pub FOR TABLE accounts, events, docs;
"""


def run_tx(cur, statements: list[tuple[str, tuple]]) -> int:
    """Run statements in one transaction on an autocommit connection; return its xid."""
    cur.execute("BEGIN")
    for stmt, params in statements:
        cur.execute(stmt, params)
    cur.execute("SELECT pg_current_xact_id()::text::bigint")
    xid = cur.fetchone()[0]
    cur.execute("COMMIT")
    return xid


def workload(cur, n: int = 30, *, start: int = 0) -> list[int]:
    """``n`` small committed transactions over three tables (I/U/D, FULL identity, messages);
    returns their xids in commit order. Rolled-back work in between must never be staged."""
    xids = []
    for i in range(start, start + n):
        stmts: list[tuple[str, tuple]] = [
            ("INSERT INTO accounts VALUES (%s, %s, %s)", (i, f"owner-{i}", i * 1.25)),
            ("INSERT INTO events (account, kind, payload) VALUES (%s, 'open', %s)", (i, f"p{i}")),
        ]
        if i % 3 == 1:
            stmts.append(("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (i - 1,)))
        if i % 5 == 4:
            stmts.append(("DELETE FROM events WHERE account = %s", (i - 2,)))
        if i % 7 == 3:
            stmts.append(("SELECT pg_logical_emit_message(true, 'audit', %s)", (f"tx {i}",)))
        xids.append(run_tx(cur, stmts))
        if i % 10 == 5:
            cur.execute("BEGIN")
            cur.execute("INSERT INTO accounts VALUES (%s, 'ghost', 0)", (100_000 + i,))
            cur.execute("ROLLBACK")
    return xids


def staged(uri: str, slot: str, name: str) -> pa.Table:
    """One kind of staged file (``transactions.parquet``…) over every visible batch, in LSN order."""
    reader = StagingReader.from_uri(uri, slot)
    tables = [reader.read_file(b, name) for b in reader.batches()
              if reader.layout.exists(f"{b.path}/{name}")]
    return pa.concat_tables(tables) if tables else pa.table({})


def staged_xids(uri: str, slot: str) -> list[int]:
    t = staged(uri, slot, "transactions.parquet")
    return t.column("xid").to_pylist() if t.num_rows else []


def staged_rows(uri: str, slot: str, table: str) -> pa.Table:
    """Every staged change of one table through plain pyarrow.dataset, ordered by LSN key."""
    reader = StagingReader.from_uri(uri, slot)
    files = [f"{b.path}/{f}" for b in reader.batches() for f in reader.manifest(b).tables.get(table, {}).get("files", [])]
    if not files:
        return pa.table({})
    t = ds.dataset(files, format="parquet", filesystem=reader.layout.fs).to_table()
    return t.sort_by([("commit_lsn", "ascending"), ("tx_order", "ascending")])


def assert_log_matches(uri: str, slot: str, xids: list[int]) -> None:
    """Every committed transaction exactly once, in commit (LSN) order, batches contiguous."""
    got = staged_xids(uri, slot)
    assert got == xids, f"staged {len(got)} transactions, source committed {len(xids)}"
    t = staged(uri, slot, "transactions.parquet")
    lsns = t.column("commit_lsn").to_pylist()
    assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns)
    StagingReader.from_uri(uri, slot).batches(check=True)
