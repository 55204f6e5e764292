"""Schema changes inside one batch beside a native subscriber whose tables keep every column the source ever had."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from contextlib import contextmanager

from scripts.harness.pgserver import execute, make_database, query
from scripts.harness.subscriber import subscribe, unsubscribe
from tests.support.parity import source_with_slot

# One table; rows 1 and 2 are applied first, then one batch: a value written before a DROP COLUMN, a column
# added and dropped with a value in between, an UPDATE and an INSERT after each drop.
REPRO_SETUP = "CREATE TABLE t (id int PRIMARY KEY, a int, c int);"
REPRO_NATIVE = "CREATE TABLE t (id int PRIMARY KEY, a int, c int, x text);"
REPRO_FIRST = ["INSERT INTO t VALUES (1, 1, 1), (2, 2, 2);"]
REPRO_BATCH = [
    "UPDATE t SET c = 50 WHERE id = 1;", "ALTER TABLE t DROP COLUMN c;", "UPDATE t SET a = 90 WHERE id = 1;",
    "ALTER TABLE t ADD COLUMN x text;", "INSERT INTO t VALUES (3, 3, 'hello');", "ALTER TABLE t DROP COLUMN x;",
    "INSERT INTO t VALUES (4, 4);",
]
REPRO_EXPECTED = [(1, 90, 50, None), (2, 2, 2, None), (3, 3, None, "hello"), (4, 4, None, None)]


@contextmanager
def source_and_native(pg_server, setup_sql: str, native_sql: str, tables: str) -> Iterator[tuple[str, str, str]]:
    """(source DSN, our slot, native subscriber DSN): ``setup_sql`` on the source, ``native_sql`` (the same
    tables with every column they will ever have) on a subscriber database subscribed to ``tables``."""
    with source_with_slot(pg_server, setup_sql + f"CREATE PUBLICATION pub_all FOR TABLE {tables};"
                                                  f"CREATE PUBLICATION pub_native FOR TABLE {tables};") as (src, slot):
        native = make_database(pg_server)
        native_dsn = pg_server.dsn(native)
        execute(native_dsn, native_sql)
        name = f"n_{slot}"
        subscribe(src, native_dsn, name=name)
        try:
            yield src, slot, native_dsn
        finally:
            unsubscribe(native_dsn, name=name)
            execute(src, "SELECT pg_drop_replication_slot(%s)", params=(name,))
            execute(pg_server.dsn(), f'DROP DATABASE IF EXISTS "{native}" WITH (FORCE)')


def native_rows(dsn: str, table: str, cols: str) -> list[tuple]:
    return query(dsn, f"SELECT {cols} FROM {table} ORDER BY 1")  # module constants and generated names only


def random_interleaving(seed: int, rows: int = 6, steps: int = 18) -> tuple[str, str, list[str], list[str]]:
    """A seeded script of ADD COLUMN / DROP COLUMN / lossless widening interleaved with INSERT / UPDATE (also of
    the key) / DELETE on table ``r``: (source setup, native table with every column, first batch, second batch).
    Every change of the second batch is in one batch, so columns come and go inside it."""
    rnd = random.Random(seed)
    live: dict[str, str] = {"c0": "integer", "c1": "integer"}
    ever: dict[str, str] = dict(live)
    widen = {"integer": "bigint", "bigint": "numeric", "numeric": "numeric"}
    counter, ids = 2, list(range(1, rows + 1))
    first = [f"INSERT INTO r VALUES ({i}, {i}, {i * 10});" for i in ids]
    script: list[str] = []
    next_id = rows + 1
    for _ in range(steps):
        move = rnd.choice(["add", "drop", "widen", "insert", "update", "update", "rekey", "delete"])
        if move == "add" or (move == "drop" and len(live) <= 1):
            name = f"c{counter}"
            counter += 1
            live[name] = ever[name] = "integer"
            script.append(f"ALTER TABLE r ADD COLUMN {name} integer;")
        elif move == "drop":
            # Mostly one of the newest columns: added, written and dropped inside the batch.
            name = rnd.choice(list(live)[-2:] if rnd.random() < 0.7 else sorted(live))
            del live[name]
            script.append(f"ALTER TABLE r DROP COLUMN {name};")
        elif move == "widen":
            name = rnd.choice(sorted(live))
            live[name] = ever[name] = widen[live[name]]
            script.append(f"ALTER TABLE r ALTER COLUMN {name} TYPE {live[name]};")
        elif move == "insert":
            values = ", ".join(str(rnd.randint(0, 999)) for _ in live)
            script.append(f"INSERT INTO r (id, {', '.join(live)}) VALUES ({next_id}, {values});")
            ids.append(next_id)
            next_id += 1
        elif move == "update" and ids:
            name = rnd.choice(sorted(live))
            script.append(f"UPDATE r SET {name} = {rnd.randint(0, 999)} WHERE id = {rnd.choice(ids)};")
        elif move == "rekey" and ids:  # a key change carries the columns its version lacks along
            moved = rnd.choice(ids)
            ids[ids.index(moved)] = next_id
            script.append(f"UPDATE r SET id = {next_id} WHERE id = {moved};")
            next_id += 1
        elif ids:
            victim = rnd.choice(ids)
            ids.remove(victim)
            script.append(f"DELETE FROM r WHERE id = {victim};")
        # Each step is a transaction of its own, with a row change after every ALTER so each version has rows.
        if script and script[-1].startswith("ALTER") and ids:
            name = rnd.choice(sorted(live))
            script[-1] += f" UPDATE r SET {name} = {rnd.randint(0, 999)} WHERE id = {rnd.choice(ids)};"
    setup = "CREATE TABLE r (id int PRIMARY KEY, c0 integer, c1 integer);"
    native = "CREATE TABLE r (id int PRIMARY KEY, " + ", ".join(f"{c} {t}" for c, t in ever.items()) + ");"
    return setup, native, first, script


def added_and_dropped(script: list[str]) -> list[str]:
    """Columns a script adds and then drops (so its values exist only inside the batch)."""
    added: set[str] = set()
    out = []
    for statement in script:
        added.update(re.findall(r"ADD COLUMN (\w+)", statement))
        out += [c for c in re.findall(r"DROP COLUMN (\w+)", statement) if c in added]
    return out
