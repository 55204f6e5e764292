"""Delta Lake's column names are case-insensitive by its protocol (case-preserving; delta-rs refuses a schema with
``"Val"`` and ``val``), where PostgreSQL's are case-sensitive: a table that would need two columns differing only by
case — or a composite column whose type has two such attributes, at any depth (arrays of composites too) — is
refused before any table of the batch commits, so the watermarks stay where they are."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa

from airflow_provider_pglogical.exceptions import CaseInsensitiveNamesError


def case_clashes(columns: Sequence[str]) -> list[tuple[str, ...]]:
    """The groups of ``columns`` whose names are equal up to case (each in the given order), in first-seen order."""
    groups: dict[str, list[str]] = {}
    for name in columns:
        groups.setdefault(name.lower(), []).append(name)
    return [tuple(group) for group in groups.values() if len(group) > 1]


def _nested_names(path: str, dtype: pa.DataType) -> Iterator[tuple[str, list[str]]]:
    """The path of every struct inside ``dtype`` (through lists and maps) with its field names."""
    if pa.types.is_struct(dtype):
        yield path, [f.name for f in dtype]
        for f in dtype:
            yield from _nested_names(f"{path}.{f.name}", f.type)
    elif pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        yield from _nested_names(f"{path}[]", dtype.value_type)
    elif pa.types.is_map(dtype):
        yield from _nested_names(f"{path}.key", dtype.key_type)
        yield from _nested_names(f"{path}.value", dtype.item_type)


def nested_clashes(types: Mapping[str, pa.DataType],
                   existing: Mapping[str, pa.DataType] | None = None) -> list[tuple[str, ...]]:
    """The groups of struct field names (as ``column.field`` paths) equal up to case within one struct of a column's
    staged type: a composite type's attributes ``"A"`` and ``a``. ``existing``: the Delta table's own types, whose
    struct fields stay beside those written into the same struct (an attribute the source renamed only by case,
    ``val`` to ``"Val"``, would need both); only the columns of ``types`` are checked."""
    fields: dict[str, dict[str, None]] = {}  # struct path → its field names, the table's first
    for source in (existing or {}, types):
        for column, dtype in source.items():
            if column in types:
                for path, names in _nested_names(column, dtype):
                    fields.setdefault(path, {}).update(dict.fromkeys(names))
    out: list[tuple[str, ...]] = []
    for path, held in fields.items():
        out.extend(tuple(f"{path}.{name}" for name in group) for group in case_clashes(list(held)))
    return out


def check_case_distinct(where: str, target: str, columns: Sequence[str],
                        types: Mapping[str, pa.DataType] | None = None,
                        existing: Mapping[str, pa.DataType] | None = None) -> None:
    """``CaseInsensitiveNamesError`` when two of ``columns`` (a Delta table's, its own columns included) differ only by
    case, or two fields of one struct in the staged ``types`` of the written columns do (with the fields the table's
    ``existing`` types hold there); the way out (``columns:`` leaving the column out, or a target keeping both) is
    named."""
    written = {c: t for c, t in (types or {}).items() if c in columns}
    clashes = case_clashes(columns) + nested_clashes(written, existing)
    if clashes:
        names = "; ".join(" and ".join(f'"{c}"' for c in group) for group in clashes)
        raise CaseInsensitiveNamesError(
            f"{where}: {target} would need columns {names}, which differ only by case: Delta Lake's column names are "
            "case-insensitive; leave one out with the table's `columns:` (a composite's whole column), or apply it to "
            "a PostgreSQL or Iceberg target, which keep both", table=target,
            columns=tuple(c for group in clashes for c in group))
