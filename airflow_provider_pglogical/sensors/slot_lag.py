"""Slot lag sensor and the WAL-retention check that fails before max_slot_wal_keep_size invalidates a slot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from airflow_provider_pglogical.exceptions import (  # noqa: F401  (SlotWalRetentionError re-exported)
    SlotError,
    SlotInvalidatedError,
    SlotNotFoundError,
    SlotWalRetentionError,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_pglogical.hooks.pglogical import SlotInfo

# pg_replication_slots.wal_status: 'reserved'/'extended' are fine; 'unreserved' means the WAL the
# slot needs is already beyond max_slot_wal_keep_size and the next checkpoint may remove it.
UNSAFE_WAL_STATUS = "unreserved"
LOST_WAL_STATUS = "lost"


def slot_lag_bytes(info: SlotInfo) -> int:
    """WAL written since the slot's confirmed position: what the next drain has to read."""
    return max(info.pending_bytes or 0, 0)


def check_wal_retention(info: SlotInfo | None, *, slot: str, min_safe_wal_bytes: int | None = None) -> None:
    """Raise a typed error if the slot is lost, unreserved, or closer than ``min_safe_wal_bytes``
    to invalidation; return quietly otherwise.

    ``safe_wal_size`` is NULL when ``max_slot_wal_keep_size = -1``: the server then never
    invalidates a slot, so only wal_status is checked.
    """
    if info is None:
        raise SlotNotFoundError(f"replication slot {slot!r} does not exist")
    if info.wal_status == LOST_WAL_STATUS or info.confirmed_flush_lsn is None:
        raise SlotInvalidatedError(f"replication slot {slot!r} has been invalidated (wal_status={info.wal_status})")
    if info.wal_status == UNSAFE_WAL_STATUS:
        raise SlotWalRetentionError(
            f"replication slot {slot!r} is unreserved: it retains {info.retained_bytes} bytes of WAL, more than "
            "max_slot_wal_keep_size, and the next checkpoint may invalidate it")
    if min_safe_wal_bytes is not None and info.safe_wal_size is not None and info.safe_wal_size < min_safe_wal_bytes:
        raise SlotWalRetentionError(
            f"replication slot {slot!r} can lose WAL after {info.safe_wal_size} more bytes "
            f"(threshold {min_safe_wal_bytes}); it retains {info.retained_bytes} bytes")


def slot_summary(info: SlotInfo) -> dict[str, Any]:
    """A JSON-friendly view of a slot, LSNs in ``X/X`` form (for XCom, logs and `pglogical status`)."""
    from airflow_provider_pglogical.exceptions import format_lsn

    return {
        "slot": info.name, "active": info.active, "wal_status": info.wal_status,
        "restart_lsn": format_lsn(info.restart_lsn), "confirmed_flush_lsn": format_lsn(info.confirmed_flush_lsn),
        "safe_wal_size": info.safe_wal_size, "retained_bytes": info.retained_bytes,
        "pending_bytes": info.pending_bytes,
    }


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

        from airflow_provider_pglogical.pipeline.spec import parse_size
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
        from airflow_provider_pglogical.pipeline.spec import parse_size

        threshold = parse_size(self.max_lag_bytes)
        with PgLogicalHook(postgres_conn_id=self.postgres_conn_id) as hook:
            info = hook.slot_info(self.slot)
        min_safe = None if self.min_safe_wal_bytes in (None, "") else parse_size(self.min_safe_wal_bytes)
        check_wal_retention(info, slot=self.slot, min_safe_wal_bytes=min_safe)
        assert info is not None  # check_wal_retention raised otherwise
        lag = slot_lag_bytes(info)
        self.log.info("slot %s: lag %d bytes (threshold %d), wal_status %s, safe_wal_size %s",
                      self.slot, lag, threshold, info.wal_status, info.safe_wal_size)
        return lag <= threshold
