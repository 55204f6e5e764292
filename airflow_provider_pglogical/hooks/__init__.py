"""Hooks: PostgreSQL logical decoding slots and publications."""

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook, SlotInfo

__all__ = ["PgLogicalHook", "SlotInfo"]
