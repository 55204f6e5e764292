"""Row filters: validate a PostgreSQL-style WHERE expression by its parse tree, evaluate it per image, transform UPDATEs."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from airflow_provider_pglogical.apply.batches import META
from airflow_provider_pglogical.exceptions import RowFilterError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Catalyst node classes whose Spark semantics coincide with PostgreSQL's for the values we stage
# (three-valued logic, NULL propagation). Division is absent on purpose: 7 / 2 is 3 in
# PostgreSQL and 3.5 in Spark.
ALLOWED_NODES = frozenset({
    "And", "Or", "Not", "EqualTo", "EqualNullSafe", "LessThan", "LessThanOrEqual", "GreaterThan",
    "GreaterThanOrEqual", "IsNull", "IsNotNull", "In", "Like", "ILike", "Add", "Subtract",
    "Multiply", "Remainder", "UnaryMinus", "UnaryPositive", "Literal", "UnresolvedAttribute",
    "Cast", "Concat",
})
# Functions (parsed as UnresolvedFunction) with identical semantics in both systems.
ALLOWED_FUNCTIONS = frozenset({"between", "lower", "upper", "length", "abs", "coalesce"})
_DOUBLE_QUOTE_OUTSIDE_STRING = re.compile(r"""^(?:[^'"]|'(?:[^']|'')*')*\"""")


def referenced_columns(spark: SparkSession, expression: str) -> frozenset[str]:
    """Column names the expression references; RowFilterError when it leaves the supported subset."""
    if _DOUBLE_QUOTE_OUTSIDE_STRING.match(expression):
        # Spark reads "x" as a string literal, PostgreSQL as an identifier: refuse the ambiguity.
        raise RowFilterError("row filter: double-quoted identifiers are not supported")
    parser = spark._jsparkSession.sessionState().sqlParser()
    try:
        tree = parser.parseExpression(expression)
    except Exception as exc:  # py4j wraps Spark's ParseException
        raise RowFilterError("row filter: invalid expression (does not parse)") from exc
    columns: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        kind = node.getClass().getSimpleName()
        if kind == "UnresolvedAttribute":
            parts = [node.nameParts().apply(i) for i in range(node.nameParts().size())]
            if len(parts) != 1:
                raise RowFilterError(f"row filter: qualified column reference {'.'.join(parts)} is not supported")
            columns.add(parts[0].lower())
            continue
        if kind == "UnresolvedFunction":
            name = node.nameParts().last().lower()
            if name not in ALLOWED_FUNCTIONS:
                raise RowFilterError(f"row filter: function {name} is not supported")
        elif kind not in ALLOWED_NODES:
            raise RowFilterError(f"row filter: {kind} expressions are not supported")
        children = node.children().iterator()
        while children.hasNext():
            stack.append(children.next())
    return frozenset(columns)


# Column types (format_type text) whose staged form compares, computes and casts like PostgreSQL
# in the supported expressions. Left out, because their staged form would give another answer:
# unconstrained numeric (exact text), money (minor units), enums (sorted by label, not by enum
# order), bpchar (trailing blanks), interval/timetz (structs), json/jsonb/inet/bytea/arrays and
# domains (name does not tell the base type). Text compares by bytes, i.e. as the C collation.
_FILTERABLE_TYPE = re.compile(
    r"(smallint|integer|bigint|real|double precision|boolean|numeric\(\d+,\d+\)|date|oid|uuid|name|text"
    r"|character varying(\(\d+\))?|timestamp(\(\d\))? with(out)? time zone)")


def validate_row_filter(spark: SparkSession, expression: str, *, table: str, columns: Sequence[str],
                        identity: Sequence[str], replica_identity: str, actions: Sequence[str],
                        types: Mapping[str, str | None] | None = None) -> frozenset[str]:
    """Check a filter as PostgreSQL would when the publication is created; returns the referenced columns.

    The replica-identity rule (filter columns of a table whose UPDATE/DELETE are applied must be in
    its replica identity) is PostgreSQL's DML-time check: it is judged when such a change arrives
    (``planning.update_delete_problem``), so insert-only tables pass. ``identity``,
    ``replica_identity`` and ``actions`` are kept for callers and that later check.

    ``types`` (column → SQL type name): every referenced column must be of a type the filter
    evaluates exactly on staged values (``_FILTERABLE_TYPE``); others are refused up front
    rather than filtered differently from PostgreSQL.
    """
    refs = referenced_columns(spark, expression)
    known = {c.lower() for c in columns}
    unknown = sorted(refs - known)
    if unknown:
        raise RowFilterError(f"row filter of {table} references unknown column(s) {', '.join(unknown)}")
    if types is not None:
        by_name = {c.lower(): t for c, t in types.items()}
        unsupported = sorted(f"{c} ({by_name.get(c) or 'unknown type'})" for c in refs
                             if not _FILTERABLE_TYPE.fullmatch(by_name.get(c) or ""))
        if unsupported:
            raise RowFilterError(
                f"row filter of {table} references column(s) {', '.join(unsupported)} whose staged values do not "
                "compare like PostgreSQL's; filters support integer, float, boolean, numeric(p,s), date, timestamp, "
                "text/varchar, name, uuid and oid columns")
    return refs


def _match(df: DataFrame, image: str, expression: str, columns: Sequence[str], out: str) -> DataFrame:
    """Add boolean column ``out``: the filter over ``image``'s fields, NULL counted as false."""
    img = df[META + image]
    temp = df.select("*", *[img.getField(c).alias(c) for c in columns])
    temp = temp.withColumn(out, F.coalesce(F.expr(expression), F.lit(False)))
    return temp.drop(*columns)


def apply_row_filter(expression: str | None, columns: Sequence[str]) -> Callable[[DataFrame], DataFrame]:
    """Step: drop or transform changes by the filter (pgoutput_row_filter, semantics §6).

    INSERT keeps on the new image, DELETE on the old; an UPDATE with an old image becomes
    nothing / INSERT / DELETE / UPDATE by (old, new) match, one without an old image keeps on the
    new image only. Run after ``resolve_toast_from_old`` so the new image holds identity values
    pgoutput copies over from the old tuple before evaluating.
    """

    def step(df: DataFrame) -> DataFrame:
        if not expression:
            return df
        m = _match(_match(df, "old", expression, columns, META + "old_match"), "new", expression, columns,
                   META + "new_match")
        op, om, nm, has_old = F.col(META + "op"), F.col(META + "old_match"), F.col(META + "new_match"), \
            F.col(META + "old").isNotNull()
        new_op = (F.when(op == "I", F.when(nm, F.lit("I")))
                  .when(op == "D", F.when(om, F.lit("D")))
                  .when(~has_old, F.when(nm, F.lit("U")))
                  .when(om & nm, F.lit("U"))
                  .when(nm, F.lit("I"))
                  .when(om, F.lit("D")))
        return (m.withColumn(META + "op", new_op).where(F.col(META + "op").isNotNull())
                .drop(META + "old_match", META + "new_match"))

    return step
