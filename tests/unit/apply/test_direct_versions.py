"""Table-batches staged under several schema versions of one table, netted in this process (``apply/versions.py``
then ``published.publish`` and ``kernels.compact_changes``) against Spark's net frame of the same batch
(``batches.read_changes``' union, then ``transforms``): random batches of 2–3 versions — a column dropped and
re-added, one added with a fast default of a random type (rows staged before the ADD COLUMN read it, in the new and
full old images), ``integer`` → ``bigint``, ``real`` → ``double precision`` and ``numeric(10,2)`` →
``numeric(12,4)`` widened, an ``oid`` every version holds with a fast default of its own (added long before, never
read) — with repeated keys, key changes, unchanged-TOAST values, key-only and full old images; half the examples
unfiltered with every action published, the others a random row filter over columns some versions lack (the
widened ``real``, the dropped and the added column among them; a filter over the ``oid`` leaves the batch to Spark)
and/or a subset of the actions. The direct rule must hand every other such batch over (``direct.batch_files``),
and its net rows must be Spark's: kinds, keep lists (a column an UPDATE's version lacks is kept, also along a key
change), values and every column's union type as Spark types it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import from_arrow_type

from airflow_provider_pglogical.apply import batches as spark_batches
from airflow_provider_pglogical.apply import direct, versions
from airflow_provider_pglogical.apply.batches import Batch, list_batches, read_relations
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.staged_arrow import spark_type
from airflow_provider_pglogical.apply.targets.base import PlannedTable, from_column
from airflow_provider_pglogical.apply.transforms import KEEP, KIND, LSN, TOUCHED
from airflow_provider_pglogical.exceptions import ApplyError
from tests.support.case_union import CASE, LSN_STRIDE, by_case, shifted, tagged, union_branches, with_case
from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch

KEY = ("id",)
CASES_PER_EXAMPLE = 6
MAX_EXAMPLES = 10
# The added column's (Arrow type, PostgreSQL type, attmissingval, value drawn for rows that have it).
DEFAULTS: list[tuple[pa.DataType, str, str, Callable[[st.DrawFn], Any]]] = [
    (pa.int64(), "bigint", "{7}", lambda draw: draw(st.integers(-2, 2))),
    (pa.int16(), "smallint", "{-7}", lambda draw: draw(st.integers(-2, 2))),
    (pa.int32(), "integer", "{7}", lambda draw: draw(st.integers(-2, 2))),
    (pa.float32(), "real", "{1.5}", lambda draw: draw(st.integers(-4, 4)) / 4),
    (pa.float64(), "double precision", "{-0.25}", lambda draw: draw(st.integers(-4, 4)) / 4),
    (pa.string(), "text", '{"a \\"b"}', lambda draw: draw(st.text("ab", max_size=2))),
    (pa.bool_(), "boolean", "{t}", lambda draw: draw(st.booleans())),
    (pa.date32(), "date", "{2024-01-02}", lambda draw: dt.date(2024, 1, draw(st.integers(1, 3)))),
    (pa.decimal128(10, 2), "numeric", "{1.50}", lambda draw: decimal.Decimal(draw(st.integers(0, 9))) / 4),
    (pa.binary(), "bytea", "{\\\\x01}", lambda draw: draw(st.binary(max_size=2))),  # no exact cast: NULL
]


def _versions(draw: st.DrawFn, replica_identity: str) -> tuple[list[Rel], dict[str, Callable[[st.DrawFn], Any]]]:
    """2–3 versions of ``public.v``: ``w`` integer, ``r`` real and ``n`` numeric(10,2) until they may widen (bigint,
    double precision, numeric(12,4)), ``o`` an oid of every version whose fast default no row reads, ``d`` text
    present or dropped per version (so dropped and re-added), ``f`` added with a fast default at some later
    version."""
    count = draw(st.integers(2, 3))
    widen_at = draw(st.integers(2, count + 1))
    add_at = draw(st.integers(2, count))  # v1 always lacks f: the versions differ
    has_d = [draw(st.booleans()) for _ in range(count)]
    f_arrow, f_type, f_missing, f_value = draw(st.sampled_from(DEFAULTS))
    rels = []
    for v in range(1, count + 1):
        wide = v >= widen_at
        columns = [Col("id", pa.int64(), "bigint", True),
                   Col("w", pa.int64() if wide else pa.int32(), "bigint" if wide else "integer"),
                   Col("r", pa.float64() if wide else pa.float32(), "double precision" if wide else "real"),
                   Col("n", pa.decimal128(12, 4) if wide else pa.decimal128(10, 2), "numeric"),
                   Col("o", pa.uint32(), "oid", missing="{7}")]
        if has_d[v - 1]:
            columns.append(Col("d", pa.string(), "text"))
        if v >= add_at:
            columns.append(Col("f", f_arrow, f_type, missing=f_missing))
        rels.append(Rel("public", "v", tuple(columns), replica_identity=replica_identity, version=v))
    values = {"w": lambda draw: draw(st.one_of(st.none(), st.integers(-3, 3))),
              "r": lambda draw: draw(st.one_of(st.none(), st.integers(-3, 3).map(lambda i: i / 4))),
              "n": lambda draw: draw(st.one_of(st.none(), st.integers(-3, 3).map(lambda i: decimal.Decimal(i) / 4))),
              "o": lambda draw: draw(st.one_of(st.none(), st.integers(0, 3))),
              "d": lambda draw: draw(st.one_of(st.none(), st.text("xy", max_size=2))),
              "f": lambda draw: None if draw(st.integers(0, 3)) == 0 else f_value(draw)}
    return rels, values


def _changes(draw: st.DrawFn, rel: Rel, values: dict[str, Callable[[st.DrawFn], Any]], commit0: int) -> list[Chg]:
    """One version's changes over a few keys (repeated, moved, deleted and inserted again, duplicated)."""
    full = rel.replica_identity == "f"
    names = [c.name for c in rel.columns]

    def row(n: int) -> dict[str, Any]:
        return {"id": n, **{c: values[c](draw) for c in names if c != "id"}}

    pool = st.integers(1, 4)
    out: list[Chg] = []
    for i in range(draw(st.integers(0, 6))):
        if out and draw(st.integers(0, 8)) == 0:
            out.append(draw(st.sampled_from(out)))  # the same change staged twice
            continue
        commit, order = commit0 + i // 2, i % 2
        op = draw(st.sampled_from(["I", "U", "U", "U_moved", "D"]))
        toast = ("d",) if "d" in names and op != "I" and op != "D" and draw(st.booleans()) else ()
        if op == "I":
            out.append(Chg("I", commit, order, new=row(draw(pool))))
        elif op in ("U", "U_moved"):
            a = draw(pool)
            b = draw(pool) if op == "U_moved" else a
            new = {k: v for k, v in row(b).items() if k not in toast}
            if full:
                out.append(Chg("U", commit, order, old=row(a), new=new, toast=toast))
            elif a != b:
                out.append(Chg("U", commit, order, old={"id": a}, old_key_only=True, new=new, toast=toast))
            else:
                out.append(Chg("U", commit, order, new=new, toast=toast))
        else:
            n = draw(pool)
            out.append(Chg("D", commit, order, old=row(n) if full else {"id": n}, old_key_only=not full))
    return out


# Row filter terms over the columns every version holds (``id``; ``w`` and ``n`` widened between versions).
COMMON_TERMS = ["w > 0", "w IS NULL", "w % 2 = 0", "coalesce(w, 1) >= 0", "id <> 2", "id % 2 = 1", "n >= 0",
                "r IS NULL"]
# Terms over ``r`` once a version widened it to double precision (a ``real`` compared with an integer is Spark's).
WIDE_TERMS = ["r > 0", "r < 1"]
# Terms over ``o`` (an ``oid``: the in-process evaluator leaves it to Spark, so such a case is not netted here).
OID_TERMS = ["o = 2", "o IS NULL"]
# Terms over ``d`` (dropped and re-added: NULL in a version lacking it).
DROPPED_TERMS = ["d IS NULL", "d = 'x'", "d LIKE 'x%'", "length(d) < 2"]
# Terms over ``f`` by its type (its fast default in both images of a row staged before the ADD COLUMN).
ADDED_TERMS: dict[pa.DataType, list[str]] = {
    pa.int64(): ["f > 0", "f = 7"], pa.int16(): ["f < 0", "f = -7"], pa.int32(): ["f IS NULL", "f = 7"],
    pa.float32(): ["f IS NOT NULL"], pa.float64(): ["f > 0", "f IS NULL"], pa.string(): ["f LIKE 'a%'", "f < 'b'"],
    pa.bool_(): ["f", "NOT f", "f IS NULL"], pa.date32(): ["f IS NOT NULL"], pa.decimal128(10, 2): ["f > 1"],
}
ACTIONS = [("insert", "update", "delete"), ("insert", "update"), ("insert", "delete"), ("update", "delete"),
           ("insert",)]


def _publication(draw: st.DrawFn, rels: list[Rel]) -> TableApplyConfig:
    """No row filter and every action (half the examples: the unfiltered union), or a random filter over columns
    some versions lack and/or the published actions a random non-empty subset."""
    if draw(st.booleans()):
        return TableApplyConfig()
    have = {c.name: c.arrow for rel in rels for c in rel.columns}
    widened = pa.float64() in {c.arrow for rel in rels for c in rel.columns if c.name == "r"}
    terms = (COMMON_TERMS + OID_TERMS + (WIDE_TERMS if widened else []) + (DROPPED_TERMS if "d" in have else [])
             + ADDED_TERMS.get(have["f"], []))
    parts = draw(st.lists(st.sampled_from(terms), min_size=0, max_size=3))
    row_filter = None
    if parts:
        joined = f" {draw(st.sampled_from(['AND', 'OR']))} ".join(f"({t})" for t in parts)
        row_filter = f"NOT ({joined})" if draw(st.integers(0, 4)) == 0 else joined
    return TableApplyConfig(row_filter=row_filter, actions=draw(st.sampled_from(ACTIONS)))


@st.composite
def case_lists(draw: st.DrawFn) -> tuple[list[Rel], TableApplyConfig, list[list[list[Chg]]]]:
    """A table's versions, its publication and ``CASES_PER_EXAMPLE`` table-batches of changes, each a list per
    version in LSN order."""
    rels, values = _versions(draw, draw(st.sampled_from(["d", "f"])))
    config = _publication(draw, rels)
    cases = [[_changes(draw, rel, values, 10 + 20 * v) for v, rel in enumerate(rels)]
             for _ in range(CASES_PER_EXAMPLE)]
    return rels, config, cases


def _batch(root: Path, spec: BatchSpec) -> Batch:
    write_batch(root, "slot", spec)
    (batch,) = list_batches(str(root), "slot")
    return batch


def _planned(rels: list[Rel], batch: Batch, key: tuple[str, ...], config: TableApplyConfig | None = None
             ) -> PlannedTable:
    columns = tuple(dict.fromkeys(c.name for rel in rels for c in rel.columns))
    return PlannedTable(rels[0].name, rels[0].name, key, columns, read_relations(batch)[rels[0].name],
                        config or TableApplyConfig())


def _rows(batches: list[pa.RecordBatch]) -> list[tuple]:
    return sorted((tuple(r.values()) for b in batches for r in b.to_pylist()), key=repr)


def _example_rels(d_at: int | None, added: Col) -> list[Rel]:
    """Two versions of ``public.v`` (REPLICA IDENTITY FULL) as ``_versions`` draws them: ``d`` from version ``d_at``
    (None: never), ``added`` added at version 2, nothing widened."""
    common = (Col("id", pa.int64(), "bigint", True), Col("w", pa.int32(), "integer"), Col("r", pa.float32(), "real"),
              Col("n", pa.decimal128(10, 2), "numeric"), Col("o", pa.uint32(), "oid", missing="{7}"))
    return [Rel("public", "v", (*common, *([Col("d", pa.string(), "text")] if d_at is not None and v >= d_at
                                             else []), *([added] if v == 2 else [])), replica_identity="f", version=v)
            for v in (1, 2)]


def _row(n: int, w: int, **more: Any) -> dict[str, Any]:
    return {"id": n, "w": w, "r": 0.5, "n": decimal.Decimal("0.25"), "o": 1, **more}


# Row 1 inserted and deleted before ``f`` is added with ``DEFAULT 7``: its full old image reads 7 as on the source.
DELETED_BEFORE_ADD = _example_rels(None, Col("f", pa.int64(), "bigint", missing="{7}"))
# An UPDATE staged in a version lacking ``d`` whose old image fails ``w > 0`` and new one passes: an INSERT.
UPDATE_TO_INSERT = _example_rels(2, Col("f", pa.int32(), "integer", missing="{7}"))


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case_lists())
@example((DELETED_BEFORE_ADD, TableApplyConfig(row_filter="f = 7"),
          [[[Chg("I", 10, 0, new=_row(1, 1)), Chg("D", 11, 0, old=_row(1, 1)),
             Chg("U", 12, 0, old=_row(3, 1), new=_row(3, 2))],
            [Chg("I", 30, 0, new=_row(2, 2, f=7))]]] * CASES_PER_EXAMPLE))
@example((UPDATE_TO_INSERT, TableApplyConfig(row_filter="w > 0", actions=("insert", "update")),
          [[[Chg("I", 10, 0, new=_row(1, -1)), Chg("U", 11, 0, old=_row(1, -1), new=_row(1, 1))],
            [Chg("I", 30, 0, new=_row(2, 2, d="y", f=None))]]] * CASES_PER_EXAMPLE))
def test_a_table_batch_of_several_schema_versions_nets_in_process_as_spark_nets_it(spark, drawn) -> None:
    """``MAX_EXAMPLES`` examples of ``CASES_PER_EXAMPLE`` cases each, one Spark query per example over their union
    (``tests/support/case_union.py``: the case number joins the key; each version a file of every case's changes).
    A row filter makes that query several times dearer (Spark inlines each image's union struct into every
    reference of the filter), so the cases share one publication. A filter over the ``oid`` leaves every case to
    Spark (the evaluator does not read it): no query then."""
    rels, config, cases = drawn
    event(f"row filter: {config.row_filter is not None}, actions: {len(config.actions)}")
    with tempfile.TemporaryDirectory() as root:
        if config.row_filter is not None and any(t in config.row_filter for t in OID_TERMS):
            event("an oid in the row filter: left to Spark")
            for n, case in enumerate(cases):
                batch = _batch(Path(root) / f"case{n}", BatchSpec(0, LSN_STRIDE, {
                    rel: case[v] for v, rel in enumerate(rels)}))
                assert direct.batch_files(_planned(rels, batch, KEY, config), batch, None) is None, f"case {n}"
            return
        union = _batch(Path(root) / "union", BatchSpec(0, (len(cases) + 1) * LSN_STRIDE, {
            with_case(rel): [c for n, case in enumerate(cases) for c in tagged(case[v], n)]
            for v, rel in enumerate(rels)}))
        planned = _planned([with_case(r) for r in rels], union, (*KEY, CASE), config)
        event(union_branches(union, planned))
        frame = SparkBatchChanges(spark, union).net(planned)
        spark_rows = by_case((r.asDict() for r in frame.collect()), KEY)
        spark_types = dict(frame.dtypes)
        assert set(spark_rows) <= set(range(len(cases))), "Spark rows outside the compared cases"
        for n, case in enumerate(cases):
            batch = _batch(Path(root) / f"case{n}", BatchSpec(n * LSN_STRIDE, (n + 1) * LSN_STRIDE, {
                rel: shifted(case[v], n) for v, rel in enumerate(rels)}))
            table = _planned(rels, batch, KEY, config)
            net = direct.batch_files(table, batch, None)
            assert net is not None and net.compacted and net.union is not None, f"case {n}: not netted in process"
            batches = list(direct.compacted_batches(direct.staged_chunks(net.files), net))
            ours = {c: from_arrow_type(spark_type(batches[0].schema.field(f"c{i}").type)).simpleString()
                    for i, c in enumerate(table.columns)}
            assert ours == {c: spark_types[c] for c in table.columns}, "the union's types"
            rows = _rows(batches)
            assert rows == spark_rows.get(n, []), f"case {n}"
            parted = list(direct.compacted_batches(direct.staged_chunks(net.files), replace(net, partitions=2)))
            assert _rows(parted) == rows, f"case {n}: in key partitions"


@pytest.mark.parametrize(("types", "union"), [
    ([pa.int16(), pa.int32(), pa.int64()], pa.int64()),
    ([pa.float32(), pa.float64()], pa.float64()),
    ([pa.decimal128(10, 2), pa.decimal128(12, 4)], pa.decimal128(12, 4)),
    ([pa.decimal128(38, 0), pa.decimal128(10, 2)], None),  # Spark's union would round to 38 digits
    ([pa.int32(), pa.string()], None),  # Spark unions it as text
    ([pa.int32(), pa.float64()], None),
])
def test_a_union_widens_as_spark_widens_or_leaves_the_batch_to_spark(types, union) -> None:
    assert versions.widest(types) == union


def _two_versions(root: Path, added: Col) -> tuple[PlannedTable, Batch]:
    """A table-batch of ``public.v`` before and after ``added`` is added with its fast default (``Col.missing``)."""
    v1 = Rel("public", "v", (Col("id", pa.int64(), "bigint", True), Col("w", pa.int32(), "integer")), version=1)
    v2 = replace(v1, columns=(*v1.columns, added), version=2)
    batch = _batch(root, BatchSpec(0, 100, {v1: [Chg("I", 10, 0, new={"id": 1, "w": 1})],
                                            v2: [Chg("U", 20, 0, new={"id": 1, "w": 2, added.name: None})]}))
    return _planned([v1, v2], batch, KEY), batch


@pytest.mark.parametrize("added", [Col("f", pa.uint32(), "oid", missing="{7}"),
                                   Col("f", pa.decimal256(50, 2), "numeric", missing="{0.00}"),
                                   Col("f", pa.bool_(), "boolean", missing="{maybe}")])
def test_a_fast_default_spark_would_read_otherwise_leaves_the_batch_to_spark(tmp_path, added) -> None:
    """Spark reads unsigned integers widened and decimals of more than 38 digits as text, and casts only its own
    boolean words: a row of the version lacking such a column would not get Arrow's value, so Spark nets it."""
    table, batch = _two_versions(tmp_path, added)
    assert direct.batch_files(table, batch, None) is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=3), max_size=4), st.integers(0, 40))
def test_the_absent_column_is_its_reference(absent, n) -> None:
    assert versions.absent_column(absent, n).equals(versions.absent_column_reference(absent, n))


STAGED_TYPES = [pa.int16(), pa.int32(), pa.int64(), pa.uint32(), pa.uint64(), pa.float32(), pa.float64(),
                pa.decimal128(10, 2), pa.decimal256(38, 2), pa.decimal256(50, 2), pa.string(), pa.large_string(),
                pa.bool_(), pa.date32(), pa.binary(), pa.timestamp("us"), pa.timestamp("us", tz="UTC"),
                pa.time64("us"), pa.list_(pa.int32()), pa.struct([pa.field("a", pa.int32())])]


@pytest.mark.parametrize("dtype", STAGED_TYPES, ids=str)
@pytest.mark.parametrize("text", ["7", "NaN", "t", "2024-01-02", "2024-01-02 03:04:05"])
def test_a_default_is_filled_here_exactly_where_spark_fills_it(dtype, text) -> None:
    """A column a version lacks: Spark's reader fills the default where ``_castable_from_text`` of its Spark type
    holds; here ``from_text`` must then give a value or refuse the union (ValueError), never leave it null."""
    spark_fills = spark_batches._castable_from_text(from_arrow_type(spark_type(dtype), prefer_timestamp_ntz=True),
                                                    text)
    try:
        filled_or_refused = versions.from_text(dtype, text) is not None
    except ValueError:
        filled_or_refused = True
    assert filled_or_refused == spark_fills


def test_an_arrow_overflow_conforming_the_versions_is_a_typed_error_whose_way_out_is_spark(tmp_path, monkeypatch
                                                                                           ) -> None:
    table, batch = _two_versions(tmp_path, Col("f", pa.int64(), "bigint", missing="{7}"))
    net = direct.batch_files(table, batch, None)
    assert net is not None and net.union is not None and net.partitions == 1

    def overflowing(*_: object) -> pa.Array:  # what an image column of 2 GiB or more raises as it is combined
        raise pa.ArrowInvalid("offset overflow while concatenating arrays")

    monkeypatch.setattr(versions, "_image", overflowing)
    with pytest.raises(ApplyError, match=r"^public\.v: netting it in one piece \(0 staged changes\), .*"
                                         "PGLOGICAL_APPLY_INPROCESS_ROWS=0 to net such table-batches with Spark$"):
        list(direct.compacted_batches(direct.staged_chunks(net.files), net))
    monkeypatch.setenv(direct.ROWS_SWITCH, "0")  # the way out: the table-batch goes to Spark's transforms
    assert direct.batch_files(table, batch, None) is None


def test_a_full_old_image_staged_before_an_added_column_reads_its_fast_default_on_both_paths(spark, tmp_path
                                                                                               ) -> None:
    """REPLICA IDENTITY FULL, ``row_filter: "f = 5"``, ``f`` added with ``DEFAULT 5`` after row 1 was inserted and
    deleted and row 3 updated: on the source those rows read 5 in their old images too, so the DELETE is
    published (row 1 not left behind) and the UPDATE stays an UPDATE holding the default (not an INSERT of NULL)."""
    v1 = Rel("public", "v", (Col("id", pa.int64(), "bigint", True), Col("w", pa.int32(), "integer")),
             replica_identity="f", version=1)
    v2 = replace(v1, columns=(*v1.columns, Col("f", pa.int32(), "integer", missing="{5}")), version=2)
    batch = _batch(tmp_path, BatchSpec(0, 100, {
        v1: [Chg("I", 10, 0, new={"id": 1, "w": 1}), Chg("D", 11, 0, old={"id": 1, "w": 1}),
             Chg("U", 12, 0, old={"id": 3, "w": 1}, new={"id": 3, "w": 2})],
        v2: [Chg("I", 20, 0, new={"id": 2, "w": 2, "f": 5})]}))
    table = _planned([v1, v2], batch, KEY, TableApplyConfig(row_filter="f = 5"))
    expected = [("D", 1), ("I", 2, 2, 5), ("U", 3, 2, 5)]

    def kinds(rows: list[dict[str, Any]]) -> list[tuple]:
        return sorted((r[KIND], r["id"]) if r[KIND] == "D" else (r[KIND], r["id"], r["w"], r["f"]) for r in rows)

    net = direct.batch_files(table, batch, None)
    assert net is not None and net.compacted and net.union is not None
    names = [KIND, KEEP, LSN, from_column(0), TOUCHED, *table.columns]
    ours = [dict(zip(names, r.values(), strict=True)) for b in direct.compacted_batches(
        direct.staged_chunks(net.files), net) for r in b.to_pylist()]
    assert kinds(ours) == expected, "in process"
    assert kinds([r.asDict() for r in SparkBatchChanges(spark, batch).net(table).collect()]) == expected, "Spark"
