"""The apply's Spark session, started by the first step that needs a Spark frame — or never.

Planning reads manifests, relation files and Parquet footers with pyarrow; verification hashes the staged files;
a table-batch (or snapshot table) the direct path covers (``direct.py``) is printed and COPYed by the target from
the staged files themselves (PostgreSQL: ``targets/postgres/arrownet.py``). A run in which every table-batch is such
a one asks Spark for nothing, so the runner does not create the session up front: ``SparkOnDemand.session()``
starts it where a step builds a Spark frame (a row filter, a repeated key or an unchanged-TOAST value in a batch
too large to net in process, staging on an object store with a master that is not local, a target that takes no direct rows…) and from then on the run uses it as it always did. The steps
and their semantics are the same either way; only when the JVM starts differs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from airflow_provider_pglogical.apply.sparkenv import is_connect, is_local, set_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkOnDemand:
    """A Spark session started on the first ``session()`` call (``start`` starts it), thread-safe.

    ``running``: whether a start is already under way elsewhere (a session started during the drain), which
    ``started`` reports as started: a step that may either use Spark or not then uses the running session as it
    did before. ``conf`` settings are set on the session when it starts, or at once when it runs. ``local_master``:
    whether the session runs (or would run) on this machine (``sparkenv.session_is_local``), so this process may
    read staged files on an object store itself (``batches.readable_here``). Only that bool is kept, never the
    master's URL (a Spark Connect URL may carry a token). ``preset``: settings every session ``start`` gives
    already has, which ``conf`` then does not set again (over Spark Connect each setting set is a round trip).
    """

    def __init__(self, start: Callable[[], SparkSession], *, running: Callable[[], bool] | None = None,
                 local_master: bool = False, preset: Mapping[str, str] | None = None) -> None:
        self._start = start
        self._running = running
        self.local_master = local_master
        self._session: SparkSession | None = None
        self._settings: dict[str, str] = {}
        self._set: dict[str, str] = dict(preset or {})  # what the session has: given at its start or set here
        self._lock = threading.Lock()
        self._activated: set[int] = set()

    @classmethod
    def of(cls, spark: SparkSession | SparkOnDemand) -> SparkOnDemand:
        """``spark`` itself, or a session already started as a ``SparkOnDemand`` that has it."""
        if isinstance(spark, SparkOnDemand):
            return spark
        # A Connect client's driver is its server, wherever that runs: not known to be this machine.
        found = cls(lambda: spark, local_master=not is_connect(spark) and is_local(spark.sparkContext.master))
        found._session = spark
        found._activated.add(threading.get_ident())
        return found

    @property
    def started(self) -> bool:
        """Whether the session exists (or is starting): asking for it costs no JVM start any more."""
        return self._session is not None or (self._running is not None and self._running())

    def conf(self, settings: Mapping[str, str]) -> None:
        """Session settings the steps rely on: set now when the session runs, else as soon as it starts."""
        with self._lock:
            self._settings.update(settings)
            session = self._session
            missing = self._missing(settings)
            if session is not None:
                set_conf(session, missing)
                self._set.update(missing)

    def session(self) -> SparkSession:
        """The session, started now if it was not yet (with every ``conf`` setting)."""
        with self._lock:
            if self._session is None:
                session = self._start()
                missing = self._missing(self._settings)
                set_conf(session, missing)
                self._set.update(missing)
                self._session = session
                self._activated.add(threading.get_ident())
            session = self._session
            thread = threading.get_ident()
            if thread not in self._activated:
                _activate(session)
                self._activated.add(thread)
        return session

    def _missing(self, settings: Mapping[str, str]) -> dict[str, str]:
        """The ``settings`` the session does not have yet."""
        return {k: v for k, v in settings.items() if self._set.get(k) != v}


def _activate(session: SparkSession) -> None:
    """Make ``session`` the JVM's active session for the calling thread too (the JVM keeps it per thread; a step on
    another thread would otherwise read Spark's fallback conf outside a Dataset call). A Connect client has no JVM."""
    if is_connect(session):
        return
    jvm = session._jvm
    if jvm is not None:
        jvm.SparkSession.setActiveSession(session._jsparkSession)


def session_of(spark: SparkSession | SparkOnDemand) -> SparkSession:
    """The session itself (started now when it is on demand)."""
    return spark.session() if isinstance(spark, SparkOnDemand) else spark
