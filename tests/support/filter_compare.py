"""Row-filter properties with Spark as the reference (``test_filter_eval.py``, ``test_filter_columns.py``): every
example's in-process answers first, then Spark's ``F.expr`` of the same texts for all of them in one query, one
query's fixed cost where each example paid its own (most of what an example of a few rows costs).

A disagreement, or a Spark error (ANSI mode raises where the evaluator would have refused), runs the property again
with the same seed, comparing example by example: the same examples come again, and hypothesis shrinks the first
that differs, reports it and keeps it in its database."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from airflow_provider_pglogical.row_filter import spark_sql

Covered = list[tuple[str, list[Any]]]  # the expressions evaluated in process, with the answer per row
Compare = Callable[[pa.Table, Covered], None]  # handed each example's image and covered expressions
# Runs a property (``@given``) under ``hypothesis.seed`` of its second argument, handing each example to its first.
ExamplesOf = Callable[[Compare, int], None]

# The apply's filter (``filters._match``) runs in a Spark with whole-stage code generation, Spark's default, whose
# generated code is another implementation than the per-expression one: the reference must be the apply's Spark.
WHOLE_STAGE_CODEGEN = {"spark.sql.codegen.wholeStage": "true"}


def compared_together(spark: Any, examples_of: ExamplesOf) -> None:
    """Fails with hypothesis's shrunk example of the seeded re-run example by example, the seed and the first
    disagreement of the one query noted on it."""
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "true", "the reference is Spark as the apply runs it"
    seed = random.getrandbits(64)
    examples: list[tuple[pa.Table, Covered]] = []
    examples_of(lambda table, covered: examples.append((table, covered)), seed)
    try:
        differing = _disagreements(examples, _spark_values(spark, examples))
    except (PySparkException, Py4JError) as error:
        differing = [f"Spark raised {type(error).__name__}: {str(error).splitlines()[0]}"]
    if differing:
        reproduced = (f"hypothesis.seed({seed}) reproduces the one query's {len(differing)} disagreement(s), "
                      f"the first: {differing[0]}")
        try:
            examples_of(lambda table, covered: _same_answers(spark, table, covered), seed)
        except Exception as shrunk:
            shrunk.add_note(reproduced)
            raise
        pytest.fail(f"not found again example by example: {reproduced}")


def _spark_values(spark: Any, examples: list[tuple[pa.Table, Covered]]) -> list[list[list[Any]]]:
    """Spark's answers per example, per covered expression, per row: every example's rows in one file (``x`` its
    example, ``n`` its row) and one query, each expression evaluated on its own example's rows only (``CASE WHEN``:
    a row of another example never reaches it)."""
    with tempfile.TemporaryDirectory() as root:
        pq.write_table(pa.concat_tables(
            table.append_column("n", pa.array(range(len(table)), pa.int64()))
                 .append_column("x", pa.array([x] * len(table), pa.int64()))
            for x, (table, _) in enumerate(examples)), f"{root}/rows.parquet")
        answers = [F.when(F.col("x") == x, F.expr(spark_sql(e))).alias(f"x{x}e{i}")
                   for x, (_, covered) in enumerate(examples) for i, (e, _) in enumerate(covered)]
        rows = sorted(spark.read.parquet(f"{root}/rows.parquet").select("x", "n", *answers).collect(),
                      key=lambda r: (r["x"], r["n"]))
    return [[[r[f"x{x}e{i}"] for r in rows if r["x"] == x] for i in range(len(covered))]
            for x, (_, covered) in enumerate(examples)]


def _disagreements(examples: list[tuple[pa.Table, Covered]], answers: list[list[list[Any]]]) -> list[str]:
    return [f"{expression}: in process {mine}, Spark {theirs}, rows {table.to_pylist()}"
            for (table, covered), example_answers in zip(examples, answers, strict=True)
            for (expression, mine), theirs in zip(covered, example_answers, strict=True) if mine != theirs]


def _same_answers(spark: Any, table: pa.Table, covered: Covered) -> None:
    assert not _disagreements([(table, covered)], _spark_values(spark, [(table, covered)])), covered
