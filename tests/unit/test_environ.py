"""``environ.scoped``: the variables hold inside the block only, also when it raises; ``environ.whole_number``:
a tuning variable read as a count, anything else a typed one-line error."""

from __future__ import annotations

import os

import pytest

from airflow_provider_pglogical.environ import scoped, whole_number
from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.hooks import replication


def test_variables_hold_for_the_block_and_the_previous_environment_comes_back(monkeypatch):
    monkeypatch.setenv("PGL_SCOPED_SET", "before")
    monkeypatch.delenv("PGL_SCOPED_NEW", raising=False)
    with pytest.raises(RuntimeError), scoped({"PGL_SCOPED_SET": "inside", "PGL_SCOPED_NEW": "added"}):
        assert (os.environ["PGL_SCOPED_SET"], os.environ["PGL_SCOPED_NEW"]) == ("inside", "added")
        raise RuntimeError("the block fails")
    assert os.environ["PGL_SCOPED_SET"] == "before"
    assert "PGL_SCOPED_NEW" not in os.environ


@pytest.mark.parametrize(("text", "expected"), [(None, 64 << 20), ("  ", 64 << 20), ("0", 0), (" 4096 ", 4096)])
def test_the_read_ahead_variable_is_a_whole_number_of_bytes_unset_its_default(monkeypatch, text, expected):
    if text is None:
        monkeypatch.delenv(replication.READ_AHEAD_ENV, raising=False)
    else:
        monkeypatch.setenv(replication.READ_AHEAD_ENV, text)
    assert replication.read_ahead_bytes() == expected == whole_number(
        replication.READ_AHEAD_ENV, 64 << 20, "bytes", "", StagingError)


@pytest.mark.parametrize("text", ["64MiB", "1.5", "-1"])
def test_a_malformed_or_negative_read_ahead_is_one_typed_line_naming_0_and_the_default(monkeypatch, text):
    monkeypatch.setenv(replication.READ_AHEAD_ENV, text)
    with pytest.raises(StagingError) as err:
        replication.read_ahead_bytes()
    message = str(err.value)
    assert "\n" not in message and replication.READ_AHEAD_ENV in message
    assert "0 reads on the decoder's thread" in message and f"unset means {64 << 20}" in message
