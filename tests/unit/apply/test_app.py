"""The Spark app's command line."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.apply.app import main, parse_args
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.dsn import read_dsn
from airflow_provider_pglogical.exceptions import ApplyError

SECRET = "password=s3cret-pw"
BASE = ["--slot", "s", "--staging-root", "/x"]


def test_arguments_become_an_apply_config():
    cfg = parse_args(["--slot", "s", "--staging-root", "/x", "--max-batches", "3", "--tables-json",
                      '{"public.t": {"row_filter": "id > 1", "columns": ["id"], "conflict": "strict"}}'])
    assert cfg.slot == "s" and cfg.max_batches == 3 and cfg.dsn_env == "PGLOGICAL_TARGET_DSN"
    assert cfg.tables == {"public.t": TableApplyConfig(row_filter="id > 1", columns=("id",), conflict="strict")}


def test_the_dsn_comes_from_the_environment_or_a_private_file(monkeypatch, tmp_path):
    monkeypatch.setenv("MY_DSN", "dbname=x")
    assert read_dsn(parse_args([*BASE, "--dsn-env", "MY_DSN"])) == "dbname=x"
    f = tmp_path / "dsn"
    f.write_text("dbname=y\n")
    f.chmod(0o644)
    cfg = parse_args([*BASE, "--dsn-file", str(f)])
    with pytest.raises(ApplyError, match="chmod 600"):
        read_dsn(cfg)
    f.chmod(0o600)
    assert read_dsn(cfg) == "dbname=y"
    monkeypatch.delenv("PGLOGICAL_TARGET_DSN", raising=False)
    with pytest.raises(ApplyError, match="not set"):
        read_dsn(parse_args(BASE))


def test_a_relative_dsn_file_is_read_from_the_working_directory(monkeypatch, tmp_path):
    """YARN puts ``--files /secure/target.dsn#target.dsn`` in the driver's working directory (cluster mode)."""
    (tmp_path / "target.dsn").write_text(f"host=db {SECRET}\n")
    (tmp_path / "target.dsn").chmod(0o400)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PGLOGICAL_TARGET_DSN", "dbname=not-this-one")
    assert read_dsn(parse_args([*BASE, "--dsn-file", "target.dsn"])) == f"host=db {SECRET}"


def test_a_dsn_file_behind_a_symlink_is_judged_by_the_file_it_points_to(tmp_path):
    """Kubernetes mounts a secret's keys as symlinks into a ``..data`` directory."""
    data = tmp_path / "..data"
    data.mkdir()
    (data / "dsn").write_text(SECRET)
    (data / "dsn").chmod(0o600)
    (tmp_path / "dsn").symlink_to(data / "dsn")
    assert read_dsn(parse_args([*BASE, "--dsn-file", str(tmp_path / "dsn")])) == SECRET
    (data / "dsn").chmod(0o644)
    with pytest.raises(ApplyError, match="chmod 600"):
        read_dsn(parse_args([*BASE, "--dsn-file", str(tmp_path / "dsn")]))


def one_line_error(cfg_args: list[str]) -> str:
    with pytest.raises(ApplyError) as info:
        read_dsn(parse_args(cfg_args))
    message = str(info.value)
    assert "\n" not in message and "s3cret" not in message
    return message


def test_a_missing_empty_or_unreadable_dsn_file_is_a_one_line_error_naming_the_file(tmp_path):
    assert one_line_error([*BASE, "--dsn-file", str(tmp_path / "nothere.dsn")]).startswith(
        f"DSN file {tmp_path / 'nothere.dsn'} does not exist")
    empty = tmp_path / "empty.dsn"
    empty.write_text(" \n")
    empty.chmod(0o600)
    assert one_line_error([*BASE, "--dsn-file", str(empty)]) == f"DSN file {empty} is empty"
    assert one_line_error([*BASE, "--dsn-file", str(tmp_path)]) == f"DSN file {tmp_path} is not a regular file"
    shared = tmp_path / "shared.dsn"
    shared.write_text(SECRET)
    shared.chmod(0o640)
    assert one_line_error([*BASE, "--dsn-file", str(shared)]) == (
        f"DSN file {shared} must not be readable by group or others (chmod 600)")
    binary = tmp_path / "binary.dsn"
    binary.write_bytes(b"\xff\xfe" + SECRET.encode())
    binary.chmod(0o600)
    assert one_line_error([*BASE, "--dsn-file", str(binary)]) == f"DSN file {binary} cannot be read: UnicodeDecodeError"


def test_a_missing_or_empty_dsn_variable_is_a_one_line_error_naming_the_variable(monkeypatch):
    monkeypatch.delenv("TARGET_DSN_FROM_SECRET", raising=False)
    assert one_line_error([*BASE, "--dsn-env", "TARGET_DSN_FROM_SECRET"]) == (
        "environment variable TARGET_DSN_FROM_SECRET with the target DSN is not set")
    monkeypatch.setenv("TARGET_DSN_FROM_SECRET", "")
    assert one_line_error([*BASE, "--dsn-env", "TARGET_DSN_FROM_SECRET"]) == (
        "environment variable TARGET_DSN_FROM_SECRET with the target DSN is empty")


def test_the_app_exits_with_one_line_before_spark_starts_when_the_dsn_is_missing(monkeypatch, tmp_path, capsys):
    """On the cluster (``--deploy-mode cluster``) this line is what the driver's log shows: no JVM was started."""
    import pyspark.sql

    monkeypatch.setattr(pyspark.sql.SparkSession, "builder", None)  # starting Spark would fail the test
    assert main([*BASE, "--dsn-file", str(tmp_path / "target.dsn")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ApplyError: DSN file {tmp_path / 'target.dsn'} does not exist")
