"""Row filters: validate a PostgreSQL-style WHERE expression by its parse trees (PostgreSQL's and Spark's parsers), evaluate it per image, transform UPDATEs."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from pglast import ast
from pglast.enums import A_Expr_Kind
from pyspark.sql import functions as F

from airflow_provider_pglogical.apply.filter_eval import covers
from airflow_provider_pglogical.apply.meta import META
from airflow_provider_pglogical.exceptions import ApplyError, RowFilterError
from airflow_provider_pglogical.row_filter import fold_hint, parse_expression, referenced_names, spark_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Operators (as PostgreSQL's parser names them) whose Spark semantics coincide with PostgreSQL's for the values
# we stage (three-valued logic, NULL propagation). Division is absent on purpose: 7 / 2 is 3 in PostgreSQL and
# 3.5 in Spark; so are the regular-expression, bit and power operators Spark reads otherwise or not at all.
ALLOWED_OPERATORS = frozenset({"=", "<>", "!=", "<", "<=", ">", ">=", "+", "-", "*", "%", "||", "~~", "!~~", "~~*", "!~~*"})
_ALLOWED_KINDS = frozenset({A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_IN, A_Expr_Kind.AEXPR_LIKE,
                            A_Expr_Kind.AEXPR_ILIKE, A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN,
                            A_Expr_Kind.AEXPR_DISTINCT, A_Expr_Kind.AEXPR_NOT_DISTINCT})
# Functions with identical semantics in both systems (COALESCE is a node of its own).
ALLOWED_FUNCTIONS = frozenset({"lower", "upper", "length", "abs"})
# Nodes allowed as they are: columns, constants, AND/OR/NOT, IS [NOT] NULL, IS [NOT] TRUE/FALSE, casts, COALESCE,
# and what they hold (names, constants' values).
_ALLOWED_NODES = (ast.ColumnRef, ast.A_Const, ast.BoolExpr, ast.NullTest, ast.BooleanTest, ast.TypeCast,
                  ast.TypeName, ast.CoalesceExpr, ast.String, ast.Integer, ast.Float, ast.Boolean)
_MISREAD = re.compile(r"['\\]|\$\{")


def referenced_columns(spark: SparkSession | None, expression: str) -> frozenset[str]:
    """Column names the expression references; RowFilterError when it leaves the supported subset.

    Judged on PostgreSQL's parse tree of the expression (``pglast``, as the spec's filters are), then parsed by
    the session's own SQL parser as the apply will evaluate it (``EXPLAIN`` of a query with it as its ``WHERE``:
    a parse error raises, nothing runs), through the DataFrame API only, so over Spark Connect too. ``spark``
    None: no Spark parse, for a filter of ``filter_eval``'s subset only (constructs Spark reads as PostgreSQL
    does, which this process evaluates: ``filter_eval.covers``).
    """
    try:
        where = parse_expression(expression)
        spark_text = spark_sql(expression)
    except RowFilterError as exc:
        raise RowFilterError(f"row filter: invalid expression ({exc})") from None
    columns = _walk(where)
    if spark is None:
        if not covers(expression):
            raise ApplyError("row filter: checked without Spark, but not evaluated in process")
        return frozenset(columns)
    try:
        spark.sql(f"EXPLAIN SELECT 1 WHERE {spark_text}").collect()
    except Exception as exc:  # Spark's ParseException (classic and Connect raise different classes)
        raise RowFilterError("row filter: invalid expression (Spark's parser does not read it)") from exc
    return frozenset(columns)


def _walk(tree: ast.Node) -> set[str]:
    """The columns ``tree`` references; RowFilterError at the first node outside the supported subset."""
    columns: set[str] = set()
    stack: list[object] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (list, tuple)):
            stack.extend(node)
            continue
        if not isinstance(node, ast.Node):
            continue
        if isinstance(node, ast.ColumnRef):
            fields = node.fields or ()
            if len(fields) != 1 or not isinstance(fields[0], ast.String):
                raise RowFilterError("row filter: qualified column reference or * is not supported")
            columns.add(str(fields[0].sval))  # as PostgreSQL's parser read it (quoted kept, unquoted folded)
            continue
        if isinstance(node, ast.A_Const) and isinstance(node.val, ast.String) and _MISREAD.search(str(node.val.sval)):
            # PostgreSQL's 'it''s' is "its" to Spark's parser, a backslash escapes there, ${…} is substituted.
            raise RowFilterError("row filter: a string constant holding a quote, a backslash or ${ is not supported "
                                 "(Spark's SQL reads it otherwise)")
        if isinstance(node, ast.A_Expr):
            name = ".".join(str(p.sval) for p in node.name or () if isinstance(p, ast.String))
            between = node.kind in (A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN)
            if node.kind not in _ALLOWED_KINDS or (not between and name not in ALLOWED_OPERATORS):
                raise RowFilterError(f"row filter: operator {name or node.kind} is not supported")
        elif isinstance(node, ast.FuncCall):
            names = [str(p.sval) for p in node.funcname or () if isinstance(p, ast.String)]
            name = names[-1].lower() if names and (len(names) == 1 or names[0] == "pg_catalog") else ".".join(names)
            if name not in ALLOWED_FUNCTIONS or node.agg_star or node.agg_distinct or node.over or node.agg_filter:
                raise RowFilterError(f"row filter: function {name} is not supported")
        elif not isinstance(node, _ALLOWED_NODES):
            raise RowFilterError(f"row filter: {type(node).__name__} expressions are not supported")
        slots = getattr(type(node), "__slots__", ())
        stack.extend(getattr(node, attr) for attr in slots if attr != "location")
    return columns


# Column types (format_type text) whose staged form compares, computes and casts like PostgreSQL
# in the supported expressions. Left out, because their staged form would give another answer:
# unconstrained numeric (exact text), money (minor units), enums (sorted by label, not by enum
# order), bpchar (trailing blanks), interval/timetz (structs), json/jsonb/inet/bytea/arrays and
# domains (name does not tell the base type). Text compares by bytes, i.e. as the C collation.
_FILTERABLE_TYPE = re.compile(
    r"(smallint|integer|bigint|real|double precision|boolean|numeric\(\d+,\d+\)|date|oid|uuid|name|text"
    r"|character varying(\(\d+\))?|timestamp(\(\d\))? with(out)? time zone)")


def validate_row_filter(spark: SparkSession | None, expression: str, *, table: str, columns: Sequence[str],
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
    unknown = sorted(refs - set(columns))  # exact, as PostgreSQL's: "Val" is not val
    if unknown:
        raise RowFilterError(f"row filter of {table} references unknown column(s) {', '.join(unknown)}"
                             f"{fold_hint(unknown, columns)}")
    if types is not None:
        unsupported = sorted(f"{c} ({types.get(c) or 'unknown type'})" for c in refs
                             if not _FILTERABLE_TYPE.fullmatch(types.get(c) or ""))
        if unsupported:
            raise RowFilterError(
                f"row filter of {table} references column(s) {', '.join(unsupported)} whose staged values do not "
                "compare like PostgreSQL's; filters support integer, float, boolean, numeric(p,s), date, timestamp, "
                "text/varchar, name, uuid and oid columns")
    return refs


def _match(df: DataFrame, image: str, expression: str, columns: Sequence[str], out: str) -> DataFrame:
    """Add boolean column ``out``: the filter over ``image``'s fields ``columns`` (those it references), NULL counted
    as false. Only those sit beside the working columns while it is evaluated: a staged column the table's column
    list leaves out may be named like one of them (``_pgl_op``), and dropping it by name would drop both."""
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

    # Deparsed for Spark: every name backtick-quoted as PostgreSQL's parser read it (``Val > 1`` reads column val,
    # ``"Val" > 1`` column Val), which the session's case-sensitive resolution then finds exactly.
    text = spark_sql(expression) if expression else None
    referenced = referenced_names(expression) if expression else frozenset()
    named = [c for c in columns if c in referenced]

    def step(df: DataFrame) -> DataFrame:
        if not text:
            return df
        m = _match(_match(df, "old", text, named, META + "old_match"), "new", text, named, META + "new_match")
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
