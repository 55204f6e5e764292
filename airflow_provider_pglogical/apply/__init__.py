"""Spark apply of staged pgoutput changes with PostgreSQL publication semantics (row filters, column lists, TRUNCATE)."""

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig

__all__ = ["ApplyConfig", "TableApplyConfig"]
