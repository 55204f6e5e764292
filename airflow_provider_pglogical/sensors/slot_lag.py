"""Slot lag sensor and the WAL-retention check that fails before max_slot_wal_keep_size invalidates a slot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from airflow_provider_pglogical.exceptions import SlotError, SlotWalRetentionError
from airflow_provider_pglogical.hooks.sizes import parse_size
from airflow_provider_pglogical.hooks.slots import (
    LOST_WAL_STATUS,
    UNSAFE_WAL_STATUS,
    check_wal_retention,
    slot_lag_bytes,
    slot_summary,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

# The checks live beside SlotInfo (hooks/slots.py); re-exported for existing imports.
__all__ = ["LOST_WAL_STATUS", "UNSAFE_WAL_STATUS", "SlotLagSensor", "SlotWalRetentionError", "check_wal_retention",
           "slot_lag_bytes", "slot_summary"]


class SlotLagSensor(BaseSensorOperator):
    """Wait until a slot's lag (WAL not yet confirmed) is at most ``max_lag_bytes``.

    ``poke()`` returns True when the lag is under the threshold. With ``min_safe_wal_bytes`` set
    each poke also runs :func:`check_wal_retention`, so a slot drifting towards invalidation fails
    the task instead of being waited on.

    With ``deferrable=True`` the sensor checks once, then hands the waiting to
    :class:`~airflow_provider_pglogical.triggers.slot_lag.SlotLagTrigger` in the triggerer (no
    worker slot held, ``poke_interval`` between polls, ``timeout`` as the trigger's timeout) and
    resumes in :meth:`execute_complete`, which raises the trigger's slot error as its own type.

    :param slot: replication slot name. (templated)
    :param max_lag_bytes: largest acceptable lag in bytes. (templated)
    :param min_safe_wal_bytes: fail when ``safe_wal_size`` drops below this. (templated)
    :param postgres_conn_id: Airflow connection of the source database.
    :param deferrable: wait in the triggerer instead of a worker slot.
    """

    template_fields: Sequence[str] = ("slot", "max_lag_bytes", "min_safe_wal_bytes")
    ui_color = "#d4e6f1"

    def __init__(self, *, slot: str, max_lag_bytes: int | str = 0, min_safe_wal_bytes: int | str | None = None,
                 postgres_conn_id: str = "postgres_default", deferrable: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slot = slot
        self.max_lag_bytes = max_lag_bytes
        self.min_safe_wal_bytes = min_safe_wal_bytes
        self.postgres_conn_id = postgres_conn_id
        self.deferrable = deferrable

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        if self.poke(context):  # already within the threshold: nothing to wait for
            return None
        from datetime import timedelta

        from airflow_provider_pglogical.triggers.slot_lag import SlotLagTrigger

        min_safe = None if self.min_safe_wal_bytes in (None, "") else parse_size(self.min_safe_wal_bytes)
        trigger = SlotLagTrigger(slot=self.slot, max_lag_bytes=parse_size(self.max_lag_bytes),
                                 postgres_conn_id=self.postgres_conn_id, poll_interval=self.poke_interval,
                                 min_safe_wal_bytes=min_safe)
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after the trigger fired: return the slot summary, or raise the slot error it reported."""
        from airflow_provider_pglogical import exceptions

        if not event:
            raise SlotError(f"the lag trigger of replication slot {self.slot!r} ended without an event")
        if event.get("status") == "error":
            error = getattr(exceptions, str(event.get("error_type")), None)
            cls = error if isinstance(error, type) and issubclass(error, SlotError) else SlotError
            raise cls(str(event.get("message")), hint="")
        self.log.info("slot %s: lag %s bytes within %s after %s poll(s) in the triggerer", self.slot,
                      event.get("lag_bytes"), self.max_lag_bytes, event.get("polls"))
        return {k: v for k, v in event.items() if k != "status"}

    def poke(self, context: Context) -> bool:
        from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

        threshold = parse_size(self.max_lag_bytes)
        with PgLogicalHook(postgres_conn_id=self.postgres_conn_id) as hook:
            found = hook.slot_info(self.slot)
        min_safe = None if self.min_safe_wal_bytes in (None, "") else parse_size(self.min_safe_wal_bytes)
        info = check_wal_retention(found, slot=self.slot, min_safe_wal_bytes=min_safe)
        lag = slot_lag_bytes(info)
        self.log.info("slot %s: lag %d bytes (threshold %d), wal_status %s, safe_wal_size %s",
                      self.slot, lag, threshold, info.wal_status, info.safe_wal_size)
        return lag <= threshold
