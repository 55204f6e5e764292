"""Operators: drain a pgoutput slot into staging (decode) and apply staged batches with Spark (apply)."""

from __future__ import annotations

from typing import Any

from airflow_provider_pglogical.operators.decode import PgLogicalDecodeOperator, table_asset

__all__ = ["PgLogicalApplyOperator", "PgLogicalDecodeOperator", "table_asset"]


def __getattr__(name: str) -> Any:
    # Lazy: the apply operator pulls in the Spark provider, which decode-only workers do not need.
    if name == "PgLogicalApplyOperator":
        from airflow_provider_pglogical.operators.apply import PgLogicalApplyOperator

        return PgLogicalApplyOperator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
