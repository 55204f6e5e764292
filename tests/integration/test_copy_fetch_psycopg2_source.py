"""The binary COPY fetch with psycopg2 built from source against the system libpq (no psycopg2-binary).

A scratch venv gets ``pip install --no-binary psycopg2 psycopg2`` (what a distribution or a hardened
image uses) in front of the suite's packages; there the drain's fetch must still take the compiled COPY
path and give the named cursor's rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import psycopg2
import pytest

from airflow_provider_pglogical.hooks import copystream
from scripts.harness.userenv import run_as_user
from tests.support.drain import workload

pytestmark = pytest.mark.skipif(not copystream.available(), reason="compiled helpers built without libpq")
ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import json, subprocess, sys
import psycopg2
from psycopg2 import _psycopg
from airflow_provider_pglogical.decoding import speedups
from airflow_provider_pglogical.hooks import copystream
from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient

client = PgLogicalClient.from_dsn(sys.argv[1])
read = lambda cursor: [[lsn, xid, bytes(d).hex()] for lsn, xid, d in client._changes(
    "pg_logical_slot_peek_binary_changes", "s1", "pub", upto_lsn=None, upto_nchanges=None, streaming=False,
    itersize=7, cursor=cursor)]
copied = client._changes("pg_logical_slot_peek_binary_changes", "s1", "pub", upto_lsn=None, upto_nchanges=None,
                         streaming=False, itersize=7)
print(json.dumps({"psycopg2": psycopg2.__file__, "linked": subprocess.run(["ldd", _psycopg.__file__],
                  capture_output=True, text=True).stdout, "compiled": copystream.available(),
                  "copy_types": sorted({type(d).__name__ for _, _, d in copied}),
                  "same": read(False) == read(True), "rows": len(read(False))}))
"""


def test_the_copy_fetch_works_with_psycopg2_built_from_source(tmp_path, drain_source, pg_dsn):
    cur, _hook = drain_source
    workload(cur, 25)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    version = psycopg2.__version__.split()[0]
    built = run_as_user([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-binary", "psycopg2",
                         f"psycopg2=={version}"], home=tmp_path / "home")
    assert built.returncode == 0, built.stderr[-2000:]
    # Then the suite's packages (and this checkout, compiled module included) behind the venv's own site-packages.
    (site / "suite.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n{ROOT}\n")
    done = run_as_user([str(venv / "bin" / "python"), "-c", CHECK, pg_dsn], home=tmp_path / "home")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["psycopg2"].startswith(str(site))  # the source build, not the suite's psycopg2-binary
    assert "psycopg2_binary.libs" not in report["linked"] and "libpq.so.5" in report["linked"]
    assert report["compiled"] and report["copy_types"] == ["bytes"]  # the COPY path ran
    assert report["same"] and report["rows"] > 25
