"""Decode and apply runs of a pipeline spec: the library code behind both the CLI and the DAG tasks."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from airflow_provider_pglogical.apply import jvm_archive, planning
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.sparkenv import (
    LOCAL_DRIVER_CONF,
    SESSION_CONF,
    check_pyspark_install,
    is_connect,
    is_local,
    is_remote,
    redacted,
    session_is_local,
    set_conf,
    use_package_python,
)
from airflow_provider_pglogical.apply.targets.postgres.progress import PROGRESS_TABLE
from airflow_provider_pglogical.exceptions import SparkStartError, StagingError, format_lsn
from airflow_provider_pglogical.history.recorder import RunRecorder, Stopwatch, recording, slot_figures
from airflow_provider_pglogical.pipeline.snapshots import (
    initial_snapshot_if_new,
    overlapped_load,
    sync_tables,
    unapplied_snapshots,
)
from airflow_provider_pglogical.pipeline.source import (
    check_column_lists,
    check_retention,
    drop_replication,
    ensure_replication,
    exclusive_slot,
    resolved,
    source_client,
)
from airflow_provider_pglogical.pipeline.spec import PipelineSpec, TableSpec
from airflow_provider_pglogical.pipeline.target import SpecTarget, spec_target
from airflow_provider_pglogical.staging.drain import (
    DEFAULT_MAX_CHANGES,
    DEFAULT_MAX_WAL_BYTES,
    DrainConfig,
    DrainResult,
    drain_run,
)
from airflow_provider_pglogical.staging.layout import StagingLayout
from airflow_provider_pglogical.staging.reader import StagingReader
from airflow_provider_pglogical.staging.retention import record_position

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand

Log = Callable[[str], None]
DEFAULT_MASTER = "local[*]"


def _quiet(_message: str) -> None:
    pass


def apply_config(spec: PipelineSpec, *, max_batches: int | None = None) -> ApplyConfig:
    """The spec's tables as the apply package's config (only listed tables are applied)."""
    def table(t: TableSpec) -> TableApplyConfig:
        return TableApplyConfig(row_filter=t.row_filter, columns=t.columns,
                                target=None if t.name.endswith("*") else t.target_name,
                                conflict=t.conflict, unchanged_toast=t.unchanged_toast,
                                truncate_cascade=spec.truncate.cascade, key_columns=t.key_columns,
                                actions=t.actions, schema_changes=t.schema_changes, leaves=t.leaves)

    # Selections ("*", "schema.*") go along as wildcard entries (ApplyConfig.table_config): a table the
    # publication started publishing after the spec was last resolved is applied all the same.
    return ApplyConfig(slot=spec.source.slot, staging_root=spec.staging.uri,
                       tables={name: table(t) for name, t in {**spec.selectors, **spec.tables}.items()},
                       max_batches=max_batches,
                       progress_table=PROGRESS_TABLE, bookkeeping_schema=spec.target.bookkeeping_schema,
                       session_replication_role=spec.target.session_replication_role)


_spark_logs_off = False


def silence_spark_logs() -> None:
    """The Spark this process starts from now on writes its output to a log file, not the terminal, and py4j
    logs nothing: the CLI without ``--debug``, whose errors are one line on stderr."""
    global _spark_logs_off
    import logging

    _spark_logs_off = True
    logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)


def new_spark_session(master: str | None = None, conf: dict[str, str] | None = None, *,
                      pipeline: str | None = None) -> SparkSession:
    """A started Spark session for in-process apply (the CLI; the DAG uses spark-submit instead).

    ``pipeline`` (its staging URI and slot): over a Spark Connect server, the session that pipeline's previous run
    left open on the server is reopened (``connect_session``), its Python workers warm.

    A JVM that does not come up raises ``SparkStartError`` naming the master and the cause (its own
    output, e.g. an unrecognised JVM option, went to stderr before it, or to its log file after
    ``silence_spark_logs``).
    """
    from pyspark.sql import SparkSession

    master = master or DEFAULT_MASTER
    if is_remote(master):
        return _connect_session(master, {**(conf or {}), **SESSION_CONF}, pipeline)
    options = {"spark.master": master, "spark.app.name": "pglogical-apply", "spark.ui.enabled": "false",
               "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "4"}
    if is_local(master):
        # Python workers must import pyarrow and this package: the interpreter it is installed in.
        use_package_python()
        options.update(LOCAL_DRIVER_CONF)
    options.update(conf or {})
    options.update(SESSION_CONF)  # last: what the apply's exactness rests on is never a caller's to change
    # Spark's classes mapped from this machine's class archive (appended to the user's driver options).
    options = jvm_archive.driver_conf(master, options)
    check_pyspark_install()
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    log_file = _new_spark_log() if _spark_logs_off and not _gateway_running() else None
    try:
        if log_file:
            _launch_jvm_logging_to(log_file, options)
        return builder.getOrCreate()
    except Exception as exc:
        cause = " ".join(str(exc).split()) or type(exc).__name__
        where = f" (Spark's own output: {log_file})" if log_file else ""
        raise SparkStartError(f"Spark ({redacted(master)}) did not start: {type(exc).__name__}: {cause}{where}") from exc


def _connect_session(remote: str, conf: dict[str, str], pipeline: str | None = None) -> SparkSession:
    """A Spark Connect client session of the server at ``remote`` (``sc://host:port``). The server owns the
    cluster's settings; ``conf`` may carry session settings (``spark.sql.*``) only. A server that does not
    answer raises ``SparkStartError`` naming it.

    With ``pipeline``, the session is the one kept for it on the server (``connect_session.KeptSession``; a new one
    when the server closed it), its settings reset, and stopping the client leaves it open. A URL naming its
    ``session_id`` is used as it is (its settings not reset: it may be shared) and left open; once the server closed
    it, the error says to remove the id. Without either, the session is the run's own and stopping releases it.
    """
    from airflow_provider_pglogical.pipeline import connect_session

    given = connect_session.url_params(remote).get(connect_session.SESSION_ID_PARAM)
    kept = None if given or pipeline is None else connect_session.KeptSession(
        connect_session.session_key(remote, pipeline, conf))
    try:
        try:
            if kept is None:
                return _open_connect(remote, conf, keep=bool(given))
            return _open_connect(connect_session.with_session_id(remote, kept.current()), conf, keep=kept.saved,
                                 reset=True)
        except Exception as exc:
            if not connect_session.is_closed_session(exc):
                raise
            if kept is None:
                then = "the pipeline then keeps" if pipeline else "the run then opens"
                raise SparkStartError(f"the Spark Connect server closed the session {given} named in "
                                      f"{redacted(remote)}: remove session_id from the URL ({then} a session of "
                                      "its own)") from exc
            renewed = kept.renew()
            return _open_connect(connect_session.with_session_id(remote, renewed), conf, keep=kept.saved)
    except SparkStartError:
        raise
    except Exception as exc:
        raise SparkStartError(f"Spark Connect server {redacted(remote)} did not answer: {_cause(exc)}") from exc


def _open_connect(remote: str, conf: dict[str, str], *, keep: bool, reset: bool = False) -> SparkSession:
    """The client session of ``remote``, its settings set, the server asked once. ``keep``: ``stop()`` closes the
    client only, leaving the server's session (and its Python workers) for the next run. ``reset``: the session may
    be a previous run's, whose settings anyone holding its id could have changed; ``RESET`` returns them to the
    server's (its static and cluster settings, and its Python workers, stay as they are)."""
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(remote).getOrCreate()
    session.release_session_on_close = False  # type: ignore[attr-defined]  # until the server has the session
    try:
        # The client connects lazily: ask the server once, here. ``RESET`` (a command, run when sent) or the
        # version is one round trip and no Spark job (a job on a warm server still costs a plan, a task and its
        # result, on every run).
        if reset:
            session.sql("RESET")
        else:
            session.version  # noqa: B018
        session.release_session_on_close = not keep  # type: ignore[attr-defined]
        try:
            set_conf(session, conf)  # one round trip
        except Exception:  # the server answered: a setting it refuses is that setting's problem
            for key, value in conf.items():  # which one, for the error; each set, the session has them all
                try:
                    session.conf.set(key, value)
                except Exception as exc:
                    raise SparkStartError(f"Spark Connect server {redacted(remote)} refused the session setting "
                                          f"{key}={value}: {_cause(exc)}") from exc
    except BaseException:
        session.stop()  # releases the run's own session once the server has it; a kept one stays for the next run
        raise
    return session


def _cause(exc: BaseException) -> str:
    """``Type: message`` on one line, at most 300 characters of the message."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300] or type(exc).__name__}"


# The log files of the JVMs this process started (``silence_spark_logs``): kept when the command fails (a
# ``SparkStartError`` names its file), removed when it succeeds (``discard_spark_logs``), so a pipeline scheduled
# every few minutes does not leave a file in the temporary directory per run.
_spark_log_files: list[str] = []


def _new_spark_log() -> str:
    import tempfile

    fd, path = tempfile.mkstemp(prefix="pglogical-spark-", suffix=".log")
    os.close(fd)
    _spark_log_files.append(path)
    return path


def _gateway_running() -> bool:
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def discard_spark_logs() -> None:
    """Remove the log files of the JVMs this process started: the command succeeded, nothing in them is needed."""
    while _spark_log_files:
        with suppress(FileNotFoundError):
            os.unlink(_spark_log_files.pop())


def _launch_jvm_logging_to(path: str, options: dict[str, str]) -> None:
    """Start this process's Spark JVM with its stdout and stderr in the log file ``path``, unless it runs.

    The JVM and the Python workers it spawns inherit these: their log4j lines, JVM warnings and stack
    traces stay out of the terminal, where the CLI prints a failure as one line. The builder then
    finds the gateway started (pyspark's ``launch_gateway``, the documented hook to capture that output).
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    with open(path, "ab") as out:
        conf = SparkConf(loadDefaults=False)
        for key, value in options.items():
            conf.set(key, value)
        gateway = launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": out})  # type: ignore[no-untyped-call]
    SparkContext._ensure_initialized(gateway=gateway)


@contextmanager
def local_spark(master: str | None = None, conf: dict[str, str] | None = None) -> Iterator[SparkSession]:
    """``new_spark_session`` for the block, stopped afterwards."""
    session = new_spark_session(master, conf)
    try:
        yield session
    finally:
        session.stop()


class SparkStarter:
    """The Spark session of one ``pglogical run``, started on a thread of its own when ``start()`` is called.

    The run calls ``start()`` as soon as the drain has read a transaction, so the JVM comes up while
    the drain decodes, stages and advances instead of after it; a run with nothing to apply never
    calls it and starts no JVM. ``start()`` returns at once and is idempotent; ``session()`` waits for
    the start and returns the session, or raises its error (``SparkStartError``) in the calling
    thread — so a JVM that fails to start fails the apply, never the drain, whose slot advance keeps
    following the durable manifest as before. ``stop()`` waits for a start under way and stops the
    session. ``early`` tells whether the start began before the apply asked for the session. ``pipeline``: the
    pipeline the session is for (``new_spark_session``: a Connect server's session kept from run to run).
    """

    def __init__(self, master: str | None = None, conf: dict[str, str] | None = None, *, log: Log = _quiet,
                 pipeline: str | None = None) -> None:
        self.master = master or DEFAULT_MASTER
        self.conf = dict(conf or {})
        self.pipeline = pipeline
        self.log = log
        self.early = False
        self.start_s: float | None = None  # JVM start to session ready
        self.waited_s: float | None = None  # how long the apply waited for it
        self._thread: threading.Thread | None = None
        self._session: SparkSession | None = None
        self._error: BaseException | None = None
        self.connect_session: str | None = None  # the Connect server's session id, over a Connect server

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def settings_held(self) -> bool:
        """Whether the session's settings stay those its start gave it (``SESSION_CONF``): this process opened the
        session, or reset a kept one. A Spark Connect URL naming a ``session_id`` gives a session used as it is,
        whose settings anyone holding the id can change between its start and the apply."""
        from airflow_provider_pglogical.pipeline import connect_session

        return not (is_remote(self.master)
                    and connect_session.url_params(self.master).get(connect_session.SESSION_ID_PARAM))

    def start(self, reason: str = "") -> None:
        if self._thread is not None:
            return
        # pyspark is imported here rather than on the thread, so the drain's own imports (which go on
        # meanwhile) never wait on a module lock the start holds. Its failure is the thread's to report
        # (it imports again): nothing about Spark may fail the drain.
        try:
            import pyspark.sql  # noqa: F401
        except Exception:  # noqa: BLE001, S110
            pass

        if reason:
            self.log(f"starting Spark ({redacted(self.master)}) in the background: {reason}")
        self._thread = threading.Thread(target=self._run, name="pglogical-spark-start", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            self._session = new_spark_session(self.master, self.conf, pipeline=self.pipeline)
            if is_connect(self._session):
                self.connect_session = str(self._session.session_id)  # type: ignore[attr-defined]
        except BaseException as exc:  # noqa: BLE001 - handed over to the thread that asks for the session
            self._error = exc
        self.start_s = time.monotonic() - t0

    def session(self) -> SparkSession:
        """The started session (starting it now if nobody did yet)."""
        self.early = self.early or self._thread is not None
        self.start()
        assert self._thread is not None
        t0 = time.monotonic()
        self._thread.join()
        self.waited_s = time.monotonic() - t0
        if self._error is not None:
            raise self._error
        assert self._session is not None
        # The JVM keeps the active session per thread and set it for the starting thread only; the apply
        # runs on this one (SQLConf.get outside a Dataset call would otherwise read Spark's fallback conf).
        if not is_connect(self._session):  # a Connect client has no JVM (its server keeps the session)
            jvm = self._session._jvm
            if jvm is not None:
                jvm.SparkSession.setActiveSession(self._session._jsparkSession)
        if self.early:
            self.log(f"Spark started in the background in {self.start_s:.1f} s; the apply waited {self.waited_s:.1f} s")
        return self._session

    def stop(self) -> None:
        if self._thread is None:
            return
        self._thread.join()
        if self._session is not None:
            self._session.stop()
            self._session = None

    def summary(self) -> dict[str, Any]:
        """For the run's JSON: whether Spark was started, during the drain or for the apply, and the seconds."""
        started = "during the drain" if self.early else ("for the apply" if self.started else None)
        return {"started": started, "start_s": None if self.start_s is None else round(self.start_s, 2),
                "apply_waited_s": None if self.waited_s is None else round(self.waited_s, 2),
                **({"connect_session": self.connect_session} if self.connect_session else {})}


def run_pending(spec: PipelineSpec, *, master: str | None = None, max_batches: int | None = None,
                log: Log = _quiet, allow_gap: bool = False) -> dict[str, Any]:
    """``pglogical run``: decode (at most ``max_batches`` batches), then apply everything pending.

    When the run will surely need Spark (``spark_expected``), it starts in the background once the drain has read
    a transaction, or once a snapshot was staged for a target that loads snapshots through Spark (a lake),
    overlapping the JVM start with the rest of the drain; otherwise the
    apply starts it only if a step needs it (``apply/spark_on_demand.py``): a run the direct path covers whole and
    an empty slot start no JVM. Recorded in the slot's run history as one ``run``
    (docs/staging-format.md#run-history).
    """
    starter = SparkStarter(master or spec.spark.where, spec.spark.conf, log=log, pipeline=pipeline_name(spec))
    may_start = spec_target(spec).early_spark_start
    early = may_start and spark_expected(spec, starter.master)
    early_for_snapshot = may_start and spark_expected(spec, starter.master, snapshot=True)

    def on_changes() -> None:
        if early:
            starter.start("the drain has changes to stage")

    def on_snapshot() -> None:
        if early_for_snapshot:
            starter.start("a snapshot was staged")

    with recording(spec.staging.uri, spec.source.slot, "run", log=log) as recorder:
        try:
            # A snapshot this run takes loads table by table as it is published, while the rest is read; the
            # apply below loads what that left (``pipeline/snapshots.overlapped_load``). The loaders end (and
            # release the slot's apply lock and their connections) once the snapshot steps return, before the drain.
            with overlapped_load(spec, lambda: apply_config(resolved(spec)), local_master=session_is_local(
                    starter.master), log=log) as loader:
                decoded = decode_pending(spec, max_batches=max_batches, log=log, on_changes=on_changes,
                                         on_snapshot=on_snapshot, allow_gap=allow_gap, recorder=recorder,
                                         on_published=loader.listener() if loader is not None else None,
                                         on_snapshots_done=loader.close if loader is not None else None)
            applied = apply_pending(spec, master=master, log=log, spark=starter, recorder=recorder)
        finally:
            starter.stop()
    overlapped = {"snapshot_loaded_while_reading": loader.summary()} \
        if loader is not None and (loader.rows or loader.left) else {}
    return {"decode": decoded, **overlapped, "apply": applied, "spark": starter.summary()}


def pipeline_name(spec: PipelineSpec) -> str:
    """What tells one pipeline from another on a shared Spark Connect server: its staging URI and slot."""
    return f"{spec.staging.uri}#{spec.source.slot}"


def spark_expected(spec: PipelineSpec, master: str | None = None, *, snapshot: bool = False) -> bool:
    """Whether a run of ``spec`` with changes to apply surely starts Spark: its target takes no direct rows, or
    its configuration rules the direct path out (``direct.may_cover``: a row filter outside what this process
    evaluates, leaf partitions routed to their root, staging on an object store with a master that is not local).
    Otherwise only the staged files tell. ``master``: the run's (default: the spec's, else ``local[*]``).
    ``snapshot``: the run loads a staged snapshot, which a target reading no snapshot rows itself (a lake: only
    PostgreSQL COPYs them from the staged files) surely loads through Spark."""
    from airflow_provider_pglogical.apply import direct

    handle = spec_target(spec)
    if snapshot and not handle.takes_direct_snapshot_rows:
        return True
    master = master or spec.spark.where or DEFAULT_MASTER
    return not (handle.takes_direct_rows and direct.may_cover(apply_config(spec), session_is_local(master)))


def apply_pending(spec: PipelineSpec, *, master: str | None = None, max_batches: int | None = None,
                  log: Log = _quiet, spark: SparkStarter | None = None, recorder: RunRecorder | None = None,
                  tool: str = "cli") -> dict[str, Any]:
    """Apply every staged batch beyond the target's watermarks, oldest first (idempotent).

    ``spark``: the run's session starter (its owner stops it); without it one is made and stopped here. Either
    way the session starts only when a step of the apply needs it (``apply/spark_on_demand.py``); the result's
    ``spark_started`` says whether it ran. Recorded in the slot's run history as an ``apply``
    by ``tool``, or into ``recorder`` (the enclosing run's).
    """
    with recording(spec.staging.uri, spec.source.slot, "apply", tool=tool, log=log, given=recorder) as record:
        watch = Stopwatch()
        result, lsns = _apply_pending(spec, master=master, max_batches=max_batches, log=log, spark=spark)
        record.applied(batches_applied=result["batches_applied"], rows=result["rows"], seconds=watch.seconds,
                       lsns=lsns)
    return result


def _apply_pending(spec: PipelineSpec, *, master: str | None, max_batches: int | None, log: Log,
                   spark: SparkStarter | None) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """``apply_pending``'s result and the (start, end) LSNs of the batches it committed."""
    spec = resolved(spec)  # the selected tables' targets carry watermarks and snapshots too
    config = apply_config(spec, max_batches=max_batches)
    target = spec_target(spec)
    with target:  # one bookkeeping connection for both questions, closed before Spark starts
        pending = pending_batches(spec, max_batches=max_batches, target=target)
        nothing = not pending and not unapplied_snapshots(spec, target.sync_marks())
    if nothing:
        # Starting Spark costs seconds: skip it when every staged batch is below every watermark.
        log(f"nothing to apply: no staged batch of slot {spec.source.slot} is past the target's watermarks")
        return {"batches_seen": 0, "batches_applied": 0, "batches_replayed_in_order": 0, "last_applied_end_lsn": None,
                "rows": {}, "spark_started": False}, []
    log(f"applying {len(pending)} staged batch(es) of slot {spec.source.slot} from {spec.staging.uri}")
    from airflow_provider_pglogical.apply.runner import apply_slot  # imports pyspark: only when there is work

    # One apply path: the shared runner plans every batch and hands it to the spec's target.
    with target.environment(), _apply_session(spark, master or spec.spark.where, spec.spark.conf, log,
                                              pipeline_name(spec)) as session:
        reports = apply_slot(session, config, target=target.for_apply(session, config))
        spark_started = session.started
    if not spark_started:
        log("applied without Spark: the direct path covered every table-batch and snapshot table")
    rows: dict[str, dict[str, int]] = {}
    for report in reports:
        for table, counts in report.rows.items():
            total = rows.setdefault(table, {})
            for kind, n in counts.items():
                total[kind] = total.get(kind, 0) + n
    applied = [r for r in reports if r.applied]
    # A replayed batch's counters count changes, not net rows (docs/apply.md, ordered replay).
    replayed = sum(r.ordered for r in applied)
    log(f"applied {len(applied)} of {len(reports)} staged batches ({replayed} replayed change by change)")
    return ({"batches_seen": len(reports), "batches_applied": len(applied), "batches_replayed_in_order": replayed,
             "last_applied_end_lsn": format_lsn(applied[-1].end_lsn) if applied else None,
             "rows": rows, "spark_started": spark_started}, [(r.start_lsn, r.end_lsn) for r in applied])


@contextmanager
def _apply_session(starter: SparkStarter | None, master: str | None, conf: dict[str, str],
                   log: Log, pipeline: str | None = None) -> Iterator[SparkOnDemand]:
    """The apply's session on demand: ``starter``'s (started during the drain, or when a step asks; its owner stops
    it), else one of its own, stopped after the block if a step started it."""
    from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand

    used = starter or SparkStarter(master, conf, log=log, pipeline=pipeline)

    def start() -> SparkSession:
        if not used.started:  # else it started during the drain
            log(f"starting Spark ({redacted(used.master)}) for the apply: a staged batch needs Spark's transforms")
        return used.session()

    try:
        # ``new_spark_session`` gives every session SESSION_CONF: the steps asking for it again cost no round trip,
        # unless the session is shared (its settings set again at the apply's start).
        yield SparkOnDemand(start, running=lambda: used.started, local_master=session_is_local(used.master),
                            preset=SESSION_CONF if used.settings_held else None)
    finally:
        if starter is None:
            used.stop()


def pending_batches(spec: PipelineSpec, *, max_batches: int | None = None,
                    target: SpecTarget | None = None) -> list[tuple[int, int]]:
    """(start, end) LSNs of staged batches some target table has not applied yet, in LSN order.

    Judged exactly as the apply judges them (``planning.pending_tables``), from the manifests and
    truncate files only, so a run with nothing to do starts no Spark. ``target``: the spec's target
    handle when the caller holds one (its connection is reused).
    """
    reader = StagingReader.from_uri(spec.staging.uri, spec.source.slot)
    batches = reader.batches()
    if max_batches is not None:
        batches = batches[:max_batches]
    config = apply_config(spec)
    if target is None:
        with spec_target(spec) as own:
            marks = own.watermarks()
    else:
        marks = target.watermarks()
    pending = []
    for batch in batches:
        manifest = reader.manifest(batch)
        sources = planning.batch_sources(manifest.tables, reader.truncates(batch, manifest))
        if planning.pending_tables(sources, config, marks, batch.end_lsn):
            pending.append((batch.start_lsn, batch.end_lsn))
    return pending


def decode_pending(spec: PipelineSpec, *, max_batches: int | None = None, log: Log = _quiet,
                   resync: list[str] | None = None, on_changes: Callable[[], None] | None = None,
                   on_snapshot: Callable[[], None] | None = None, allow_gap: bool = False,
                   recorder: RunRecorder | None = None,
                   on_published: Callable[[list[str]], None] | None = None,
                   on_snapshots_done: Callable[[], None] | None = None) -> dict[str, Any]:
    """Ensure publication and slot, check WAL retention, then drain the slot batch by batch.

    Idempotent per slot position: each cycle stages ``(confirmed_flush_lsn, end]`` and advances
    the slot only after the batch's manifest exists, so a crash in between re-stages the same
    range, which the drain replaces rather than duplicates. ``on_changes`` is called (possibly more
    than once) when there is something for an apply: the drain read a transaction, or a snapshot was staged
    (``on_snapshot`` instead, when given).
    Column lists are checked against the source catalog first, before anything is created, staged or advanced.
    ``allow_gap``: a slot past the staged log's end (recreated) drains on, losing the changes in between.
    Recorded in the slot's run history as a ``decode``, or into ``recorder`` (the enclosing run's).
    ``on_published``: called with each set of tables a snapshot publishes (``snapshot.run.Published``);
    ``on_snapshots_done``: once the snapshot steps have returned, before the drain (no set is published after it).
    """
    with recording(spec.staging.uri, spec.source.slot, "decode", log=log, given=recorder) as record:
        with source_client(spec) as client:
            # The slot as found, recorded before anything can fail on it (a lost slot's record says so).
            record.saw_slot(slot_figures(client.slot_info(spec.source.slot)))
            check_column_lists(spec, client)
            # snapshot.initial: a new slot is created with an exported snapshot (before ensure_replication)
            initial = initial_snapshot_if_new(spec, client, log=log, on_published=on_published)
            ensured = ensure_replication(spec, client)
            log(f"slot {spec.source.slot} at {ensured['confirmed_flush_lsn']} (publication {', '.join(spec.source.all_publications)})")
            record.saw_slot(slot_figures(client.slot_info(spec.source.slot)))  # kept when the check below fails
            retention = check_retention(spec, client)
            log(f"slot lag {retention['lag_bytes']} bytes, wal_status {retention['wal_status']}")
        synced = sync_tables(spec, resync=resync, log=log, on_published=on_published)
        if on_snapshots_done is not None:
            on_snapshots_done()
        staged = on_snapshot or on_changes
        if staged is not None and (initial or synced.get("tables")):
            staged()
        watch = Stopwatch()
        batches = drain(spec, max_batches=max_batches, log=log, on_changes=on_changes, allow_gap=allow_gap)
        record.decoded(batches, watch.seconds)
        _observe_slot(spec, record, log)
    return {"ensure": ensured, "retention": retention, "snapshot": {"initial": initial, "tables": synced},
            "batches": batches, "changes": sum(b.get("changes", 0) for b in batches)}


def _observe_slot(spec: PipelineSpec, record: RunRecorder, log: Log) -> None:
    """The slot's figures after the drain, for the history; a source that stopped answering is logged only
    (the batches are staged and the slot advanced: the run's work is done)."""
    try:
        with source_client(spec) as client:
            record.saw_slot(slot_figures(client.slot_info(spec.source.slot)))
    except Exception as exc:  # noqa: BLE001
        log(f"slot {spec.source.slot}: figures after the drain not read ({type(exc).__name__})")


def drain_config(spec: PipelineSpec, *, allow_gap: bool = False) -> DrainConfig:
    """The spec's source and staging as the drain library's per-cycle config (``spec`` resolved: its
    tables are the ones whose snapshots may cover a gap left by a recreated slot)."""
    publication = spec.source.publications or spec.source.publication  # several: pgoutput's union semantics
    return DrainConfig(slot=spec.source.slot, publication=publication, staging_uri=spec.staging.uri,
                       max_wal_bytes=spec.source.max_batch_bytes or DEFAULT_MAX_WAL_BYTES,
                       max_changes=spec.source.max_changes or DEFAULT_MAX_CHANGES,
                       read=spec.source.read,
                       allow_gap=allow_gap, snapshot_tables=tuple(sorted(spec.tables)))


def drain(spec: PipelineSpec, *, max_batches: int | None = None, log: Log = _quiet,
          on_changes: Callable[[], None] | None = None, allow_gap: bool = False) -> list[dict[str, Any]]:
    """Run drain cycles until the slot has caught up with the WAL flushed when we started
    (or ``max_batches`` cycles); one summary per staged batch. ``on_changes`` is called when a cycle
    has read its first transaction or message (the batch is not staged yet).

    Stopping at the starting flush position keeps a run bounded on a busy source: later WAL is
    the next run's work.
    """
    if spec.selectors:
        spec = resolved(spec)
    config = drain_config(spec, allow_gap=allow_gap)

    def report(result: DrainResult) -> None:
        summary = result.to_summary()
        log(f"staged {summary['start_lsn']}..{summary['end_lsn']}: {summary['transactions']} transactions, "
            f"{summary['changes']} changes, {summary['truncates']} truncates"
            + (" (already staged, slot advanced)" if result.replayed else ""))

    def checkpoint(name: str) -> None:
        if name == "fetched_some" and on_changes is not None:
            on_changes()

    with source_client(spec) as client:
        stop_at = client.current_wal_flush_lsn()
        # One lock and, when a batch is cut by max_changes, the same peek read on for the next batch.
        results = drain_run(client, config, max_batches=max_batches, stop_at=stop_at, on_result=report,
                            on_checkpoint=checkpoint)
    return [r.to_summary() for r in results]


def batches_upto(spec: PipelineSpec, *, upto_lsn: int | None = None, upto_time: datetime | None = None) -> int:
    """How many staged batches (from the first) end at or before ``upto_lsn`` / commit by ``upto_time``.

    Replay works on whole batches: a batch is included only when its last transaction qualifies.
    """
    reader = StagingReader.from_uri(spec.staging.uri, spec.source.slot)
    count = 0
    for ref in reader.batches():
        if upto_lsn is not None and ref.end_lsn > upto_lsn:
            break
        if upto_time is not None:
            commits = reader.read_file(ref, "transactions.parquet").column("commit_time")
            last = pc.max(commits).as_py() if len(commits) else None
            if last is not None and last > upto_time:
                break
        count += 1
    return count


def reset_target(spec: PipelineSpec, *, log: Log = _quiet) -> dict[str, Any]:
    """Empty the spec's target tables and forget the slot's watermarks and sync marks, in one transaction
    (``pglogical reset``; replay's first step).

    The next apply starts from the first staged batch (and loads the staged snapshots again); crashing
    before the commit leaves the target untouched, after it the apply simply starts from an empty target.
    The staging area's record then says nothing is applied, so the missing watermarks are expected.
    """
    with spec_target(resolved(spec)) as target:
        result = target.reset(log=log)
        # The target applies from the first staged batch again: it holds every batch for retention meanwhile.
        record_position(StagingLayout.from_uri(spec.staging.uri, spec.source.slot), target.identity(), None)
        return result


def drop_pipeline(spec: PipelineSpec, *, dry_run: bool = False, staging: bool = False,
                  log: Log = _quiet) -> dict[str, Any]:
    """Tear the pipeline down (``pglogical drop``): the slot (the WAL it pins is released), the publications
    it created, the slot's bookkeeping on the target and, with ``staging``, its staging area. The target
    tables stay.

    Holds the slot's drain lock on the source and its apply lock on the target throughout, so no run
    starts meanwhile; either held by a run (or the slot active) is a ``PipelineBusyError`` before anything
    is dropped. Every step skips what is already gone: a drop run twice, or after one that failed halfway,
    finishes. The spec is not resolved against its publication (that could create it): selected tables'
    bookkeeping is found by the slot's own rows. ``dry_run``: report what would be dropped, drop nothing.
    """
    with source_client(spec) as client, ExitStack() as stack:
        # Every target of the spec: the slot's bookkeeping goes from each (``targets:`` holds several).
        targets = {name: stack.enter_context(spec_target(view)) for name, view in spec.target_views().items()}

        def shown(found: dict[str, dict[str, Any]]) -> dict[str, Any]:
            return {"targets": found} if spec.targets else {"target": found[next(iter(found))]}

        if dry_run:
            return {"dry_run": True, **drop_replication(spec, client, dry_run=True),
                    **shown({n: t.drop_bookkeeping(dry_run=True) for n, t in targets.items()}),
                    "staging": _staging_area(spec, remove=staging, dry_run=True)}
        stack.enter_context(exclusive_slot(spec, client))
        for target in targets.values():
            stack.enter_context(target.exclusive())
        source = drop_replication(spec, client, log=log)
        # Before the staging area: the target record there says where the bookkeeping is.
        bookkeeping = shown({n: t.drop_bookkeeping(log=log) for n, t in targets.items()})
        area = _staging_area(spec, remove=staging, dry_run=False, log=log)
    return {"dry_run": False, **source, **bookkeeping, "staging": area}


def _staging_area(spec: PipelineSpec, *, remove: bool, dry_run: bool, log: Log = _quiet) -> dict[str, Any]:
    """The slot's staging area (batches, snapshots, state and target records): removed when ``remove``."""
    layout = StagingLayout.from_uri(spec.staging.uri, spec.source.slot)
    where = layout.uri_for(layout.slot_dir)
    if not remove:
        return {"path": where, "remove": False}
    files = len(layout.files(layout.slot_dir, recursive=True))
    if not dry_run and (files or layout.exists(layout.slot_dir)):  # asked again only of an area with no file
        layout.delete_dir(layout.slot_dir)
        log(f"removed the staging area {where} ({files} file(s))")
    return {"path": where, "remove": True, "files": files}


def first_batch_start(spec: PipelineSpec) -> str | None:
    """Start LSN of the oldest staged batch (replay needs the log from the slot's creation)."""
    batches = StagingReader.from_uri(spec.staging.uri, spec.source.slot).batches()
    if not batches:
        raise StagingError(f"no staged batches for slot {spec.source.slot!r} under {spec.staging.uri}")
    return format_lsn(batches[0].start_lsn)


__all__ = ["SparkStarter", "apply_config", "apply_pending", "spark_expected", "batches_upto", "decode_pending", "drain", "drop_pipeline",
           "local_spark", "new_spark_session", "reset_target", "run_pending"]
