"""``environ.scoped``: the variables hold inside the block only, also when it raises."""

from __future__ import annotations

import os

import pytest

from airflow_provider_pglogical.environ import scoped


def test_variables_hold_for_the_block_and_the_previous_environment_comes_back(monkeypatch):
    monkeypatch.setenv("PGL_SCOPED_SET", "before")
    monkeypatch.delenv("PGL_SCOPED_NEW", raising=False)
    with pytest.raises(RuntimeError), scoped({"PGL_SCOPED_SET": "inside", "PGL_SCOPED_NEW": "added"}):
        assert (os.environ["PGL_SCOPED_SET"], os.environ["PGL_SCOPED_NEW"]) == ("inside", "added")
        raise RuntimeError("the block fails")
    assert os.environ["PGL_SCOPED_SET"] == "before"
    assert "PGL_SCOPED_NEW" not in os.environ
