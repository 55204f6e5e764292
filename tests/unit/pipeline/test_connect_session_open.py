"""``runs._connect_session``'s branches against a fake Connect client (``SparkSession.builder``): which session id
it opens, whether it resets a reopened session, when stopping releases the server's session, and its errors. The
real server's side is tests/integration/test_spark_connect.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from airflow_provider_pglogical.apply import sparkenv
from airflow_provider_pglogical.exceptions import SparkStartError
from airflow_provider_pglogical.pipeline import runs
from airflow_provider_pglogical.pipeline.connect_session import url_params

URL = "sc://h:15002"
CONF = {"spark.sql.caseSensitive": "true", "spark.sql.session.timeZone": "UTC"}
GIVEN = "0b5b3f2e-6a3c-4d8e-9f1a-2c4d6e8f0a1b"


class FakeServer:
    """Sessions by id: open, closed (the server refuses them), or refusing one setting; what each client did."""

    def __init__(self) -> None:
        self.closed: set[str] = set()
        self.released: list[str] = []
        self.reset: list[str] = []
        self.settings: dict[str, dict[str, str]] = {}
        self.refused: str | None = None
        self.answers = True
        self.batch_lost = False  # a request of several settings fails before the server reads it
        self.setting_requests = 0
        self.clients: list[FakeClient] = []

    def remote(self, url: str) -> FakeBuilder:
        return FakeBuilder(self, url)


class FakeBuilder:
    def __init__(self, server: FakeServer, url: str) -> None:
        self.server, self.url = server, url

    def getOrCreate(self) -> FakeClient:  # noqa: N802 (pyspark's name)
        client = FakeClient(self.server, url_params(self.url).get("session_id") or "own")
        self.server.clients.append(client)
        return client


class FakeConf:
    def __init__(self, client: FakeClient) -> None:
        self.client = client

    def set(self, key: str, value: str) -> None:
        server = self.client.ask()
        if key == server.refused:
            raise RuntimeError(f"[CANNOT_MODIFY_CONFIG] {key}")
        server.setting_requests += 1
        server.settings.setdefault(self.client.session_id, {})[key] = value

    def _set_all(self, settings: dict[str, str], *, silent: bool) -> None:
        """pyspark Connect's one request for several settings: set in order, up to one the server refuses."""
        assert not silent
        server = self.client.ask()
        if server.batch_lost:
            raise RuntimeError("[UNAVAILABLE] the request was lost")
        server.setting_requests += 1
        for key, value in settings.items():
            if key == server.refused:
                raise RuntimeError(f"[CANNOT_MODIFY_CONFIG] {key}")
            server.settings.setdefault(self.client.session_id, {})[key] = value


class FakeClient:
    __module__ = "pyspark.sql.connect.session"  # a Connect client, as ``sparkenv.is_connect`` tells one

    def __init__(self, server: FakeServer, session_id: str) -> None:
        self.server, self.session_id = server, session_id
        self.release_session_on_close = True
        self.stopped = False
        self.conf = FakeConf(self)

    def ask(self) -> FakeServer:
        if not self.server.answers:
            raise RuntimeError("[UNAVAILABLE] failed to connect")
        if self.session_id in self.server.closed:
            raise RuntimeError(f"[INVALID_HANDLE.SESSION_CLOSED] The handle {self.session_id} is invalid.")
        return self.server

    @property
    def version(self) -> str:
        self.ask()
        return "4.0.0"

    def sql(self, text: str) -> None:
        assert text == "RESET"
        self.ask().reset.append(self.session_id)
        self.server.settings.pop(self.session_id, None)

    def stop(self) -> None:
        self.stopped = True
        if self.release_session_on_close:
            self.server.released.append(self.session_id)
            self.server.closed.add(self.session_id)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeServer:
    fake = FakeServer()
    monkeypatch.setattr(SparkSession, "builder", fake)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return fake


def open_session(url: str = URL, pipeline: str | None = "s3://b/staging#slot") -> Any:
    return runs._connect_session(url, dict(CONF), pipeline)


def test_a_kept_session_is_reopened_reset_and_renewed_once_the_server_closed_it(server: FakeServer):
    first = open_session()
    first.stop()
    assert server.released == [] and server.settings[first.session_id] == CONF
    server.settings[first.session_id]["spark.sql.files.ignoreCorruptFiles"] = "true"  # another client's setting
    again = open_session()
    assert again.session_id == first.session_id and server.reset == [first.session_id] * 2
    assert server.settings[again.session_id] == CONF  # the foreign setting is gone, the run's are set
    server.closed.add(again.session_id)  # idle past the server's timeout
    renewed = open_session()
    assert renewed.session_id not in (first.session_id, "own") and not renewed.stopped
    assert open_session().session_id == renewed.session_id  # the renewed id is the next run's


def test_an_unsaved_id_is_released_and_a_run_without_pipeline_opens_its_own(server: FakeServer, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "blocked").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocked"))  # the cache directory cannot be made
    unsaved = open_session()
    unsaved.stop()
    own = open_session(pipeline=None)
    own.stop()
    assert server.released == [unsaved.session_id, "own"]


def test_a_given_session_is_never_released_nor_reset_and_its_closing_names_the_way_out(server: FakeServer):
    given = open_session(f"{URL}/;token=secret;session_id={GIVEN}")
    given.stop()
    server.refused = "spark.sql.caseSensitive"
    with pytest.raises(SparkStartError, match="refused the session setting"):
        open_session(f"{URL}/;session_id={GIVEN}")
    assert server.released == [] and server.reset == [] and all(c.stopped for c in server.clients)
    server.refused = None
    server.closed.add(GIVEN)
    with pytest.raises(SparkStartError) as closed:
        open_session(f"{URL}/;token=secret;session_id={GIVEN}")
    assert str(closed.value) == (f"the Spark Connect server closed the session {GIVEN} named in "
                                 f"{URL}/;token=***;session_id={GIVEN}: remove session_id from the URL (the pipeline "
                                 "then keeps a session of its own)")
    assert open_session(f"{URL}/;token=secret").session_id not in (GIVEN, "own")  # the way out


def test_the_settings_go_in_one_request_and_a_lost_one_is_sent_setting_by_setting(server: FakeServer):
    assert sparkenv.is_connect(open_session()) and server.setting_requests == 1
    server.batch_lost = True
    again = open_session()  # each setting then set on its own: the session has them all
    assert server.setting_requests == 1 + len(CONF) and server.settings[again.session_id] == CONF
    assert not again.stopped


@pytest.mark.parametrize("pipeline", ["s3://b/staging#slot", None])
def test_a_refused_setting_stops_the_client_and_releases_only_the_runs_own_session(server: FakeServer,
                                                                                   pipeline: str | None):
    server.refused = "spark.sql.session.timeZone"  # the second of the request's settings: the retry names it
    with pytest.raises(SparkStartError, match="refused the session setting spark.sql.session.timeZone=UTC: "
                                              r"RuntimeError: \[CANNOT_MODIFY_CONFIG\]"):
        open_session(pipeline=pipeline)
    (client,) = server.clients
    assert client.stopped and server.released == ([] if pipeline else ["own"])


def test_a_server_that_does_not_answer_is_named_and_nothing_is_released(server: FakeServer):
    server.answers = False
    with pytest.raises(SparkStartError, match=r"^Spark Connect server sc://h:15002 did not answer: RuntimeError"):
        open_session(pipeline=None)
    assert server.clients[0].stopped and server.released == []
