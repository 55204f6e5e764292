"""A Spark Connect server session kept from one run of a pipeline to the next.

A Connect server starts Python workers per client session (each session has its own worker environment), so a run
that opened a session of its own paid for a new worker daemon, its workers and their imports on every run — seconds
of a small batch's apply. A run of a pipeline instead reopens the session its previous run left on the server
(``sc://host:port/;session_id=<uuid>``) and leaves it open at its end, and the server's workers stay warm for the
next run. A session the server closed (released, or idle past the server's timeout) is replaced by a new one
transparently.

What makes reusing the session exact: nothing of its state is relied upon. A reopened session's settings are reset
(``RESET``: whatever another client attached with the id may have set, such as ``ignoreCorruptFiles`` or a Parquet
rebase mode, is gone) before the run sets its own; its id is keyed by the server, the pipeline (staging URI and
slot), the settings and this package's version, so runs of two pipelines never share one and changed settings or
an upgraded package get a fresh session; and the plans the server resolved and cached for it (file listings,
Parquet footers) stay exact because a staged file is never rewritten once a reader can see it: its path names its
LSN range, its batch is visible only once its manifest is written, and only a crashed attempt's files — which no
reader saw — are written again; retention removes whole batches.

What it leaves on the server: one session per pipeline (per settings and package version) with its Python worker
daemon, held until the server's session timeout (``spark.connect.session.manager.defaultSessionTimeout``).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote

from airflow_provider_pglogical.environ import user_cache_dir

SESSION_ID_PARAM = "session_id"
# The server's answer for a session id it closed: that id cannot be opened again (the server keeps its tombstone).
CLOSED_SESSION_ERRORS = ("INVALID_HANDLE.SESSION_CLOSED", "INVALID_HANDLE.SESSION_NOT_FOUND")


def url_params(remote: str) -> dict[str, str]:
    """The ``;key=value`` parameters of a Connect URL (``sc://host:port/;token=…;session_id=…``)."""
    _, _, params = remote.partition("/;")
    return {k: unquote(v) for k, _, v in (p.partition("=") for p in params.split(";") if p)}


def with_session_id(remote: str, session_id: str) -> str:
    """``remote`` with the parameter ``session_id`` added (its other parameters kept)."""
    base, sep, params = remote.partition("/;")
    if not sep:
        base = remote.rstrip("/")
    return f"{base}/;" + ";".join(p for p in (params, f"{SESSION_ID_PARAM}={session_id}") if p)


def sessions_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the kept sessions' ids live: the user's cache directory's ``pglogical/connect``."""
    return user_cache_dir(environ) / "connect"


def session_key(remote: str, pipeline: str, conf: Mapping[str, str]) -> str:
    """What the kept session is for: the server (its URL without parameters), the pipeline, the settings and this
    package's version (the server's workers keep the modules they imported)."""
    from airflow_provider_pglogical import __version__

    server = remote.partition("/;")[0].rstrip("/")
    text = json.dumps([server, pipeline, sorted(conf.items()), __version__])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class KeptSession:
    """The id of the session kept for one key, in a file of ``sessions_dir``. ``current()`` reads it (a new id when
    there is none or it is unreadable); ``renew()`` replaces it (the server closed the old one). ``saved`` tells
    whether the id is in the file: one that could not be written is no next run's, so its session is released at the
    run's end as a session of its own (the id is never needed for correctness)."""

    def __init__(self, key: str, directory: Path | None = None) -> None:
        self.path = (directory or sessions_dir()) / f"{key}.session"
        self.saved = False

    def current(self) -> str:
        try:
            found = str(uuid.UUID(self.path.read_text().strip(), version=4))
        except (OSError, ValueError):
            return self.renew()
        self.saved = True
        return found

    def renew(self) -> str:
        new = str(uuid.uuid4())
        try:
            # The id opens the session to whoever reads it (its settings, its cached plans): the owner's only.
            # The modes given to mkdir and open hold only for what they create: a directory or a leftover partial
            # file from before (another umask, an older release) is narrowed too, the directory when it is ours.
            directory = self.path.parent
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if directory.stat().st_uid == os.getuid():
                directory.chmod(0o700)
            partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(new + "\n")
            partial.replace(self.path)
            self.saved = True
        except OSError:
            self.saved = False
        return new


def is_closed_session(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing a session id it closed."""
    text = str(exc)
    return any(name in text for name in CLOSED_SESSION_ERRORS)
