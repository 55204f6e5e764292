"""The snapshot workers' compiled COPY reader (``copier._copy_compiled``: many CopyData messages per call, no
Python call per row) against ``copy_expert`` (one ``write`` per row, ``PGLOGICAL_PURE_PYTHON=1`` in the workers):
the same staged rows, cut into the same row groups — by the row limit and by the byte limit (1 MB values)."""

from __future__ import annotations

import glob
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.decoding import speedups
from airflow_provider_pglogical.hooks import PgLogicalHook
from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, initial_snapshot
from scripts.harness.pgserver import execute

pytestmark = pytest.mark.skipif(speedups.compiled is None, reason="compiled helpers not built")

SCHEMA_SQL = """
CREATE TABLE many (id int PRIMARY KEY, n numeric(12,2), t text, at timestamptz, tags text[], j jsonb, u uuid);
INSERT INTO many SELECT g, CASE WHEN g % 11 = 0 THEN 'NaN' ELSE g / 7.0 END, CASE WHEN g % 5 = 0 THEN NULL
  ELSE 'row ' || g END, '2024-01-01'::timestamptz + g * interval '1 s', ARRAY['a' || g % 3, NULL],
  jsonb_build_object('g', g), CASE WHEN g % 7 = 0 THEN NULL ELSE md5(g::text)::uuid END
  FROM generate_series(1, 70000) g;
CREATE TABLE big (id int PRIMARY KEY, body text);
INSERT INTO big SELECT g, repeat(md5(g::text), 32768) FROM generate_series(1, 40) g;
CREATE TABLE empty (id int PRIMARY KEY);
CREATE PUBLICATION pub FOR TABLE many, big, empty;
"""
TABLES = ("public.many", "public.big", "public.empty")


def staged(uri: str) -> dict[str, tuple[list[int], list]]:
    """Per table: its row groups' row counts and its rows (new images), over its files in name order."""
    out = {}
    for table in TABLES:
        files = sorted(glob.glob(f"{uri}/**/{table}/**/*.parquet", recursive=True))
        assert files, table
        groups, rows = [], []
        for path in files:
            meta = pq.ParquetFile(path).metadata
            groups += [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            rows += pq.read_table(path, columns=["new", "new_value_notes"]).to_pylist()
        out[table] = (groups, rows)
    return out


def test_the_compiled_reader_stages_what_copy_expert_stages(pg_dsn, tmp_path, monkeypatch):
    execute(pg_dsn, SCHEMA_SQL)
    results = {}
    try:
        for pure in (False, True):
            monkeypatch.setenv(speedups.PURE_PYTHON_ENV, "1" if pure else "0")
            uri = str(tmp_path / ("pure" if pure else "compiled"))
            initial_snapshot(SnapshotJob(dsn=pg_dsn, slot=f"reader_{int(pure)}", publication="pub", staging_uri=uri,
                                         tables={t: (None, None) for t in TABLES},
                                         settings=SnapshotSettings(initial=True, parallelism=2)))
            results[pure] = staged(uri)
    finally:
        hook = PgLogicalHook.from_dsn(pg_dsn)
        for slot in ("reader_0", "reader_1"):
            if hook.slot_info(slot) is not None:
                hook.drop_slot(slot)
        hook.close()
    assert results[False] == results[True]
    many, big, empty = (results[False][t] for t in TABLES)
    assert sum(many[0]) == 70000 and len(many[0]) >= 2  # cut by rows (65536 per group)
    assert sum(big[0]) == 40 and max(big[0]) < 40  # cut by bytes (32 MiB per group)
    assert empty[1] == []


def test_a_reader_stages_without_importing_pandas(pg_dsn, tmp_path):
    """Reader processes build every staged column from buffers (uuid included): ``pa.array`` on Python values imports
    pandas on its first call (1–4.5 s per reader process under load), a cost paid before its first row group is
    written. Two chunks, two reader processes: each records, after every chunk it copied, whether pandas is loaded."""
    execute(pg_dsn, SCHEMA_SQL)
    seen = tmp_path / "readers"
    seen.mkdir()
    reader = ("import os, sys\n"
              "import airflow_provider_pglogical.snapshot.copier as copier\n"
              "copy_chunk = copier.copy_chunk\n"
              "def recording(task):\n"
              "    result = copy_chunk(task)\n"
              "    with open(os.path.join(sys.argv[1], f'{os.getpid()}-{task.table}'), 'w') as f:\n"
              "        f.write(str('pandas' in sys.modules))\n"
              "    return result\n"
              "copier.copy_chunk = recording\n"
              "from airflow_provider_pglogical.snapshot import worker\n"
              "sys.exit(worker.main())\n")
    code = ("import json, sys\n"
            "from airflow_provider_pglogical.snapshot.run import SnapshotJob, SnapshotSettings, WorkerPool, "
            "initial_snapshot\n"
            "dsn, uri, seen, reader = sys.argv[1:5]\n"
            "WorkerPool.COMMAND = (sys.executable, '-c', reader, seen)\n"
            "result = initial_snapshot(SnapshotJob(dsn=dsn, slot='no_pandas', publication='pub', staging_uri=uri,\n"
            "    tables={'public.many': (None, None), 'public.empty': (None, None)},\n"
            "    settings=SnapshotSettings(initial=True, parallelism=2)))\n"
            "import os\n"
            "print(json.dumps([result.tables['public.many']['rows'], 'pandas' in sys.modules, os.getpid()]))")
    try:
        out = subprocess.run([sys.executable, "-c", code, pg_dsn, str(tmp_path / "staging"), str(seen), reader],
                             capture_output=True, text=True, check=True)
    finally:
        hook = PgLogicalHook.from_dsn(pg_dsn)
        if hook.slot_info("no_pandas") is not None:
            hook.drop_slot("no_pandas")
        hook.close()
    rows, caller_pandas, caller = json.loads(out.stdout.strip().splitlines()[-1])
    assert (rows, caller_pandas) == (70000, False)
    records = {p.name.split("-", 1)[1]: p.read_text() for p in seen.iterdir()}
    assert records == {"public.many": "False", "public.empty": "False"}
    assert str(caller) not in {p.name.split("-", 1)[0] for p in seen.iterdir()}  # read by reader processes
    staged_uuids = pq.read_table(glob.glob(f"{tmp_path}/staging/**/public.many/**/*.parquet", recursive=True)[0],
                                 columns=["new"]).column("new").combine_chunks().field("u")
    assert staged_uuids[0].as_py() == "c4ca4238-a0b9-2382-0dcc-509a6f75849b"  # md5('1')
