"""Which target schema changes a source relation's new schema implies — pure, target-independent planning.

A source ``ALTER TABLE`` reaches the change stream only as a new Relation message (a new staged
schema version, ``relations.parquet``); the rows it rewrote on the source are not in the stream.
So a target can follow exactly the changes whose effect on existing rows is the default one:

* a new column: added to the target with its exact type. Existing rows hold NULL there; a
  (non-volatile) ``DEFAULT`` of the source's ``ADD COLUMN`` is not in the stream (see docs/apply.md);
* a dropped column: stops being written; the target keeps it (made nullable so inserts succeed);
* a lossless widening (``integer`` → ``bigint``, ``varchar(n)`` → ``text``, ``numeric(p,s)`` →
  ``numeric(p',s')`` with room for every old value, …): the target column is altered; the
  source's default conversion kept every value, and the target's keeps the same ones;
* a narrowing (``bigint`` → ``integer``, …): every value the source now holds fits the target's
  wider column, which is kept as it is;
* anything else (``integer`` → ``text``, ``timestamp`` → ``timestamptz``, …): existing rows changed
  on the source by a conversion the stream does not show, so the batch stops with
  ``SchemaChangeError`` naming table, column, both types and the LSN.

Renames: staged schema versions carry column names and positions, not attribute numbers, and a
rename is indistinguishable from dropping the last column and adding one of the same type — so a
rename is followed as drop + add (the old column kept, no longer written; the new one added).

Targets execute the plan (``ColumnChange``) in their own dialect inside the batch's transaction;
the PostgreSQL target renders it as ``ALTER TABLE``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from airflow_provider_pglogical.exceptions import SchemaChangeError, format_lsn

ADD, WIDEN, RELAX = "add", "widen", "drop_not_null"


@dataclass(frozen=True)
class ColumnChange:
    """One change of one target column: ``add`` (``new_type``), ``widen`` (``old_type`` → ``new_type``), or
    ``drop_not_null`` (a column the source no longer has, kept in the target)."""

    kind: str
    column: str
    old_type: str | None
    new_type: str | None
    # First LSN of the staged schema version that asks for the change (for a target's own refusal).
    lsn: int | None = field(default=None, compare=False)


# Integer ranges as digits before the decimal point a numeric(p,s) needs to hold them all.
_INT_DIGITS = {"smallint": 5, "integer": 10, "bigint": 19}
_INT_ORDER = ("smallint", "integer", "bigint")
_NUMERIC = re.compile(r"numeric(?:\((\d+)(?:,(\d+))?\))?")
_VARCHAR = re.compile(r"character varying(?:\((\d+)\))?")
_PRECISION = re.compile(r"(timestamp|time|interval)(?:\((\d)\))?( with(?:out)? time zone)?")
_BITS = re.compile(r"bit varying(?:\((\d+)\))?")


def _numeric(t: str) -> tuple[int | None, int] | None:
    """(precision, scale) of a numeric type; precision None = unconstrained."""
    m = _NUMERIC.fullmatch(t)
    if not m:
        return None
    if m.group(1) is None:
        return None, 0
    return int(m.group(1)), int(m.group(2) or 0)


def widens(old: str, new: str) -> bool:
    """Whether every value of type ``old`` converts to ``new`` without loss (format_type names).

    Equal types widen trivially. Arrays widen by their element type.
    """
    if old == new:
        return True
    if old.endswith("[]") and new.endswith("[]"):
        return widens(old[:-2], new[:-2])
    if old in _INT_DIGITS:
        if new in _INT_DIGITS:
            return _INT_ORDER.index(new) >= _INT_ORDER.index(old)
        num = _numeric(new)
        return num is not None and (num[0] is None or num[0] - num[1] >= _INT_DIGITS[old])
    if old == "real":
        return new == "double precision"
    old_num, new_num = _numeric(old), _numeric(new)
    if old_num is not None and new_num is not None:
        if new_num[0] is None:
            return True
        if old_num[0] is None:
            return False
        return new_num[1] >= old_num[1] and new_num[0] - new_num[1] >= old_num[0] - old_num[1]
    text_like = {"text", "character varying"}
    old_vc, new_vc = _VARCHAR.fullmatch(old), _VARCHAR.fullmatch(new)
    if (old_vc or old == "text") and new in text_like:
        return True
    if old_vc and new_vc and new_vc.group(1) is not None:
        return old_vc.group(1) is not None and int(new_vc.group(1)) >= int(old_vc.group(1))
    old_p, new_p = _PRECISION.fullmatch(old), _PRECISION.fullmatch(new)
    if old_p and new_p and old_p.group(1) == new_p.group(1) and old_p.group(3) == new_p.group(3):
        if new_p.group(2) is None:
            return True
        return old_p.group(2) is not None and int(new_p.group(2)) >= int(old_p.group(2))
    old_b, new_b = _BITS.fullmatch(old), _BITS.fullmatch(new)
    if old_b and new_b:
        return new_b.group(1) is None or (old_b.group(1) is not None and int(new_b.group(1)) >= int(old_b.group(1)))
    return False


@dataclass(frozen=True)
class SourceVersion:
    """One staged schema version of a source table: where it was first seen and its column types."""

    first_lsn: int
    columns: Mapping[str, str | None]  # name -> format_type (None: unknown), relation order


def plan_column_changes(table: str, target_columns: Mapping[str, str], not_null_without_default: Iterable[str],
                        versions: Sequence[SourceVersion], written: Sequence[str], *,
                        policy: str = "follow") -> list[ColumnChange]:
    """The target changes that let a batch staged under ``versions`` (LSN order) be written to ``table``.

    ``target_columns`` are the target's column types now, ``written`` the columns the batch writes
    (the latest version's, through the column list). Type changes between consecutive versions are
    judged in LSN order (a change no target can follow stops, unless the target column was already
    converted to hold the new type); then each written column against the target. With ``policy="fail"`` any
    change the target would need raises ``SchemaChangeError``; so does, always, a change no target
    can follow (see the module docstring). Never includes row values.
    """
    if not versions:
        return []
    latest = versions[-1]
    for before, after in zip(versions, versions[1:], strict=False):
        for name, new_type in after.columns.items():
            old_type = before.columns.get(name)
            if old_type is None or new_type is None or old_type == new_type:
                continue
            if widens(old_type, new_type) or widens(new_type, old_type):
                continue
            current = target_columns.get(name)
            if current is not None and current != old_type and widens(new_type, current):
                continue  # the user converted the target column already (how such a stop is resumed)
            raise _unfollowable(table, name, old_type, new_type, after.first_lsn)
    changes: list[ColumnChange] = []
    for name in written:
        new_type = latest.columns.get(name)
        old_type = target_columns.get(name)
        lsn = _first_seen(versions, name, new_type)
        if old_type is None:
            if new_type is None:
                raise SchemaChangeError(
                    f"target table {table} is missing replicated column {name}, and its type is unknown "
                    f"(LSN {format_lsn(lsn)}); add the column to the target, then run again",
                    table=table, column=name, old_type=None, new_type=None, lsn=lsn)
            changes.append(ColumnChange(ADD, name, None, new_type, lsn))
        elif new_type is None or widens(new_type, old_type):
            continue  # same type, or the target's column holds every value (a narrowing on the source)
        elif widens(old_type, new_type):
            changes.append(ColumnChange(WIDEN, name, old_type, new_type, lsn))
        else:
            raise _unfollowable(table, name, old_type, new_type, lsn)
    written_set = set(written)
    changes += [ColumnChange(RELAX, c, target_columns[c], None) for c in not_null_without_default
                if c in target_columns and c not in written_set and c not in latest.columns]
    if changes and policy == "fail":
        first = changes[0]
        what = {ADD: f"new column {first.column} ({first.new_type})",
                WIDEN: f"column {first.column} widened from {first.old_type} to {first.new_type}",
                RELAX: f"column {first.column} dropped on the source (NOT NULL in the target)"}[first.kind]
        lsn = _first_seen(versions, first.column, first.new_type)
        raise SchemaChangeError(
            f"source schema of {table} changed: {what} (LSN {format_lsn(lsn)}) and schema_changes is fail; "
            "change the target table to match (or set schema_changes: follow), then run again",
            table=table, column=first.column, old_type=first.old_type, new_type=first.new_type, lsn=lsn)
    return changes


def _first_seen(versions: Sequence[SourceVersion], column: str, type_name: str | None) -> int:
    """First LSN of the trailing run of versions in which ``column`` has ``type_name`` (where it appeared)."""
    lsn = versions[-1].first_lsn
    for v in reversed(versions):
        if column not in v.columns or v.columns[column] != type_name:
            break
        lsn = v.first_lsn
    return lsn


def _unfollowable(table: str, column: str, old_type: str, new_type: str, lsn: int) -> SchemaChangeError:
    return SchemaChangeError(
        f"column {column} of {table} changed type from {old_type} to {new_type} at LSN {format_lsn(lsn)}, which is "
        f"not a lossless widening: the source converted its existing rows in a way the change stream does not show. "
        f"Convert the target column as the source did (ALTER TABLE {table} ALTER COLUMN {column} TYPE {new_type} "
        f"USING ...), then run again: the batch applies once the target's type holds the new values",
        table=table, column=column, old_type=old_type, new_type=new_type, lsn=lsn)
