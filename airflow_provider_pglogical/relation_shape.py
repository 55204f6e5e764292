"""What every record of a relation's shape answers alike: its column names and its replica identity columns.

Shared by the decoder's ``RelationSchema`` and the staging reader's ``RelationInfo``, which must not
import each other's package (the apply reads staging without the decoder). Pure, no imports.
"""

from __future__ import annotations

from typing import Protocol


class ShapeColumn(Protocol):
    """A column of a relation record: ``ColumnDef`` (decoded) or ``RelationColumn`` (staged)."""

    @property
    def name(self) -> str: ...

    @property
    def is_identity(self) -> bool: ...  # part of the replica identity


class RelationShape:
    """Mixin of a relation record (a frozen dataclass with ``columns`` in relation order)."""

    __slots__ = ()
    columns: tuple[ShapeColumn, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def identity_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.is_identity)
