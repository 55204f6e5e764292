"""The Spark app's command line."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.apply.app import parse_args
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.runner import read_dsn
from airflow_provider_pglogical.exceptions import ApplyError


def test_arguments_become_an_apply_config():
    cfg = parse_args(["--slot", "s", "--staging-root", "/x", "--max-batches", "3", "--tables-json",
                      '{"public.t": {"row_filter": "id > 1", "columns": ["id"], "conflict": "strict"}}'])
    assert cfg.slot == "s" and cfg.max_batches == 3 and cfg.dsn_env == "PGLOGICAL_TARGET_DSN"
    assert cfg.tables == {"public.t": TableApplyConfig(row_filter="id > 1", columns=("id",), conflict="strict")}


def test_the_dsn_comes_from_the_environment_or_a_private_file(monkeypatch, tmp_path):
    monkeypatch.setenv("MY_DSN", "dbname=x")
    assert read_dsn(parse_args(["--slot", "s", "--staging-root", "/x", "--dsn-env", "MY_DSN"])) == "dbname=x"
    f = tmp_path / "dsn"
    f.write_text("dbname=y\n")
    f.chmod(0o644)
    cfg = parse_args(["--slot", "s", "--staging-root", "/x", "--dsn-file", str(f)])
    with pytest.raises(ApplyError, match="chmod 600"):
        read_dsn(cfg)
    f.chmod(0o600)
    assert read_dsn(cfg) == "dbname=y"
    monkeypatch.delenv("PGLOGICAL_TARGET_DSN", raising=False)
    with pytest.raises(ApplyError, match="not set"):
        read_dsn(parse_args(["--slot", "s", "--staging-root", "/x"]))
