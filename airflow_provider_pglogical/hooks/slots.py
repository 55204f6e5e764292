"""A replication slot as read from ``pg_replication_slots`` and the checks on it (name, WAL retention, lag). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from airflow_provider_pglogical.exceptions import (
    SlotInvalidatedError,
    SlotNotFoundError,
    SlotWalRetentionError,
)
from airflow_provider_pglogical.lsn import format_lsn

# PostgreSQL restricts slot names to lower-case letters, digits and underscores, at most
# NAMEDATALEN-1 bytes (ReplicationSlotValidateName, slot.c).
SLOT_NAME_RE = re.compile(r"[a-z0-9_]{1,63}")
# pg_replication_slots.wal_status: 'reserved'/'extended' are fine; 'unreserved' means the WAL the
# slot needs is already beyond max_slot_wal_keep_size and the next checkpoint may remove it.
UNSAFE_WAL_STATUS = "unreserved"
LOST_WAL_STATUS = "lost"


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """One row of pg_replication_slots plus the WAL it retains; LSNs as integers."""

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    active: bool
    active_pid: int | None
    restart_lsn: int | None
    confirmed_flush_lsn: int | None
    wal_status: str | None
    safe_wal_size: int | None
    two_phase: bool
    retained_bytes: int | None  # pg_current_wal_lsn() - restart_lsn
    pending_bytes: int | None  # pg_current_wal_lsn() - confirmed_flush_lsn

    @property
    def invalidated(self) -> bool:
        return self.wal_status == LOST_WAL_STATUS


def slot_lag_bytes(info: SlotInfo) -> int:
    """WAL written since the slot's confirmed position: what the next drain has to read."""
    return max(info.pending_bytes or 0, 0)


def check_wal_retention(info: SlotInfo | None, *, slot: str, min_safe_wal_bytes: int | None = None) -> SlotInfo:
    """Raise a typed error if the slot is missing, lost, unreserved, or closer than ``min_safe_wal_bytes``
    to invalidation; return the (present) slot otherwise.

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
    return info


def slot_summary(info: SlotInfo) -> dict[str, Any]:
    """A JSON-friendly view of a slot, LSNs in ``X/X`` form (for XCom, logs and `pglogical status`)."""
    return {
        "slot": info.name, "active": info.active, "wal_status": info.wal_status,
        "restart_lsn": format_lsn(info.restart_lsn), "confirmed_flush_lsn": format_lsn(info.confirmed_flush_lsn),
        "safe_wal_size": info.safe_wal_size, "retained_bytes": info.retained_bytes,
        "pending_bytes": info.pending_bytes,
    }
