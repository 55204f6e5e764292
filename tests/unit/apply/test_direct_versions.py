"""Table-batches staged under several schema versions of one table, netted in this process (``apply/versions.py``
then ``kernels.compact_changes``) against Spark's net frame of the same batch (``batches.read_changes``' union, then
``transforms``): random batches of 2–3 versions — a column dropped and re-added, one added with a fast default of a
random type (rows staged before the ADD COLUMN read it), an ``integer`` widened to ``bigint`` — with repeated keys,
key changes, unchanged-TOAST values, key-only and full old images. The direct rule must hand every such batch over
(``direct.batch_files``), and its net rows must be Spark's: kinds, keep lists (a column an UPDATE's version lacks
is kept, also along a key change), values and the union's widest types.
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
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply import direct, versions
from airflow_provider_pglogical.apply.batches import Batch, list_batches, read_relations
from airflow_provider_pglogical.apply.changes import SparkBatchChanges
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.targets.base import PlannedTable
from tests.support.case_union import LSN_STRIDE, by_case, shifted, tagged, union_branches, with_case
from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch

KEY = ("id",)
CASES_PER_EXAMPLE = 4
# The added column's (Arrow type, PostgreSQL type, attmissingval, value drawn for rows that have it).
DEFAULTS: list[tuple[pa.DataType, str, str, Callable[[st.DrawFn], Any]]] = [
    (pa.int64(), "bigint", "{7}", lambda draw: draw(st.integers(-2, 2))),
    (pa.string(), "text", '{"a \\"b"}', lambda draw: draw(st.text("ab", max_size=2))),
    (pa.bool_(), "boolean", "{t}", lambda draw: draw(st.booleans())),
    (pa.date32(), "date", "{2024-01-02}", lambda draw: dt.date(2024, 1, draw(st.integers(1, 3)))),
    (pa.decimal128(10, 2), "numeric", "{1.50}", lambda draw: decimal.Decimal(draw(st.integers(0, 9))) / 4),
    (pa.binary(), "bytea", "{\\\\x01}", lambda draw: draw(st.binary(max_size=2))),  # no exact cast: NULL
]


def _versions(draw: st.DrawFn, replica_identity: str) -> tuple[list[Rel], dict[str, Callable[[st.DrawFn], Any]]]:
    """2–3 versions of ``public.v``: ``w`` integer until it may widen to bigint, ``d`` text present or dropped per
    version (so dropped and re-added), ``f`` added with a fast default at some later version."""
    count = draw(st.integers(2, 3))
    widen_at = draw(st.integers(2, count + 1))
    add_at = draw(st.integers(2, count))  # v1 always lacks f: the versions differ
    has_d = [draw(st.booleans()) for _ in range(count)]
    f_arrow, f_type, f_missing, f_value = draw(st.sampled_from(DEFAULTS))
    rels = []
    for v in range(1, count + 1):
        columns = [Col("id", pa.int64(), "bigint", True),
                   Col("w", pa.int64() if v >= widen_at else pa.int32(), "bigint" if v >= widen_at else "integer")]
        if has_d[v - 1]:
            columns.append(Col("d", pa.string(), "text"))
        if v >= add_at:
            columns.append(Col("f", f_arrow, f_type, missing=f_missing))
        rels.append(Rel("public", "v", tuple(columns), replica_identity=replica_identity, version=v))
    values = {"w": lambda draw: draw(st.one_of(st.none(), st.integers(-3, 3))),
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


@st.composite
def case_lists(draw: st.DrawFn) -> tuple[list[Rel], list[list[list[Chg]]]]:
    """A table's versions and ``CASES_PER_EXAMPLE`` table-batches of changes, each a list per version in LSN order."""
    rels, values = _versions(draw, draw(st.sampled_from(["d", "f"])))
    cases = [[_changes(draw, rel, values, 10 + 20 * v) for v, rel in enumerate(rels)]
             for _ in range(CASES_PER_EXAMPLE)]
    return rels, cases


def _batch(root: Path, spec: BatchSpec) -> Batch:
    write_batch(root, "slot", spec)
    (batch,) = list_batches(str(root), "slot")
    return batch


def _planned(rels: list[Rel], batch: Batch, key: tuple[str, ...]) -> PlannedTable:
    columns = tuple(dict.fromkeys(c.name for rel in rels for c in rel.columns))
    return PlannedTable(rels[0].name, rels[0].name, key, columns, read_relations(batch)[rels[0].name],
                        TableApplyConfig())


def _rows(batches: list[pa.RecordBatch]) -> list[tuple]:
    return sorted((tuple(r.values()) for b in batches for r in b.to_pylist()), key=repr)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case_lists())
def test_a_table_batch_of_several_schema_versions_nets_in_process_as_spark_nets_it(spark, drawn) -> None:
    """12 examples of 4 cases each, one Spark query per example over their union (``tests/support/case_union.py``:
    the case number joins the key; each version a file of every case's changes)."""
    rels, cases = drawn
    with tempfile.TemporaryDirectory() as root:
        union = _batch(Path(root) / "union", BatchSpec(0, (len(cases) + 1) * LSN_STRIDE, {
            with_case(rel): [c for n, case in enumerate(cases) for c in tagged(case[v], n)]
            for v, rel in enumerate(rels)}))
        planned = _planned([with_case(r) for r in rels], union, (*KEY, "case_id"))
        event(union_branches(union, planned))
        frame = SparkBatchChanges(spark, union).net(planned)
        spark_rows = by_case((r.asDict() for r in frame.collect()), KEY)
        assert set(spark_rows) <= set(range(len(cases))), "Spark rows outside the compared cases"
        for n, case in enumerate(cases):
            batch = _batch(Path(root) / f"case{n}", BatchSpec(n * LSN_STRIDE, (n + 1) * LSN_STRIDE, {
                rel: shifted(case[v], n) for v, rel in enumerate(rels)}))
            table = _planned(rels, batch, KEY)
            net = direct.batch_files(table, batch, None)
            assert net is not None and net.compacted and net.union is not None, f"case {n}: not netted in process"
            batches = list(direct.compacted_batches(direct.staged_chunks(net.files), net))
            w = batches[0].schema.field(f"c{table.columns.index('w')}").type
            assert (w, dict(frame.dtypes)["w"]) in ((pa.int32(), "int"), (pa.int64(), "bigint")), "the union's type"
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


@pytest.mark.parametrize("dtype", [pa.uint32(), pa.decimal256(50, 2), pa.bool_()])
def test_a_fast_default_spark_would_read_otherwise_leaves_the_batch_to_spark(dtype) -> None:
    """Spark reads unsigned integers widened and decimals of more than 38 digits as text, and casts only its own
    boolean words: such a default gives no union (``union_of``: None, the Spark path)."""
    with pytest.raises(ValueError):
        versions.from_text(dtype, "maybe" if pa.types.is_boolean(dtype) else "7")
