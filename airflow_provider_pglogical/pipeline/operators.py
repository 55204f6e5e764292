"""Operators for the pipeline's steps besides decode: ensure publication/slot, check WAL retention, reset a target,
the in-process apply into a lake target, the lake target's apply submitted to the spec's Spark, the apply over Spark
Connect, staging retention, and tearing the pipeline down."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator

from airflow_provider_pglogical.exceptions import ApplyError, ConfirmationRequiredError, SpecError
from airflow_provider_pglogical.hooks.sizes import parse_size
from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient
from airflow_provider_pglogical.hooks.storage_connection import staging_connection
from airflow_provider_pglogical.operators.apply import prepare_submit, submit_master
from airflow_provider_pglogical.pipeline import spec_app
from airflow_provider_pglogical.pipeline.retention import check_window, prune
from airflow_provider_pglogical.pipeline.runs import apply_pending, drop_pipeline, reset_target
from airflow_provider_pglogical.pipeline.snapshots import initial_snapshot_if_new, sync_tables
from airflow_provider_pglogical.pipeline.source import check_retention, ensure_replication, source_client
from airflow_provider_pglogical.pipeline.spec import PipelineSpec
from airflow_provider_pglogical.pipeline.target import spec_target

if TYPE_CHECKING:
    from airflow.sdk import Context

SourceStep = Callable[[PipelineSpec, PgLogicalClient], dict[str, Any]]


def _staging(spec: PipelineSpec) -> AbstractContextManager[None]:
    """The spec's staging root reached with ``staging.conn_id``'s credentials for the block (if it names one)."""
    return staging_connection(spec.staging.uri, spec.staging.conn_id)


def _run_on_source(task: BaseOperator, spec: PipelineSpec, step: SourceStep, message: str,
                   keys: Sequence[str]) -> dict[str, Any]:
    """``step`` with a slot client on the spec's source (closed afterwards); logs ``message`` with the result's ``keys``."""
    with source_client(spec) as client:
        result = step(spec, client)
    task.log.info(message, *(result[k] for k in keys))
    return result


class EnsureReplicationOperator(BaseOperator):
    """Make sure the spec's publication and slot exist; create them when ``source.create`` is true.

    Safe to re-run: existing objects are left alone (creation is ``IF NOT EXISTS``-like), and a
    publication missing one of the spec's tables fails with a SpecError instead of being altered.

    :param spec: the validated pipeline spec.
    """

    ui_color = "#e8daef"

    def __init__(self, *, spec: PipelineSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec

    def execute(self, context: Context) -> dict[str, Any]:
        return _run_on_source(self, self.spec, ensure_replication,
                              "publication %s (created: %s), slot %s at %s (created: %s)",
                              ("publication", "created_publication", "slot", "confirmed_flush_lsn", "created_slot"))


class WalRetentionCheckOperator(BaseOperator):
    """Fail with a typed error before ``max_slot_wal_keep_size`` can invalidate the slot, or before an apply that
    would need batches staging retention pruned.

    Raises SlotWalRetentionError when the slot is ``unreserved`` or its ``safe_wal_size`` is below
    ``min_safe_wal_bytes`` (default: the spec's ``source.min_safe_wal_bytes``), and
    SlotInvalidatedError when it is already ``lost``; StagingPrunedError when the target has not applied the
    pruned range and a table has no snapshot past it (``pipeline/retention.check_window``). Returns the slot summary.

    :param spec: the validated pipeline spec.
    :param min_safe_wal_bytes: override of the spec's threshold. (templated)
    """

    template_fields: Sequence[str] = ("min_safe_wal_bytes",)
    ui_color = "#fadbd8"

    def __init__(self, *, spec: PipelineSpec, min_safe_wal_bytes: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.min_safe_wal_bytes = min_safe_wal_bytes

    def execute(self, context: Context) -> dict[str, Any]:
        spec = self.spec
        if self.min_safe_wal_bytes not in (None, ""):
            spec = replace(spec, source=replace(spec.source, min_safe_wal_bytes=parse_size(self.min_safe_wal_bytes)))
        summary = _run_on_source(self, spec, check_retention, "slot %s: wal_status %s, safe_wal_size %s, lag %s bytes",
                                 ("slot", "wal_status", "safe_wal_size", "lag_bytes"))
        with _staging(spec):
            check_window(spec)  # after the snapshot task: a resync_tables snapshot past the pruned range counts
        return summary


class ResetTargetOperator(BaseOperator):
    """Empty the spec's target tables and forget the slot's watermarks (for a replay from staging).

    :param spec: the validated pipeline spec.
    :param enabled: skip the reset when false. (templated)
    """

    template_fields: Sequence[str] = ("enabled",)
    ui_color = "#f5b7b1"

    def __init__(self, *, spec: PipelineSpec, enabled: bool | str = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.enabled = enabled

    def execute(self, context: Context) -> dict[str, Any]:
        if str(self.enabled).lower() in ("false", "0", "no", ""):
            self.log.info("reset disabled: replaying on top of the current target")
            return {"truncated": []}
        with _staging(self.spec):
            return reset_target(self.spec, log=self.log.info)


class DeltaApplyOperator(BaseOperator):
    """Apply every staged batch past the lake tables' watermarks (Delta, Iceberg), with the Spark driver in this worker:
    a local session, or a client-mode driver of the spec's ``spark.master`` (a spec reaching Spark Connect gets
    ``SparkConnectApplyOperator`` instead, one naming ``spark.conn_id`` ``SpecSubmitApplyOperator``).

    The lake targets commit from the Spark driver (delta-rs, pyiceberg: docs/delta.md), so the worker can be that
    driver; credentials come from ``target.conn_id`` (an AWS, Google Cloud or Azure connection) or the worker's
    environment, and reach deltalake/pyarrow through the process environment only.

    :param spec: the validated pipeline spec (``target.kind: delta``).
    :param max_batches: apply at most this many batches. (templated)
    """

    template_fields: Sequence[str] = ("max_batches",)
    ui_color = "#d6eaf8"

    def __init__(self, *, spec: PipelineSpec, max_batches: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.max_batches = max_batches

    def execute(self, context: Context) -> dict[str, Any]:
        limit = None if self.max_batches in (None, "", "None") else int(self.max_batches)
        with _staging(self.spec):
            return apply_pending(self.spec, max_batches=limit, log=self.log.info, tool="airflow")


class SparkConnectApplyOperator(BaseOperator):
    """Apply every staged batch past the PostgreSQL target's watermarks over Spark Connect: this worker runs the
    apply's driver as a client of the server the ``spark_connect`` connection names (the apache-spark provider's
    ``SparkConnectHook``: host, port, token, SSL), or of the spec's ``spark.remote`` URL. The server's executors
    read the staged files and COPY into the target; nothing is submitted (``PgLogicalApplyOperator`` keeps
    spark-submit for classic clusters).

    :param spec: the validated pipeline spec.
    :param connect_conn_id: an Airflow connection of type ``spark_connect`` (default: the spec's ``spark.remote``).
    :param max_batches: apply at most this many batches. (templated)
    """

    template_fields: Sequence[str] = ("max_batches",)
    ui_color = "#fdebd0"

    def __init__(self, *, spec: PipelineSpec, connect_conn_id: str | None = None,
                 max_batches: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.connect_conn_id = connect_conn_id
        self.max_batches = max_batches

    def remote_url(self) -> str:
        """The Connect URL: the connection's (``sc://host:port/;token=…``), else the spec's ``spark.remote``."""
        if self.connect_conn_id:
            from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

            return SparkConnectHook(self.connect_conn_id).get_connection_url()
        if not self.spec.spark.remote:
            raise SpecError(f"{self.spec.origin}: spark.connect_conn_id or spark.remote is needed for Spark Connect")
        return self.spec.spark.remote

    def execute(self, context: Context) -> dict[str, Any]:
        limit = None if self.max_batches in (None, "", "None") else int(self.max_batches)
        with _staging(self.spec):
            return apply_pending(self.spec, master=self.remote_url(), max_batches=limit, log=self.log.info,
                                 tool="airflow")


_REPO_SPEC_APP = Path(spec_app.__file__).resolve().parents[2] / "spark_apps" / "apply_spec.py"
SPEC_APPLICATION = str(_REPO_SPEC_APP if _REPO_SPEC_APP.exists() else Path(spec_app.__file__).resolve())


class SpecSubmitApplyOperator(SparkSubmitOperator):
    """Apply every staged batch past the target's watermarks by spark-submit of ``spark_apps/apply_spec.py --spec``
    on the spec's Spark connection (``spark.conn_id``): the DAG's route for a lake target (Delta, Iceberg) whose
    spec reaches Spark by spark-submit, so its Spark work runs where the spec's Spark runs, as the PostgreSQL
    target's ``PgLogicalApplyOperator`` does.

    Client deploy mode: the driver — where the table library commits (docs/delta.md) — runs on this worker's host
    and reads the spec file the DAG was built from. The package is zipped and shipped with ``--py-files``;
    ``staging.conn_id``'s and ``target.conn_id``'s credentials go to the spark-submit process as environment
    variables, never on its command line. Returns the app's JSON summary (counts only) as the XCom.

    :param spec: the validated pipeline spec, loaded from a file (one target: a ``targets:`` spec's view).
    :param target_name: the target's name in a ``targets:`` spec (None for ``target:``).
    :param max_batches: apply at most this many batches. (templated)
    :param python: interpreter for driver and executors (default for ``local`` masters: this one).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "max_batches")
    ui_color = "#d6eaf8"

    def __init__(self, *, spec: PipelineSpec, target_name: str | None = None, max_batches: int | str | None = None,
                 python: str | None = None, application: str = SPEC_APPLICATION, **kwargs: Any) -> None:
        if not Path(spec.origin).is_file():
            raise SpecError(f"{spec.origin}: a spark-submit apply (spark.conn_id) reads the spec from its file; "
                            "build the DAG from the spec's path")
        kwargs.setdefault("conf", dict(spec.spark.conf) or None)
        kwargs.setdefault("deploy_mode", "client")  # the driver reads the spec file and writes the summary here
        super().__init__(application=application, conn_id=spec.spark.submit_conn_id,
                         name=f"pglogical-apply-{spec.source.slot}", **kwargs)
        self.spec = spec
        self.target_name = target_name
        self.max_batches = max_batches
        self.python = python
        self.spark_conn_id = spec.spark.submit_conn_id

    def application_arguments(self, summary: Path) -> list[str]:
        args = ["--spec", str(Path(self.spec.origin).resolve()), "--summary-file", str(summary)]
        if self.target_name:
            args += ["--target", self.target_name]
        if self.max_batches not in (None, "", "None"):
            args += ["--max-batches", str(int(self.max_batches))]
        if self.spec.target.conn_id:  # resolved here, where Airflow's connections are: see ``execute``
            args.append("--credentials-from-env")
        return args

    # SparkSubmitOperator.execute returns None; this one returns the apply's summary as its XCom.
    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        master = submit_master(self.spark_conn_id)
        workdir = tempfile.mkdtemp(prefix="pglogical-apply-")
        try:
            summary = Path(workdir) / "summary.json"
            self.application_args = [*(self.application_args or []), *self.application_arguments(summary)]
            with spec_target(self.spec) as handle:
                credentials = handle.credentials_env()
            self.env_vars = prepare_submit(self, master, workdir, self.python, self.spec.staging.uri,
                                           self.spec.staging.conn_id, credentials)
            super().execute(context)
            if not summary.exists():
                raise ApplyError(f"slot {self.spec.source.slot}: spark-submit of {Path(self.application).name} "
                                 "ended without writing its summary")
            result: dict[str, Any] = json.loads(summary.read_text(encoding="utf-8"))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        self.log.info("applied by spark-submit on %s: %s", master, json.dumps(result, sort_keys=True))
        return result


class SnapshotTablesOperator(BaseOperator):
    """Snapshots of the spec's tables, before anything is decoded (see docs/pipeline-spec.md#snapshot-optional).

    With ``snapshot.initial`` and a new slot: creates the publication (``source.create``) and the slot
    with an exported snapshot and stages every table at its consistent point. Then, for any pipeline:
    tables in ``resync_tables`` (the DAG param), tables added to the spec, and tables a crashed
    snapshot left unfinished are snapshotted at a later sync LSN. Nothing to do: returns quickly.

    :param spec: the validated pipeline spec.
    :param resync_tables: ``schema.table`` names to snapshot again. (templated)
    """

    template_fields: Sequence[str] = ("resync_tables",)
    ui_color = "#d6eaf8"

    def __init__(self, *, spec: PipelineSpec, resync_tables: Sequence[str] | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.resync_tables = resync_tables

    def tables_to_resync(self) -> list[str]:
        value = self.resync_tables
        if value in (None, "", "[]"):
            return []
        if isinstance(value, str):
            value = json.loads(value) if value.startswith("[") else [v.strip() for v in value.split(",")]
        tables = [str(v) for v in value if str(v).strip()]
        unknown = sorted(set(tables) - set(self.spec.tables))
        if unknown:
            raise SpecError(f"resync_tables: {', '.join(unknown)} not in the spec's tables")
        return tables

    def execute(self, context: Context) -> dict[str, Any]:
        resync = self.tables_to_resync()
        with _staging(self.spec):
            with source_client(self.spec) as client:
                initial = initial_snapshot_if_new(self.spec, client, log=self.log.info)
            synced = sync_tables(self.spec, resync=resync, log=self.log.info)
        return {"initial": initial, "tables": synced}


class PruneStagingOperator(BaseOperator):
    """Record how far the target has applied the staged log and, with ``staging.retention``, prune the batches every
    target of the staging area has applied (``pglogical prune``; docs/operations.md#staging-retention).

    Runs after the apply in every pipeline DAG: a target that never records its position keeps every batch for the
    others.

    :param spec: the validated pipeline spec.
    """

    ui_color = "#d5f5e3"

    def __init__(self, *, spec: PipelineSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec

    def execute(self, context: Context) -> dict[str, Any]:
        with _staging(self.spec):
            return prune(self.spec, log=self.log.info)


def _flag(value: bool | str) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


class DropPipelineOperator(BaseOperator):
    """Tear the spec's pipeline down (``pglogical drop``): its slot, the publication it created and the slot's
    bookkeeping on the target, keeping the target tables; with ``staging`` its staging area too.

    Dropping the slot loses the changes it holds for good, so the task refuses (``ConfirmationRequiredError``)
    unless ``confirm`` is the slot's name; ``list_only`` reports what would be dropped and needs no confirmation.

    :param spec: the validated pipeline spec.
    :param confirm: the slot's name, typed by whoever triggers the drop. (templated)
    :param staging: also remove the staging area. (templated)
    :param list_only: only report what would be dropped (``--dry-run``; ``dry_run`` is BaseOperator's). (templated)
    """

    template_fields: Sequence[str] = ("confirm", "staging", "list_only")
    ui_color = "#f1948a"

    def __init__(self, *, spec: PipelineSpec, confirm: str = "", staging: bool | str = False,
                 list_only: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.confirm = confirm
        self.staging = staging
        self.list_only = list_only

    def execute(self, context: Context) -> dict[str, Any]:
        slot, dry_run = self.spec.source.slot, _flag(self.list_only)
        if not dry_run and str(self.confirm or "").strip() != slot:
            raise ConfirmationRequiredError(
                f"dropping slot {slot!r} loses the changes it holds for good; trigger the DAG with the param "
                f"confirm set to {slot!r} (or dry_run true to list what would be dropped)")
        with _staging(self.spec):
            return drop_pipeline(self.spec, dry_run=dry_run, staging=_flag(self.staging), log=self.log.info)
