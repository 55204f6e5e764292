"""Column names Spark would parse (``"a.b"`` reads as a struct field access, ``"c d"`` as text) go through the
Spark transforms as plain names: the net, ordered and published frames of a batch with such columns carry the
source's values, as the in-process path (``direct.net_rows``) reads them from the staged file."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.apply import direct
from airflow_provider_pglogical.apply.batches import list_batches, read_relations
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.targets.base import PlannedTable
from airflow_provider_pglogical.apply.targets.postgres.copytext import copy_columns, copy_lines
from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch

# "a" is also a column: a name parsed as a.b would resolve to it (a struct access on an int: an error or a wrong value).
DOTTED = Rel("public", "dotted", (Col("id", pa.int32(), "integer", True), Col("a.b", pa.int32(), "integer"),
                                  Col("c d", pa.string(), "text"), Col("a", pa.int32(), "integer")))
# A later version: "e.f" added with a DEFAULT, "a.b" converted to text (its older values become text too).
DOTTED_V2 = Rel("public", "dotted", (DOTTED.columns[0], Col("a.b", pa.string(), "text"), *DOTTED.columns[2:],
                                     Col("e.f", pa.int32(), "integer", missing="{9}")), version=2)
COLUMNS = ("id", "a.b", "c d", "a")


def _row(i: int, ab: int | str, cd: str, a: int) -> dict[str, object]:
    return {"id": i, "a.b": ab, "c d": cd, "a": a}


CHANGES = [Chg("I", 10, 0, new=_row(1, 5, "x", 0)), Chg("I", 10, 1, new=_row(2, 6, "y", 0)),
           Chg("U", 11, 0, old={"id": 1}, old_key_only=True, new=_row(1, 7, "z", 0), toast=("c d",)),
           Chg("I", 12, 0, new=_row(3, -1, "w", 1)), Chg("U", 12, 1, old={"id": 2}, old_key_only=True,
                                                          new=_row(4, 8, "v", 0))]


def _table(batch, config: TableApplyConfig, columns=COLUMNS) -> PlannedTable:
    return PlannedTable(DOTTED.name, DOTTED.name, ("id",), columns, read_relations(batch)[DOTTED.name], config)


def test_dotted_and_spaced_column_names_keep_their_values_through_the_spark_transforms(spark, tmp_path) -> None:
    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {DOTTED: CHANGES}))
    (batch,) = list_batches(str(tmp_path), "slot")
    changes = SparkBatchChanges(spark, batch)
    net = changes.net(_table(batch, TableApplyConfig()))
    assert {tuple(r[c] for c in COLUMNS) for r in net.collect() if r["_pgl_kind"] != "D"} == {
        (1, 7, "x", 0), (3, -1, "w", 1), (4, 8, "v", 0)}  # row 1's "c d": its INSERT's, unchanged since
    ordered = changes.ordered(_table(batch, TableApplyConfig()))
    assert sorted(tuple(r[c] for c in ("a.b", "a")) for r in ordered.collect() if r["_pgl_kind"] != "D") == [
        (-1, 1), (5, 0), (6, 0), (7, 0), (8, 0)]
    # A row filter and a column list over the dotted names.
    filtered = changes.net(_table(batch, TableApplyConfig(row_filter='"a.b" > 0 AND "c d" <> \'y\'',
                                                          columns=("id", "a.b", "c d")), ("id", "a.b", "c d")))
    assert {tuple(r[c] for c in ("id", "a.b")) for r in filtered.collect() if r["_pgl_kind"] != "D"} == {(1, 7),
                                                                                                          (4, 8)}
    # Without a repeated key or a TOAST value, the in-process path nets the staged file itself: the same rows.
    plain = [c for c in CHANGES if c.op == "I"]
    write_batch(tmp_path, "plain", BatchSpec(0x1000, 0x2000, {DOTTED: plain}))
    (batch,) = list_batches(str(tmp_path), "plain")
    table = _table(batch, TableApplyConfig())
    found = direct.batch_files(table, batch, None)
    assert found is not None
    inprocess = {tuple(r[f"c{i}"] for i in range(len(COLUMNS))) for path in found.files
                 for b in direct.net_rows(pq.read_table(path, columns=["op", "lsn", "old", "new"]), found.key,
                                          found.columns) for r in b.to_pylist()}
    spark_rows = {tuple(r[c] for c in COLUMNS) for r in SparkBatchChanges(spark, batch).net(table).collect()}
    assert spark_rows == inprocess == {(1, 5, "x", 0), (2, 6, "y", 0), (3, -1, "w", 1)}


def test_a_dotted_column_added_with_a_default_reads_it_in_older_rows(spark, tmp_path) -> None:
    """Two schema versions: the older rows get the newer version's source default in ``"e.f"``, and their
    ``"a.b"`` as text."""
    write_batch(tmp_path, "slot", BatchSpec(0x1000, 0x2000, {DOTTED: [Chg("I", 10, 0, new=_row(1, 5, "x", 0))],
                                                             DOTTED_V2: [Chg("I", 11, 0, new={**_row(2, "six", "y", 0),
                                                                                            "e.f": 3})]}))
    (batch,) = list_batches(str(tmp_path), "slot")
    columns = (*COLUMNS, "e.f")
    net = SparkBatchChanges(spark, batch).net(_table(batch, TableApplyConfig(), columns))
    assert {tuple(r[c] for c in columns) for r in net.collect()} == {(1, "5", "x", 0, 9), (2, "six", "y", 0, 3)}


def test_the_copy_text_of_dotted_columns_is_their_values(spark) -> None:
    """The PostgreSQL writer's COPY text, built by Spark (``copy_lines``) or handed to Arrow (``copy_columns``)."""
    df = spark.createDataFrame([(1, 5, "x", 0)], "id int, `a.b` int, `c d` string, a int")
    assert [r.line for r in copy_lines(df).collect()] == ["1\t5\tx\t0"]
    frame, _fields = copy_columns(df)
    assert [tuple(r) for r in frame.collect()] == [(1, 5, "x", 0)]
