"""Which target schema changes a source relation's new schema implies — pure, target-independent planning.

A source ``ALTER TABLE`` reaches the change stream only as a new Relation message (a new staged
schema version, ``relations.parquet``); the rows it rewrote on the source are not in the stream.
So a target can follow exactly the changes whose effect on existing rows is the default one:

* a new column: added to the target with its exact type. Rows older than the source's ``ADD COLUMN
  … DEFAULT x`` read ``x`` there; no change carries it, but the staged relation does (the column's
  ``attmissingval``, looked up when the batch was staged): the target adds the column with that
  default (then drops the default), and rows staged before the ``ADD COLUMN`` in the same batch
  get it too (``apply/batches.read_changes``). Without one (no default, a volatile default that
  rewrote the table, a rewrite since) older rows hold NULL (see docs/apply.md);
* a dropped column: the target keeps it (made nullable so inserts succeed). Changes of the
  schema versions that have it write it; later ones leave it alone (an UPDATE keeps the target's
  value, an INSERT leaves it NULL), as a native subscriber whose table keeps the column does. A
  column seen in any version of a batch is written, so one added and dropped inside one batch is
  added to the target too (with the type of the last version that has it);
* a lossless widening (``integer`` → ``bigint``, ``varchar(n)`` → ``text``, ``numeric(p,s)`` →
  ``numeric(p',s')`` with room for every old value, …): the target column is altered; the
  source's default conversion kept every value, and the target's keeps the same ones;
* a narrowing that keeps every value or fails on the source (``bigint`` → ``integer``,
  ``text`` → ``varchar(n)``, ``numeric(p,s)`` → ``numeric(p',s)``): every value the source now
  holds fits the target's wider column, which is kept as it is;
* a narrowing that rounds (``numeric(p,s)`` → fewer decimals, ``timestamp(6)`` → ``timestamp(3)``,
  ``double precision`` → ``real``): the source rounded its existing rows, which the stream does
  not show — a stop like any other type change (below). Seen inside a batch, or between batches
  through the relation state the previous batch left (``relation_state``, builtin types);
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
    # ``add`` only: the text of the value rows older than the source's ADD COLUMN read (its default).
    default: str | None = None
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


def rounds(old: str, new: str) -> bool:
    """Whether converting ``old`` to the narrower ``new`` rounds values (rather than keep them or fail)."""
    if old == "double precision":
        return new == "real"
    old_num, new_num = _numeric(old), _numeric(new)
    if old_num is not None and new_num is not None:
        return new_num[0] is not None and (old_num[0] is None or new_num[1] < old_num[1])
    old_p, new_p = _PRECISION.fullmatch(old), _PRECISION.fullmatch(new)
    if old_p and new_p and old_p.group(1) == new_p.group(1):
        return int(new_p.group(2) or 6) < int(old_p.group(2) or 6)
    return False


def narrows_exactly(old: str, new: str) -> bool:
    """Whether ``old`` → ``new`` is a narrowing under which the source kept every value (or refused)."""
    return widens(new, old) and not rounds(old, new)


# format_type text of the builtin types whose changes planning judges, from (type OID, typmod):
# what the decoder's relation state (no type names) gives for the shape before a batch.
_BUILTIN = {21: "smallint", 23: "integer", 20: "bigint", 700: "real", 701: "double precision", 25: "text",
            16: "boolean", 1082: "date"}
_WITH_PRECISION = {1114: ("timestamp", " without time zone"), 1184: ("timestamp", " with time zone"),
                   1083: ("time", " without time zone"), 1266: ("time", " with time zone")}


def builtin_type_name(oid: int, typmod: int) -> str | None:
    """``format_type(oid, typmod)`` for a few builtin types (numeric, integers, floats, text, varchar,
    times); None for the others."""
    if oid in _BUILTIN:
        return _BUILTIN[oid]
    if oid == 1700:
        if typmod < 4:
            return "numeric"
        t = typmod - 4
        return f"numeric({(t >> 16) & 0xFFFF},{((t & 0x7FF) ^ 1024) - 1024})"
    if oid == 1043:
        return "character varying" if typmod < 4 else f"character varying({typmod - 4})"
    if oid in _WITH_PRECISION:
        base, zone = _WITH_PRECISION[oid]
        return f"{base}{zone}" if typmod < 0 else f"{base}({typmod}){zone}"
    return None


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
    missing: Mapping[str, str] = field(default_factory=dict)  # name -> attmissingval literal ("{7}")


def missing_value(literal: str | None) -> str | None:
    """The element text of ``attmissingval``'s one-element array literal (``{7}`` → ``7``,
    ``{"a \\"b"}`` → ``a "b``, ``{"{1,2}"}`` → ``{1,2}``); None for none or a NULL element."""
    if literal is None or len(literal) < 2 or literal[0] != "{" or literal[-1] != "}":
        return None
    body = literal[1:-1]
    if not body.startswith('"'):
        return None if body.upper() == "NULL" or not body else body
    out, i = [], 1
    while i < len(body) and body[i] != '"':
        if body[i] == "\\" and i + 1 < len(body):
            i += 1
        out.append(body[i])
        i += 1
    return "".join(out)


def plan_column_changes(table: str, target_columns: Mapping[str, str], not_null_without_default: Iterable[str],
                        versions: Sequence[SourceVersion], written: Sequence[str], *,
                        policy: str = "follow") -> list[ColumnChange]:
    """The target changes that let a batch staged under ``versions`` (LSN order) be written to ``table``.

    ``target_columns`` are the target's column types now, ``written`` the columns the batch writes
    (those of every version, through the column list; a column takes the type of the last version
    that has it). Type changes between consecutive versions are
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
            if widens(old_type, new_type) or narrows_exactly(old_type, new_type):
                continue
            current = target_columns.get(name)
            if current is not None and current != old_type and widens(new_type, current):
                continue  # the user converted the target column already (how such a stop is resumed)
            raise _unfollowable(table, name, old_type, new_type, after.first_lsn)
    changes: list[ColumnChange] = []
    for name in written:
        last = _last_with(versions, name)
        new_type = last.columns.get(name) if last is not None else None
        old_type = target_columns.get(name)
        lsn = _first_seen(versions, name, new_type)
        if old_type is None:
            if new_type is None:
                raise SchemaChangeError(
                    f"target table {table} is missing replicated column {name}, and its type is unknown "
                    f"(LSN {format_lsn(lsn)}); add the column to the target, then run again",
                    table=table, column=name, old_type=None, new_type=None, lsn=lsn)
            default = missing_value(last.missing.get(name)) if last is not None else None
            changes.append(ColumnChange(ADD, name, None, new_type, default, lsn=lsn))
        elif new_type is None or widens(new_type, old_type):
            continue  # same type, or the target's column holds every value (a narrowing on the source)
        elif widens(old_type, new_type):
            changes.append(ColumnChange(WIDEN, name, old_type, new_type, lsn=lsn))
        else:
            raise _unfollowable(table, name, old_type, new_type, lsn)
    # Every column the source no longer has, written in this batch or not: rows inserted after the drop
    # leave it NULL.
    changes += [ColumnChange(RELAX, c, target_columns[c], None) for c in not_null_without_default
                if c in target_columns and c not in latest.columns]
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


def _last_with(versions: Sequence[SourceVersion], column: str) -> SourceVersion | None:
    """The last version that has ``column`` (the latest, unless the source dropped it since)."""
    return next((v for v in reversed(versions) if column in v.columns), None)


def _first_seen(versions: Sequence[SourceVersion], column: str, type_name: str | None) -> int:
    """First LSN of the run of versions, up to the last that has ``column``, in which it has ``type_name``
    (where it appeared with that type)."""
    upto = len(versions)
    while upto > 1 and column not in versions[upto - 1].columns:
        upto -= 1
    lsn = versions[upto - 1].first_lsn
    for v in reversed(versions[:upto]):
        if column not in v.columns or v.columns[column] != type_name:
            break
        lsn = v.first_lsn
    return lsn


def _unfollowable(table: str, column: str, old_type: str, new_type: str, lsn: int) -> SchemaChangeError:
    return SchemaChangeError(
        f"column {column} of {table} changed type from {old_type} to {new_type} at LSN {format_lsn(lsn)}, which is "
        f"not a lossless widening or an exact narrowing: the source converted its existing rows in a way the change "
        f"stream does not show. "
        f"Convert the target column as the source did (ALTER TABLE {table} ALTER COLUMN {column} TYPE {new_type} "
        f"USING ...), then run again: the batch applies once the target's type holds the new values (rows of this "
        f"batch staged before the change keep their old values converted by the target; `pglogical resync --table "
        f"{table}` copies the table anew instead)",
        table=table, column=column, old_type=old_type, new_type=new_type, lsn=lsn)
