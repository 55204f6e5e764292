"""Delta Lake's column names are case-insensitive by its protocol (case-preserving; delta-rs refuses a schema with
``"Val"`` and ``val``), where PostgreSQL's are case-sensitive: a table that would need two columns differing only by
case is refused before any table of the batch commits, so the watermarks stay where they are."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_provider_pglogical.exceptions import CaseInsensitiveNamesError


def case_clashes(columns: Sequence[str]) -> list[tuple[str, ...]]:
    """The groups of ``columns`` whose names are equal up to case (each in the given order), in first-seen order."""
    groups: dict[str, list[str]] = {}
    for name in columns:
        groups.setdefault(name.lower(), []).append(name)
    return [tuple(group) for group in groups.values() if len(group) > 1]


def check_case_distinct(where: str, target: str, columns: Sequence[str]) -> None:
    """``CaseInsensitiveNamesError`` when two of ``columns`` (a Delta table's, its own columns included) differ only by
    case; the way out (``columns:`` leaving one out, or a target keeping both) is named."""
    clashes = case_clashes(columns)
    if clashes:
        names = "; ".join(" and ".join(f'"{c}"' for c in group) for group in clashes)
        raise CaseInsensitiveNamesError(
            f"{where}: {target} would need columns {names}, which differ only by case: Delta Lake's column names are "
            "case-insensitive; leave one out with the table's `columns:`, or apply it to a PostgreSQL or Iceberg "
            "target, which keep both", table=target, columns=tuple(c for group in clashes for c in group))
