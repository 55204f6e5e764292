"""Shared pieces of the snapshot tests: a schema, a concurrent writer, and a pure replay of
snapshot + staged changes (the expected target, computed without the apply)."""

from __future__ import annotations

import random

import pyarrow.dataset as ds

from airflow_provider_pglogical.snapshot.layout import SnapshotLayout
from airflow_provider_pglogical.staging import StagingReader

SNAP_SCHEMA_SQL = """
CREATE TABLE parents (id int PRIMARY KEY, name text NOT NULL, region text, amount numeric(12,2));
CREATE TABLE children (id int PRIMARY KEY, parent_id int REFERENCES parents(id) ON DELETE CASCADE,
                       body text, big text, secret text);
CREATE TABLE wide (id bigint PRIMARY KEY, payload text, flags int[], at timestamptz);
INSERT INTO parents SELECT g, 'p' || g, CASE WHEN g % 3 = 0 THEN 'EU' ELSE 'US' END, g * 1.5
  FROM generate_series(1, 3000) g;
INSERT INTO children SELECT g, 1 + g % 3000, 'c' || g,
  CASE WHEN g % 500 = 0 THEN repeat(md5(g::text), 400) END, 's' || g FROM generate_series(1, 6000) g;
INSERT INTO wide SELECT g, repeat('w', 60 + g % 40), ARRAY[g, g % 7], '2024-01-01'::timestamptz + g * interval '1 min'
  FROM generate_series(1, 30000) g;
CREATE PUBLICATION pub FOR TABLE parents, children, wide;
"""


def write_burst(cur, rnd: random.Random, n: int, *, truncate_wide: bool = False) -> None:
    """``n`` small transactions of inserts, updates (incl. TOASTed values and key changes), deletes."""
    for _ in range(n):
        cur.execute("BEGIN")
        k = rnd.randint(1, 3000)
        cur.execute("UPDATE parents SET amount = amount + 1, region = %s WHERE id = %s", (rnd.choice(["EU", "US"]), k))
        cur.execute("INSERT INTO parents VALUES ((SELECT max(id) + 1 FROM parents), 'new', 'EU', 1)")
        c = rnd.randint(1, 6000)
        cur.execute("UPDATE children SET body = body || 'x' WHERE id = %s", (c,))
        cur.execute("UPDATE children SET big = repeat(md5(%s::text), 300) WHERE id = %s", (c, c + 1))
        cur.execute("DELETE FROM children WHERE id = %s", (rnd.randint(1, 6000),))
        w = rnd.randint(1, 30000)
        cur.execute("UPDATE wide SET payload = payload || 'u', flags = flags || 1 WHERE id = %s", (w,))
        cur.execute("UPDATE wide SET id = id + 1000000 WHERE id = %s", (rnd.randint(1, 30000),))
        cur.execute("DELETE FROM wide WHERE id = %s", (rnd.randint(1, 30000),))
        cur.execute("INSERT INTO wide VALUES (%s, 'ins', '{1}', now())", (2_000_000 + rnd.randint(0, 10**6),))
        cur.execute("COMMIT")
    if truncate_wide:
        cur.execute("BEGIN; TRUNCATE wide; INSERT INTO wide VALUES (1, 'after-truncate', '{9}', now()); COMMIT")


def _key(row: dict, key: tuple[str, ...]) -> tuple:
    return tuple(row[k] for k in key)


def replayed(uri: str, slot: str, table: str, key: tuple[str, ...]) -> dict[tuple, dict]:
    """The table as snapshot (latest) + staged changes with commit_lsn >= its LSN, replayed in order."""
    layout = SnapshotLayout.from_uri(uri, slot)
    ref = layout.latest(table)
    assert ref is not None, f"no snapshot of {table}"
    manifest = layout.manifest(ref)
    rows: dict[tuple, dict] = {}
    for f in manifest.files:
        for r in ds.dataset(f"{ref.path}/{f}").to_table(columns=["op", "new"]).to_pylist():
            assert r["op"] == "I"
            k = _key(r["new"], key)
            assert k not in rows, f"{table}: key {k} twice in the snapshot"
            rows[k] = r["new"]
    reader = StagingReader.from_uri(uri, slot)
    events = []
    for b in reader.batches():
        m = reader.manifest(b)
        for f in m.tables.get(table, {}).get("files", []):
            for r in reader.read_file(b, f).to_pylist():
                events.append(((r["commit_lsn"], r["tx_order"]), "row", r))
        if m.truncates:
            for r in reader.read_file(b, "truncates.parquet").to_pylist():
                if table in r["relations"]:
                    events.append(((r["commit_lsn"], r["tx_order"]), "truncate", r))
    for (commit_lsn, _o), kind, r in sorted(events, key=lambda e: e[0]):
        if commit_lsn < manifest.lsn_int:  # PostgreSQL's per-table rule: in the snapshot already
            continue
        if kind == "truncate":
            rows.clear()
            continue
        if r["op"] in ("U", "D") and r["old"] is not None:
            old_key = _key(r["old"], key)
        else:
            old_key = _key(r["new"], key) if r["new"] else None
        if r["op"] == "D":
            rows.pop(old_key, None)
        elif r["op"] == "I":
            rows[_key(r["new"], key)] = r["new"]
        else:
            previous = rows.pop(old_key, {}) if old_key is not None else {}
            new = dict(r["new"])
            for name in r["new_unchanged_toast"]:
                new[name] = previous.get(name)
            rows[_key(new, key)] = new
    return rows


def source_rows(cur, table: str, columns: list[str], key: tuple[str, ...], where: str | None = None) -> dict:
    cur.execute(f"SELECT {', '.join(columns)} FROM {table}" + (f" WHERE {where}" if where else ""))
    names = [d.name for d in cur.description]
    return {_key(dict(zip(names, r, strict=True)), key): dict(zip(names, r, strict=True)) for r in cur.fetchall()}
