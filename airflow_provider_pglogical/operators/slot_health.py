"""A check task that fails while there is still time to save a slot from ``max_slot_wal_keep_size``, and the
default alert callback of the pipeline DAGs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_pglogical.exceptions import SlotInvalidatedError, SlotNotFoundError, SlotWalRetentionError
from airflow_provider_pglogical.history.health import LOST, Thresholds, judge, severity
from airflow_provider_pglogical.history.recorder import slot_figures
from airflow_provider_pglogical.hooks.sizes import parse_size

if TYPE_CHECKING:
    from airflow.sdk import Context

logger = logging.getLogger(__name__)


def _size(value: int | str | None) -> int | None:
    # Templated thresholds arrive as strings; "" / "None" leave the check out.
    return None if value in (None, "", "None") else parse_size(value)


class SlotHealthCheckOperator(BaseOperator):
    """Fail while the slot can still be saved: ``safe_wal_size`` under ``min_safe_wal_bytes``, lag over
    ``max_lag_bytes`` or ``wal_status = unreserved`` raise ``SlotWalRetentionError``; a lost slot raises
    ``SlotInvalidatedError`` naming the resync, a missing one ``SlotNotFoundError``. Returns the slot's figures.

    The same judgement as ``pglogical check``. Give it an ``on_failure_callback`` to be alerted (the pipeline
    DAGs give it theirs, see :func:`log_slot_alert`).

    :param slot: replication slot name. (templated)
    :param min_safe_wal_bytes: at risk below this ``safe_wal_size``, e.g. ``1GB``. (templated)
    :param max_lag_bytes: at risk above this lag, e.g. ``10GB``. (templated)
    :param postgres_conn_id: Airflow connection of the source database.
    """

    template_fields: Sequence[str] = ("slot", "min_safe_wal_bytes", "max_lag_bytes")
    ui_color = "#f9e79f"

    def __init__(self, *, slot: str, min_safe_wal_bytes: int | str | None = None,
                 max_lag_bytes: int | str | None = None, postgres_conn_id: str = "postgres_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slot = slot
        self.min_safe_wal_bytes = min_safe_wal_bytes
        self.max_lag_bytes = max_lag_bytes
        self.postgres_conn_id = postgres_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

        limits = Thresholds(min_safe_wal_bytes=_size(self.min_safe_wal_bytes), max_lag_bytes=_size(self.max_lag_bytes))
        with PgLogicalHook(postgres_conn_id=self.postgres_conn_id) as hook:
            info = hook.slot_info(self.slot)
        figures = None if info is None else slot_figures(info)
        findings = judge(self.slot, figures, limits)
        if figures is None:
            raise SlotNotFoundError(findings[0].message)
        self.log.info("slot %s: wal_status %s, safe_wal_size %s, lag %s bytes, WAL retained %s bytes: %s",
                      self.slot, figures.wal_status, figures.safe_wal_size, figures.lag_bytes,
                      figures.retained_bytes, severity(findings))
        if severity(findings) == LOST:
            raise SlotInvalidatedError(findings[0].message, hint="")  # the finding names the resync already
        if findings:
            raise SlotWalRetentionError("; ".join(f.message for f in findings))
        return {"slot": self.slot, **vars(figures)}


def log_slot_alert(context: Context) -> None:
    """The pipeline DAGs' default alert: one ERROR line naming the DAG, the task and why it failed.

    A hook to replace: ``build_pipeline_dag(..., alert_callback=my_callback)`` with a callback taking Airflow's
    task context (page, e-mail, chat) — ``context["exception"]`` is the typed error, its message names the slot,
    the figures and the way out.
    """
    ti = context.get("ti") or context.get("task_instance")
    where = f"{getattr(ti, 'dag_id', '?')}.{getattr(ti, 'task_id', '?')}"
    error = context.get("exception")
    logger.error("pglogical alert: %s failed: %s", where,
                 " ".join(str(error).split()) if error is not None else "no exception recorded")
