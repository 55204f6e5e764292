"""Hooks: PostgreSQL logical decoding slots and publications.

``PgLogicalClient`` (plain psycopg2) does the work; ``PgLogicalHook`` (which imports Airflow) wraps it
for DAG authors. Both are loaded on first use, so the small pure modules beside them (``slots``,
``sizes``, ``dsn``) stay cheap to import from specs and DAG files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
    from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient
    from airflow_provider_pglogical.hooks.slots import SlotInfo

__all__ = ["PgLogicalClient", "PgLogicalHook", "SlotInfo"]


def __getattr__(name: str) -> Any:
    if name == "PgLogicalHook":
        from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

        return PgLogicalHook
    if name == "PgLogicalClient":
        from airflow_provider_pglogical.hooks.slot_client import PgLogicalClient

        return PgLogicalClient
    if name == "SlotInfo":
        from airflow_provider_pglogical.hooks.slots import SlotInfo

        return SlotInfo
    raise AttributeError(name)
