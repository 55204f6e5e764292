"""Turn a pipeline spec into Airflow tasks: ensure publication/slot → WAL-retention check → decode → apply, and the
slot-health check beside them."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param, TaskGroup, task

from airflow_provider_pglogical.assets.pglogical import target_table_asset
from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.hooks.storage_connection import staging_connection
from airflow_provider_pglogical.lsn import parse_lsn
from airflow_provider_pglogical.operators.apply import PgLogicalApplyOperator
from airflow_provider_pglogical.operators.decode import PgLogicalDecodeOperator, table_asset
from airflow_provider_pglogical.operators.slot_health import SlotHealthCheckOperator, log_slot_alert
from airflow_provider_pglogical.pipeline.operators import (
    DeltaApplyOperator,
    DropPipelineOperator,
    EnsureReplicationOperator,
    PruneStagingOperator,
    ResetTargetOperator,
    SnapshotTablesOperator,
    SparkConnectApplyOperator,
    SpecSubmitApplyOperator,
    WalRetentionCheckOperator,
)
from airflow_provider_pglogical.pipeline.retention import check_window
from airflow_provider_pglogical.pipeline.runs import apply_config, batches_upto, first_batch_start
from airflow_provider_pglogical.pipeline.spec import PipelineSpec, load_spec
from airflow_provider_pglogical.pipeline.target import spec_target
from airflow_provider_pglogical.staging.drain import DEFAULT_MAX_CHANGES, DEFAULT_MAX_WAL_BYTES

DEFAULT_ARGS = {"retries": 2, "retry_delay": timedelta(minutes=1)}
AlertCallback = Callable[[Any], None]


def pipeline_params(spec: PipelineSpec) -> dict[str, Param]:
    """UI params of a pipeline DAG; defaults come from the spec, a trigger may override them."""
    return {
        "max_changes": Param(spec.source.max_changes or DEFAULT_MAX_CHANGES, type=["null", "integer"], minimum=1,
                             description="Soft limit of changes per staged batch (empty: no limit)."),
        "max_wal_bytes": Param(spec.source.max_batch_bytes or DEFAULT_MAX_WAL_BYTES, type=["null", "integer"],
                               minimum=1, description="WAL bytes read per batch at most (empty: no limit; the "
                                                      "server holds a whole batch in memory)."),
        "min_safe_wal_bytes": Param(spec.source.min_safe_wal_bytes, type=["null", "integer"], minimum=0,
                                    description="Fail before decoding when the slot's safe_wal_size is below this."),
        "resync_tables": Param([], type="array", items={"type": "string"},
                               description="schema.table names to snapshot again at a later LSN; the apply "
                                           "replaces each with its snapshot, then applies its later changes."),
    }


def _require_conn_ids(spec: PipelineSpec) -> None:
    # Tasks run in other processes (and machines): they can only find the databases through
    # Airflow connections, never through a DSN that exists in the DAG file's environment.
    problems = [_missing_conn_id("source")] if spec.source.conn_id is None else []
    for name, view in spec.target_views().items():  # every target of ``targets:``
        if view.target.conn_id is None and spec_target(view).needs_conn_id:
            problems.append(_missing_conn_id(f"targets.{name}" if spec.targets else "target"))
    if problems:
        raise SpecError(f"{spec.origin}: " + "; ".join(problems))


def _missing_conn_id(section: str) -> str:
    return f"{section}: Airflow DAGs need {section}.conn_id instead of {section}.dsn"


def _conn_id(spec: PipelineSpec, section: str, conn_id: str | None) -> str:
    """``conn_id`` of the spec's ``section``, which a task needs (see ``_require_conn_ids``)."""
    if conn_id is None:
        raise SpecError(f"{spec.origin}: {_missing_conn_id(section)}")
    return conn_id


def _param(name: str) -> str:
    # Renders "" when the DAG has no such param; the operators treat "" as "not set".
    return "{{ params.get('" + name + "') if params.get('" + name + "') is not none else '' }}"


def decode_task(spec: PipelineSpec, task_id: str = "decode") -> Any:
    """The decode step: one drain cycle of the spec's slot, emitting an asset event per staged table."""
    return PgLogicalDecodeOperator(
        task_id=task_id, slot=spec.source.slot, publication=spec.source.publications or spec.source.publication,
        staging_uri=spec.staging.uri, staging_conn_id=spec.staging.conn_id,
        postgres_conn_id=_conn_id(spec, "source", spec.source.conn_id), max_wal_bytes=_param("max_wal_bytes"),
        max_changes=_param("max_changes"), read=spec.source.read,
        outlets=[table_asset(spec.source.slot, name) for name in spec.tables])


def apply_task(spec: PipelineSpec, task_id: str = "apply", max_batches: Any = None,
               target_name: str | None = None) -> Any:
    """The apply step: for PostgreSQL, the batches that need no Spark applied in the worker and spark-submit of the
    apply app for the rest (every batch when the spec says ``spark.apply_in_worker: false``),
    with one outlet Asset per target table (``pglogical://<slot>/target/<schema>.<table>``; for one target of
    several: ``…/target/<location>/<schema>.<table>``); a Spark Connect client in the worker when the spec's Spark
    is a Connect server, whatever the target; for a lake target, spark-submit of the spec app when the spec names
    ``spark.conn_id``, else the in-worker apply. ``target_name``: the target's name when ``spec`` is a view of a
    ``targets:`` spec (the submitted app picks it from the spec file; its assets carry its location)."""
    location = spec_target(spec).location() if target_name is not None else None

    def outlets() -> list[Any]:
        return [target_table_asset(spec.source.slot, t.target_name, location) for t in spec.tables.values()]

    if spec.spark.connect_conn_id or spec.spark.remote:  # a client of a Spark Connect server, in this worker (any target)
        return SparkConnectApplyOperator(task_id=task_id, spec=spec, connect_conn_id=spec.spark.connect_conn_id,
                                         max_batches=max_batches, outlets=outlets())
    if spec_target(spec).applies_in_worker:
        if spec.spark.conn_id:  # the spec reaches its Spark by spark-submit: the apply runs there, not in the worker
            return SpecSubmitApplyOperator(task_id=task_id, spec=spec, target_name=target_name, outlets=outlets(),
                                           max_batches=max_batches)
        return DeltaApplyOperator(task_id=task_id, spec=spec, max_batches=max_batches, outlets=outlets())
    config = apply_config(spec)
    # Plain dicts: the operator's ``tables`` is a templated field.
    tables = {name: {k: v for k, v in vars(cfg).items() if v is not None} for name, cfg in config.tables.items()}
    return PgLogicalApplyOperator(
        task_id=task_id, slot=spec.source.slot, staging_uri=spec.staging.uri,
        target_conn_id=_conn_id(spec, "target", spec.target.conn_id), tables=tables, max_batches=max_batches,
        conn_id=spec.spark.submit_conn_id, conf=dict(spec.spark.conf) or None,
        source_conn_id=spec.source.conn_id, bookkeeping_schema=spec.target.bookkeeping_schema,
        session_replication_role=spec.target.session_replication_role, staging_conn_id=spec.staging.conn_id,
        apply_in_worker=spec.spark.apply_in_worker, outlets=outlets())


def apply_task_id(spec: PipelineSpec, name: str, task_id: str = "apply") -> str:
    """``apply`` for the one target of ``target:``; ``apply_<name>`` for each of ``targets:``."""
    return f"{task_id}_{name}" if spec.targets else task_id


def apply_tasks(spec: PipelineSpec, task_id: str = "apply", max_batches: Any = None) -> list[Any]:
    """One apply task per target of the spec (``apply_task`` of its view), to run in parallel."""
    return [apply_task(view, task_id=apply_task_id(spec, name, task_id), max_batches=max_batches,
                       target_name=name if spec.targets else None)
            for name, view in spec.target_views().items()]


def health_task(spec: PipelineSpec, *, alert_callback: AlertCallback | None = log_slot_alert,
                task_id: str = "check_slot_health") -> Any:
    """The slot-health check with the spec's thresholds (``source.min_safe_wal_bytes`` / ``max_lag_bytes``),
    failing — and calling ``alert_callback`` — while the slot can still be saved."""
    return SlotHealthCheckOperator(
        task_id=task_id, slot=spec.source.slot, postgres_conn_id=_conn_id(spec, "source", spec.source.conn_id),
        min_safe_wal_bytes=_param("min_safe_wal_bytes"), max_lag_bytes=spec.source.max_lag_bytes,
        retries=0, on_failure_callback=alert_callback)


def pipeline_task_group(spec: PipelineSpec, *, group_id: str = "pglogical",
                        alert_callback: AlertCallback | None = log_slot_alert) -> TaskGroup:
    """Add the pipeline's tasks to the current DAG as one TaskGroup and return it.

    The slot-health check runs beside the WAL-retention check → decode → apply chain (not after it, so a failed
    decode still fails the DAG run); ``alert_callback`` is its and the WAL-retention check's
    ``on_failure_callback``.
    """
    _require_conn_ids(spec)
    kinds = ", ".join(f"{name}: {spec_target(view).kind}" if spec.targets else spec_target(view).kind
                      for name, view in spec.target_views().items())
    with TaskGroup(group_id=group_id, tooltip=f"slot {spec.source.slot} → {kinds}") as group:
        # Snapshots first: with snapshot.initial a new slot is created with an exported snapshot.
        snapshot = SnapshotTablesOperator(task_id="snapshot", spec=spec,
                                          resync_tables="{{ (params.get('resync_tables') or []) | tojson }}")
        ensure = EnsureReplicationOperator(task_id="ensure_replication", spec=spec)
        check = WalRetentionCheckOperator(task_id="check_wal_retention", spec=spec,
                                          min_safe_wal_bytes=_param("min_safe_wal_bytes"),
                                          on_failure_callback=alert_callback)
        retention = PruneStagingOperator(task_id="prune_staging", spec=spec)
        # One apply per target (``targets:``), in parallel after the one decode; each from its own watermarks.
        snapshot >> ensure >> check >> decode_task(spec) >> apply_tasks(spec) >> retention
        ensure >> health_task(spec, alert_callback=alert_callback)
    return group


def build_pipeline_dag(spec: PipelineSpec | str | os.PathLike[str], *, dag_id: str, schedule: Any = None,
                       alert_callback: AlertCallback | None = log_slot_alert, **dag_kwargs: Any) -> DAG:
    """A DAG running the spec's pipeline once per run (one drain cycle, then apply of all pending).

    Defaults: ``max_active_runs=1`` (one slot has one reader at a time), ``catchup=False`` (a
    run drains whatever is pending; past intervals hold no separate data), and UI params from
    :func:`pipeline_params`. Any DAG argument can be overridden through ``dag_kwargs``.
    ``alert_callback``: called with the task context when the slot-health or WAL-retention check fails
    (default :func:`~airflow_provider_pglogical.operators.slot_health.log_slot_alert`, one ERROR line).
    """
    if not isinstance(spec, PipelineSpec):
        spec = load_spec(spec)
    params = {**pipeline_params(spec), **dag_kwargs.pop("params", {})}
    kwargs = {"max_active_runs": 1, "catchup": False, "default_args": DEFAULT_ARGS,
              "tags": ["pglogical"], "doc_md": f"Pipeline from `{spec.origin}`: slot `{spec.source.slot}`, "
                                              f"tables {', '.join(sorted(spec.tables))}.", **dag_kwargs}
    with DAG(dag_id=dag_id, schedule=schedule, params=params, **kwargs) as dag:
        pipeline_task_group(spec, alert_callback=alert_callback)
    return dag


def build_replay_dag(spec: PipelineSpec | str | os.PathLike[str], *, dag_id: str, **dag_kwargs: Any) -> DAG:
    """A manually triggered DAG that rebuilds the targets from the staged log up to an LSN or a time.

    Replay applies whole staged batches in LSN order: every batch ending at or before
    ``upto_lsn`` (and whose last commit is at or before ``upto_time``). With ``reset`` the target
    tables are emptied and their watermarks forgotten first; otherwise only batches past the
    watermarks are applied. Re-running it gives the same target (apply is idempotent).
    """
    if not isinstance(spec, PipelineSpec):
        spec = load_spec(spec)
    _require_conn_ids(spec)
    params = {
        "upto_lsn": Param("", type="string", pattern=r"^([0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8})?$",
                          description="Replay batches ending at or before this LSN (X/X); empty: all."),
        "upto_time": Param("", type="string",
                           description="Replay batches whose last commit is at or before this ISO time; empty: all."),
        "reset": Param(True, type="boolean", description="Empty the target tables and watermarks first."),
        **dag_kwargs.pop("params", {}),
    }
    kwargs = {"max_active_runs": 1, "catchup": False, "tags": ["pglogical", "replay"],
              "doc_md": build_replay_dag.__doc__, **dag_kwargs}
    with DAG(dag_id=dag_id, schedule=None, params=params, **kwargs) as dag:
        plan = _plan_replay_task(spec)
        for name, view in spec.target_views().items():  # each target of ``targets:`` rebuilt beside the others
            reset = ResetTargetOperator(task_id=apply_task_id(spec, name, "reset_target"), spec=view,
                                        enabled="{{ params.reset }}")
            replay = apply_task(view, task_id=apply_task_id(spec, name, "replay"), max_batches=plan["max_batches"],
                                target_name=name if spec.targets else None)
            plan >> reset >> replay
    return dag


def build_teardown_dag(spec: PipelineSpec | str | os.PathLike[str], *, dag_id: str, **dag_kwargs: Any) -> DAG:
    """A manually triggered DAG that tears the spec's pipeline down, like ``pglogical drop``.

    Drops the slot (releasing the WAL it pins), the publication the pipeline created and the slot's bookkeeping
    on the target; the target tables stay. Param ``confirm`` must be the slot's name (the task fails otherwise:
    the changes the slot holds are lost for good); ``staging`` also removes the staging area; ``dry_run`` only
    reports what would be dropped. Run it again after a failure: every step skips what is gone.
    """
    if not isinstance(spec, PipelineSpec):
        spec = load_spec(spec)
    _require_conn_ids(spec)
    params = {
        "confirm": Param("", type="string", description=f"Type the slot's name ({spec.source.slot}) to drop it."),
        "staging": Param(False, type="boolean", description="Also remove the staging area (batches, snapshots)."),
        "dry_run": Param(False, type="boolean", description="Only list what would be dropped."),
        **dag_kwargs.pop("params", {}),
    }
    kwargs = {"max_active_runs": 1, "catchup": False, "tags": ["pglogical", "teardown"],
              "doc_md": build_teardown_dag.__doc__, **dag_kwargs}
    with DAG(dag_id=dag_id, schedule=None, params=params, **kwargs) as dag:
        DropPipelineOperator(task_id="drop_pipeline", spec=spec, confirm="{{ params.confirm }}",
                             staging="{{ params.staging }}", list_only="{{ params.dry_run }}", retries=0)
    return dag


def _plan_replay_task(spec: PipelineSpec) -> Any:
    @task(task_id="plan_replay")
    def plan_replay(params: dict[str, Any] | None = None) -> dict[str, Any]:
        params = params or {}
        upto_lsn = parse_lsn(upto) if (upto := params.get("upto_lsn") or "") else None
        text = params.get("upto_time") or ""
        upto_time = datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
        if upto_time is not None and upto_time.tzinfo is None:
            upto_time = upto_time.replace(tzinfo=UTC)  # commit times are staged in UTC
        with staging_connection(spec.staging.uri, spec.staging.conn_id):
            # Retention may have pruned what the rebuild needs: refuse before the reset empties the target.
            check_window(spec, reset=bool(params.get("reset", True)), upto_lsn=upto_lsn)
            count = batches_upto(spec, upto_lsn=upto_lsn, upto_time=upto_time)
            first = first_batch_start(spec)
        print(f"replaying {count} staged batch(es) of slot {spec.source.slot} from {first}")
        return {"max_batches": count}

    return plan_replay()
