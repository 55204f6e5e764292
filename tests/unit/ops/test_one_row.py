"""one_row: the single row of a query that always returns one, or a typed error instead of indexing None."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_pglogical.exceptions import PgLogicalError
from airflow_provider_pglogical.hooks.cursor import one_row


class _Cursor:
    def __init__(self, row: tuple[Any, ...] | None) -> None:
        self.row = row

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.row


def test_the_row_a_cursor_holds_is_returned_as_it_is():
    assert one_row(_Cursor((1, "x"))) == (1, "x")


def test_a_cursor_without_a_row_raises_the_providers_error_not_a_type_error():
    with pytest.raises(PgLogicalError, match="returned none"):
        one_row(_Cursor(None))
