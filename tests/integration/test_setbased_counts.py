"""The merge transaction with counted staging tables equals the one that runs every statement.

``setbased`` skips statements by the staged rows per op and keep-list rows (``TablePlan.staged_ops`` /
``keep_rows``), derives the missing-update count from rowcounts, and walks the key index for key joins
(``key_indexed``). Random batches (every op, keep lists with and without a moved-from key, updates of
missing rows, inserts of existing keys, both TOAST policies) run twice on equal targets — counted and
uncounted — and must leave equal rows, rejects and counters, or raise the same error.
"""

from __future__ import annotations

import random

import psycopg2
import pytest

from airflow_provider_pglogical.apply.targets.postgres import setbased
from airflow_provider_pglogical.apply.targets.postgres.plan import BatchPlan, TablePlan
from airflow_provider_pglogical.apply.targets.postgres.progress import ensure_bookkeeping
from scripts.harness.pgserver import execute, make_target
from scripts.harness.pgserver import query as rows

STAGING = "public.stg"
COLUMNS = ("id", "v", "w")


def _scenario(rng: random.Random) -> tuple[list[tuple], list[tuple]]:
    """(target rows, staged rows) — one staged row per key, as the net frame stages them."""
    existing = [(k, f"v{k}", f"w{k}") for k in range(20) if rng.random() < 0.6]
    plain = rng.random() < 0.5  # no R row and no keep list: the count-derived path
    staged = []
    for k in rng.sample(range(30), rng.randint(0, 14)):
        op = rng.choice("IUD" if plain else "IUDR")
        keep: list[str] = [] if plain or op not in "IR" or rng.random() < 0.6 else ["v"]
        moved_from = rng.randrange(30) if keep and rng.random() < 0.7 else None
        staged.append((op, keep, 0x110 + k, moved_from, rng.random() < 0.2, k,
                       None if op == "D" else f"n{k}", None if op == "D" else f"m{k}"))
    return existing, staged


def _apply(dsn: str, existing: list[tuple], staged: list[tuple], *, counted: bool, toast: str
           ) -> tuple[str, object, object, object]:
    execute(dsn, "DROP TABLE IF EXISTS t, stg, pglogical_progress, pglogical_rejects",
            "CREATE TABLE t (id int PRIMARY KEY, v text, w text)",
            "CREATE UNLOGGED TABLE stg (_pgl_kind text, _pgl_keep text[], _pgl_lsn bigint, _pgl_from_0 int, "
            "_pgl_touched boolean, id int, v text, w text)")
    conn = psycopg2.connect(dsn)
    try:
        ensure_bookkeeping(conn, "public.pglogical_progress", "public.pglogical_rejects")
        with conn.cursor() as cur:
            if existing:
                cur.executemany("INSERT INTO t VALUES (%s, %s, %s)", existing)
            if staged:
                cur.executemany("INSERT INTO stg VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", staged)
        conn.commit()
        table = TablePlan("public.t", "public.t", ("id",), COLUMNS, STAGING, "upsert", toast)
        if counted:
            table.staged_ops = {}
            for op, *_ in staged:
                table.staged_ops[op] = table.staged_ops.get(op, 0) + 1
            table.keep_rows = sum(1 for s in staged if s[1])
            table.key_indexed = True
        plan = BatchPlan("s1", 0x100, 0x200, [table], watermark_tables=["public.t"])
        try:
            result = setbased.apply_batch(conn, plan, progress="public.pglogical_progress",
                                          rejects="public.pglogical_rejects")
            outcome: object = result.rows
        except Exception as exc:  # noqa: BLE001 - the error's type is the outcome compared
            outcome = type(exc).__name__
    finally:
        conn.close()
    return ("ok", outcome, rows(dsn, "SELECT * FROM t ORDER BY id"),
            rows(dsn, "SELECT table_name, lsn::text, key::text FROM pglogical_rejects ORDER BY lsn"))


@pytest.mark.parametrize("seed", range(3))
def test_counted_merge_equals_the_merge_that_runs_every_statement(pg_server, seed):
    _, dsn = make_target(pg_server)
    rng = random.Random(seed)
    outcomes: set[str] = set()
    for _ in range(25):
        existing, staged = _scenario(rng)
        toast = rng.choice(("fail", "reject_and_continue"))
        everything = _apply(dsn, existing, staged, counted=False, toast=toast)
        counted = _apply(dsn, existing, staged, counted=True, toast=toast)
        assert counted == everything, (existing, staged, toast)
        outcomes.add(everything[1] if isinstance(everything[1], str) else "applied")
    assert "applied" in outcomes  # the scenarios reach the apply, not only errors
