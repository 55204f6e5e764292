"""How a snapshot combines several publications' column lists and row filters for one table (pure)."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.exceptions import SnapshotError
from airflow_provider_pglogical.snapshot.source import published_columns, published_row_filter

COLUMNS = ("id", "a", "secret", "b")


def test_row_filters_are_ored_each_once_and_a_publication_without_one_copies_every_row():
    assert published_row_filter(["(id > 10)"]) == "id > 10"  # deparsed from its parse tree
    assert published_row_filter(["(id > 10)", "(b < 3)"]) == "(id > 10) OR (b < 3)"
    assert published_row_filter(["(id > 10)", "(id > 10)"]) == "id > 10"  # tablesync's DISTINCT
    assert published_row_filter(["(id > 10)", None]) is None
    assert published_row_filter([None, "(b < 3)"]) is None
    assert published_row_filter([]) is None


def test_column_lists_must_agree_and_a_publication_without_one_publishes_every_column():
    assert published_columns("public.t", COLUMNS, [None]) == set(COLUMNS)
    assert published_columns("public.t", COLUMNS, [()]) == set(COLUMNS)  # PostgreSQL 15: attnames NULL/empty
    assert published_columns("public.t", COLUMNS, [("id", "a", "b"), ("b", "a", "id")]) == {"id", "a", "b"}
    # 16+: attnames lists every column when there is no list; generated columns are not in COLUMNS
    assert published_columns("public.t", COLUMNS, [None, (*COLUMNS, "gen")]) == set(COLUMNS)
    with pytest.raises(SnapshotError, match="cannot use different column lists for table public.t"):
        published_columns("public.t", COLUMNS, [("id", "a"), None])
    with pytest.raises(SnapshotError, match="different column lists"):
        published_columns("public.t", COLUMNS, [("id", "a"), ("id", "b")])
