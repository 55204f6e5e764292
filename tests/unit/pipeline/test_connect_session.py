"""The Spark Connect session kept per pipeline: its URL as pyspark's client parses it, its key, its id file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pyspark.sql.connect.client.core import DefaultChannelBuilder

from airflow_provider_pglogical.pipeline.connect_session import (
    KeptSession,
    is_closed_session,
    session_key,
    url_params,
    with_session_id,
)

SID = "4b4f5b0e-2f36-4f8e-9d62-3b1d0c8f4a11"


@pytest.mark.parametrize("remote", ["sc://h:15002", "sc://h:15002/", "sc://h:15002/;token=t%3Bx;user_id=u"])
def test_the_session_id_is_added_to_the_url_as_pyspark_reads_it(remote):
    url = with_session_id(remote, SID)
    parsed = DefaultChannelBuilder(url)
    assert parsed.session_id == SID
    assert (parsed.host, parsed.endpoint) == ("h", "h:15002")
    assert url_params(url) == {**url_params(remote), "session_id": SID}
    if "token" in remote:  # the other parameters stay as they were
        assert parsed.get("token") == "t;x" and parsed.userId == "u"


def test_the_key_tells_servers_pipelines_and_settings_apart_not_tokens():
    key = session_key("sc://h:1", "s3://b/staging#slot", {"spark.sql.x": "1"})
    assert key == session_key("sc://h:1/;token=other", "s3://b/staging#slot", {"spark.sql.x": "1"})
    assert len({key, session_key("sc://h:2", "s3://b/staging#slot", {"spark.sql.x": "1"}),
                session_key("sc://h:1", "s3://b/staging#other", {"spark.sql.x": "1"}),
                session_key("sc://h:1", "s3://b/staging#slot", {"spark.sql.x": "2"}),
                session_key("sc://h:1", "s3://b/staging#slot", {})}) == 5


def test_the_kept_id_is_read_back_renewed_and_never_needed(tmp_path: Path):
    kept = KeptSession("k", tmp_path)
    first = kept.current()
    assert KeptSession("k", tmp_path).current() == first  # the next run's
    assert KeptSession("other", tmp_path).current() != first  # another pipeline's
    renewed = kept.renew()
    assert renewed != first and kept.current() == renewed
    kept.path.write_text("not a uuid")
    assert kept.current() not in (renewed, "not a uuid")
    blocked = tmp_path / "file"
    blocked.write_text("")
    unsaved = KeptSession("k", blocked)
    assert unsaved.current() != unsaved.current() and not unsaved.saved  # a fresh id each time, released, no error
    assert kept.saved


def test_closed_session_errors_are_told_from_others():
    assert is_closed_session(RuntimeError("[INVALID_HANDLE.SESSION_CLOSED] The handle x is invalid."))
    assert not is_closed_session(RuntimeError("UNAVAILABLE: failed to connect"))


@pytest.mark.parametrize("before", ["none", "world-readable"])
def test_the_kept_id_is_its_owners_only(tmp_path: Path, before: str):
    directory = tmp_path / "pglogical" / "connect"
    kept = KeptSession("k", directory)
    if before == "world-readable":  # a directory and a leftover partial file made under another umask
        directory.mkdir(mode=0o755, parents=True)
        directory.chmod(0o755)
        leftover = kept.path.with_name(f"{kept.path.name}.{os.getpid()}.tmp")
        leftover.write_text("x\n")
        leftover.chmod(0o644)
    old = os.umask(0o022)  # the usual umask: what is not asked for explicitly is world-readable
    try:
        kept.renew()
    finally:
        os.umask(old)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(kept.path.stat().st_mode) == 0o600
