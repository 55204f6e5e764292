"""Slot lag sensor and the WAL-retention check that fails before max_slot_wal_keep_size invalidates a slot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from airflow_provider_pglogical.exceptions import SlotWalRetentionError
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

    :param slot: replication slot name. (templated)
    :param max_lag_bytes: largest acceptable lag in bytes. (templated)
    :param min_safe_wal_bytes: fail when ``safe_wal_size`` drops below this. (templated)
    :param postgres_conn_id: Airflow connection of the source database.
    """

    template_fields: Sequence[str] = ("slot", "max_lag_bytes", "min_safe_wal_bytes")
    ui_color = "#d4e6f1"

    def __init__(self, *, slot: str, max_lag_bytes: int | str = 0, min_safe_wal_bytes: int | str | None = None,
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slot = slot
        self.max_lag_bytes = max_lag_bytes
        self.min_safe_wal_bytes = min_safe_wal_bytes
        self.postgres_conn_id = postgres_conn_id

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
