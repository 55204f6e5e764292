"""The migrated template database every suite and benchmark Airflow home starts from (scripts/harness/airflowenv.py):
Airflow's defaults whoever migrates first, published whole out of SQLite's write-ahead log, in a folder of the user's
that no one else can plant a template in."""

import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from scripts.harness.airflowenv import private_dir, publish, template_key

REPO = Path(__file__).resolve().parents[2]


def test_the_template_holds_airflows_defaults_whatever_the_first_caller_sets(tmp_path):
    """The first caller's ``AIRFLOW__*`` settings (here the default pool's slots) stay out of the template every
    later caller copies; a killed migration's scratch folder of this template is removed, another template's kept."""
    cache = tmp_path / f"pglogical-airflow-db-{os.getuid()}"
    cache.mkdir(mode=0o700)
    (cache / f"migrate-{template_key()}-killed").mkdir()
    (cache / "migrate-0123456789abcdef-running").mkdir()  # another venv's migration, under its own lock
    home = tmp_path / "home"
    script = ("import sys; from pathlib import Path; from scripts.harness.airflowenv import airflow_vars, migrate; "
              "migrate(airflow_vars(Path(sys.argv[1]), extra={'AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT': '7'}), "
              "user_home=Path(sys.argv[2]))")
    result = subprocess.run([sys.executable, "-c", script, str(home), str(tmp_path / "user")], cwd=REPO,
                            env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    for database in (home / "airflow.db", cache / f"{template_key()}.db"):
        with closing(sqlite3.connect(database)) as db:
            assert db.execute("SELECT slots FROM slot_pool WHERE pool = 'default_pool'").fetchall() == [(128,)]
    assert sorted(p.name for p in cache.glob("migrate-*")) == ["migrate-0123456789abcdef-running"]


def wal_database(path: Path, rows: int) -> sqlite3.Connection:
    """A WAL-mode database whose ``rows`` inserts are all still in its log (automatic checkpoints off), left open."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE t (v text)")
    db.executemany("INSERT INTO t VALUES (?)", [(json.dumps(i),) for i in range(rows)])
    return db


def test_a_published_database_holds_what_was_still_in_its_write_ahead_log(tmp_path):
    source, target = tmp_path / "scratch.db", tmp_path / "template.db"
    writer = wal_database(source, 100)
    try:
        assert (tmp_path / "scratch.db-wal").stat().st_size > 0
        publish(source, target)
    finally:
        writer.close()
    with closing(sqlite3.connect(target)) as db:
        assert db.execute("SELECT count(*) FROM t").fetchone() == (100,)


def test_a_database_whose_log_a_reader_holds_is_not_published(tmp_path):
    source, target = tmp_path / "scratch.db", tmp_path / "template.db"
    writer = wal_database(source, 10)
    reader = sqlite3.connect(source, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM t").fetchone()  # a read transaction pins the log
        with pytest.raises(RuntimeError, match="write-ahead log still holds .* not published"):
            publish(source, target)
        assert not target.exists() and source.exists()
    finally:
        reader.close()
        writer.close()


def test_the_templates_folder_is_refused_when_others_can_write_to_it_until_it_is_removed(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(RuntimeError, match=r"not a folder of user \d+ closed to others.*remove it"):
        private_dir(folder)
    folder.rmdir()  # the way out the error names
    assert private_dir(folder) == folder and (folder.stat().st_mode & 0o777) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user takes root")
def test_the_templates_folder_is_refused_when_another_user_owns_it(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(RuntimeError, match="owner 65534"):
        private_dir(folder)
