"""Trigger that polls a replication slot's lag from the triggerer until it is under a threshold."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_pglogical.exceptions import SlotError


def poll_slot(postgres_conn_id: str, slot: str, min_safe_wal_bytes: int | None) -> dict[str, Any]:
    """One blocking look at the slot: its summary plus ``lag_bytes``; raises the typed SlotError
    the WAL-retention check raises (missing, invalidated, unreserved, under ``min_safe_wal_bytes``)."""
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
    from airflow_provider_pglogical.hooks.slots import check_wal_retention, slot_lag_bytes, slot_summary

    with PgLogicalHook(postgres_conn_id=postgres_conn_id) as hook:
        found = hook.slot_info(slot)
    info = check_wal_retention(found, slot=slot, min_safe_wal_bytes=min_safe_wal_bytes)
    return {**slot_summary(info), "lag_bytes": slot_lag_bytes(info)}


def _event(payload: dict[str, Any]) -> TriggerEvent:
    return TriggerEvent(payload)  # type: ignore[no-untyped-call]  # airflow.triggers.base is not annotated


class SlotLagTrigger(BaseTrigger):
    """Fire once the slot's lag (WAL not yet confirmed) is at most ``max_lag_bytes``.

    The query is psycopg2 (blocking), so each poll runs in a worker thread
    (``asgiref.sync_to_async``, as the common-sql trigger does) and the event loop stays free
    between polls. A slot problem the sensor would fail on (missing, invalidated, about to lose
    WAL) ends the wait with a ``"status": "error"`` event naming the error class, which
    ``SlotLagSensor.execute_complete`` raises again as that class; anything else (connection
    refused, bad credentials) is an error of the trigger and fails the task as it is.

    :param slot: replication slot name
    :param max_lag_bytes: largest acceptable lag in bytes
    :param postgres_conn_id: Airflow connection of the source database
    :param poll_interval: seconds between polls
    :param min_safe_wal_bytes: fail when ``safe_wal_size`` drops below this
    """

    def __init__(self, *, slot: str, max_lag_bytes: int, postgres_conn_id: str, poll_interval: float = 60.0,
                 min_safe_wal_bytes: int | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # airflow.triggers.base is not annotated
        self.slot = slot
        self.max_lag_bytes = int(max_lag_bytes)
        self.postgres_conn_id = postgres_conn_id
        self.poll_interval = float(poll_interval)
        self.min_safe_wal_bytes = None if min_safe_wal_bytes is None else int(min_safe_wal_bytes)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "slot": self.slot, "max_lag_bytes": self.max_lag_bytes, "postgres_conn_id": self.postgres_conn_id,
            "poll_interval": self.poll_interval, "min_safe_wal_bytes": self.min_safe_wal_bytes})

    async def poll(self) -> dict[str, Any]:
        from asgiref.sync import sync_to_async

        return await sync_to_async(poll_slot)(self.postgres_conn_id, self.slot, self.min_safe_wal_bytes)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        polls = 0
        while True:
            polls += 1
            try:
                status = await self.poll()
            except SlotError as exc:
                yield _event({"status": "error", "slot": self.slot, "error_type": type(exc).__name__,
                              "message": str(exc)})
                return
            if status["lag_bytes"] <= self.max_lag_bytes:
                self.log.info("slot %s: lag %d bytes is within %d after %d poll(s)", self.slot, status["lag_bytes"],
                              self.max_lag_bytes, polls)
                yield _event({"status": "success", "polls": polls, **status})
                return
            self.log.info("slot %s: lag %d bytes > %d (wal_status %s); polling again in %.0fs", self.slot,
                          status["lag_bytes"], self.max_lag_bytes, status["wal_status"], self.poll_interval)
            await asyncio.sleep(self.poll_interval)
