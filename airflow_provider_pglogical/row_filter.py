"""Row filters read by PostgreSQL's own parser: checked by publication rules, deparsed into the only SQL we send.

A spec's ``row_filter`` is parsed once, at spec load, with libpg_query (``pglast``): the exact grammar
of the server, comments and quoting included. The tree must be one expression that a publication's
``WHERE`` would accept (``check_simple_rowfilter_expr_walker`` in publicationcmds.c): columns,
constants, built-in operators and types, immutable built-in functions, no subqueries, no system
columns. What the pipeline evaluates — the snapshot's ``WHERE`` on the source, the apply's filter in
Spark — is the tree deparsed (:attr:`RowFilter.sql`), never the text as written, so a comment or a
stray parenthesis can never change which rows an expression selects.

Without a catalog some of PostgreSQL's rules can only be judged by name: a function must be one of
:data:`IMMUTABLE_FUNCTIONS`, a type one of :data:`BUILTIN_TYPES`, an operator one of
:data:`BUILTIN_OPERATORS`. Errors name the construct and never a value of a row.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from pglast import ast, parse_sql
from pglast.enums import A_Expr_Kind
from pglast.parser import ParseError
from pglast.stream import RawStream

from airflow_provider_pglogical.exceptions import RowFilterError
from airflow_provider_pglogical.text import backquoted

# The filter is parsed as the WHERE of this statement; anything else in the parsed statement (a
# second statement, FROM, UNION, ORDER BY, LIMIT ...) means the text was more than one expression.
_PREFIX = "SELECT 1 WHERE "
_BARE = parse_sql("SELECT 1")[0].stmt
# Nodes whose operands spark_sql parenthesizes when they are not atoms: where the two grammars' ranks could differ.
_OPERATORS: tuple[type[ast.Node], ...] = (ast.A_Expr, ast.BoolExpr, ast.NullTest, ast.BooleanTest, ast.TypeCast)
_OPERANDS = frozenset({"lexpr", "rexpr", "args", "arg"})  # their attributes holding operands (not names or types)
_ATOMS: tuple[type[ast.Node], ...] = (ast.ColumnRef, ast.A_Const, ast.FuncCall, ast.CoalesceExpr)

# PostgreSQL's system columns (pg_attribute attnum < 0); publications refuse them.
SYSTEM_COLUMNS = frozenset({"ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"})

# Immutable pg_catalog functions, by name (the SQL-standard forms TRIM, SUBSTRING, POSITION and
# LIKE ... ESCAPE parse to btrim, substring, position and like_escape). Stable ones (now, date_part on
# timestamptz, to_char, concat) are left out: a publication refuses them, their value depends on the session.
IMMUTABLE_FUNCTIONS = frozenset({
    "abs", "btrim", "ceil", "ceiling", "char_length", "character_length", "floor", "left", "length", "like_escape",
    "lower", "ltrim", "md5", "mod", "octet_length", "position", "replace", "right", "round", "rtrim", "sign",
    "starts_with", "strpos", "substr", "substring", "trunc", "upper",
})

# Built-in types a cast may name (as the parser spells them: integer is pg_catalog.int4).
BUILTIN_TYPES = frozenset({
    "bool", "bpchar", "bytea", "char", "date", "float4", "float8", "inet", "int2", "int4", "int8", "interval",
    "json", "jsonb", "name", "numeric", "oid", "text", "time", "timestamp", "timestamptz", "timetz", "uuid",
    "varchar",
})

# Built-in operators by symbol (comparison, arithmetic, text concatenation and pattern matching).
BUILTIN_OPERATORS = frozenset({
    "=", "<>", "!=", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "^", "||", "~~", "!~~", "~~*", "!~~*",
    "~", "!~", "~*", "!~*", "&", "|", "#", "<<", ">>", "@",
})

BUILTIN_COLLATIONS = frozenset({"C", "POSIX", "default", "ucs_basic"})

# Expression kinds allowed as they are (their children are checked in turn).
_PLAIN = (ast.A_Const, ast.TypeCast, ast.BoolExpr, ast.NullTest, ast.BooleanTest, ast.CaseExpr, ast.CaseWhen, ast.CoalesceExpr,
          ast.MinMaxExpr, ast.A_ArrayExpr, ast.RowExpr)
_EXPR_KINDS = frozenset({
    A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_OP_ANY, A_Expr_Kind.AEXPR_OP_ALL, A_Expr_Kind.AEXPR_DISTINCT,
    A_Expr_Kind.AEXPR_NOT_DISTINCT, A_Expr_Kind.AEXPR_NULLIF, A_Expr_Kind.AEXPR_IN, A_Expr_Kind.AEXPR_LIKE,
    A_Expr_Kind.AEXPR_ILIKE, A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN,
    A_Expr_Kind.AEXPR_BETWEEN_SYM, A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM,
})
_BETWEEN = frozenset({A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN, A_Expr_Kind.AEXPR_BETWEEN_SYM,
                      A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM})
_REFUSED = {
    ast.SubLink: "subqueries are not allowed",
    ast.ParamRef: "parameters are not allowed",
    ast.SQLValueFunction: "CURRENT_DATE, CURRENT_USER and the like are not immutable",
    ast.A_Indirection: "field selection and array subscripts are not allowed",
}


@dataclass(frozen=True)
class RowFilter:
    """A checked row filter: ``sql`` is its tree deparsed (what every evaluator gets), ``columns`` the
    columns it references (as the parser reads them: an unquoted name folded to lower case, a quoted one as written)."""

    sql: str
    columns: frozenset[str]


def parse_row_filter(text: str) -> RowFilter:
    """Parse and check a spec's row filter; RowFilterError when PostgreSQL's publication rules or the
    pipeline's refuse it, its message the reason alone (callers name the table)."""
    tree = parse_expression(text)
    columns: set[str] = set()
    for node in _walk(tree):
        _check(node, columns)
    return RowFilter(sql=_deparse(tree), columns=frozenset(columns))


def referenced_names(text: str) -> frozenset[str]:
    """The column names an expression references, as PostgreSQL's parser reads them, with no rule checked: the names
    the apply evaluates it over (``filters.apply_row_filter``) and keeps clear of its own (``planning``)."""
    found: set[str] = set()
    for node in _walk(parse_expression(text)):
        fields = node.fields or () if isinstance(node, ast.ColumnRef) else ()
        if len(fields) == 1 and isinstance(fields[0], ast.String):
            found.add(str(fields[0].sval))
    return frozenset(found)


def canonical(text: str) -> str:
    """One expression PostgreSQL wrote (a publication's ``pg_get_expr``) deparsed from its parse tree,
    without the spec rules: the server already enforced its own when the publication was created."""
    return _deparse(parse_expression(text))


def spark_sql(text: str) -> str:
    """The expression deparsed for Spark's SQL parser: as :func:`canonical`, every column name backtick-quoted
    (Spark reads ``"Val"`` as a string), so the case-sensitive session resolves the very name PostgreSQL's parser
    read: ``"Val"`` is column Val, ``Val`` column val. Every composite operand of an operator is parenthesized:
    Spark's grammar ranks operators otherwise (``||`` binds like ``+`` there, so ``t || (i - 1)`` printed without
    its parentheses would read ``(t || i) - 1``), and with every grouping explicit its ranks never matter."""
    tree = parse_expression(text)
    printed = _deparse(tree)
    # Holes stand for names and parenthesized operands while the deparser prints a node: a prefix absent from
    # the filter's text, so nothing of the filter itself is ever taken for one.
    prefix = next(p for k in itertools.count() if (p := f"pglogical_hole{k}_") not in printed)
    fills: list[str] = []

    def hole(fill: str) -> ast.ColumnRef:
        fills.append(fill)
        return ast.ColumnRef(fields=(ast.String(sval=f"{prefix}{len(fills) - 1}_"),))

    def holed(node: ast.Node) -> ast.Node:
        if isinstance(node, ast.ColumnRef) and len(fields := node.fields or ()) == 1 \
                and isinstance(fields[0], ast.String):
            return hole(backquoted(str(fields[0].sval)))
        operator = isinstance(node, _OPERATORS)
        for name in getattr(type(node), "__slots__", ()):  # pglast: attribute name -> C type, in order
            value, operands = getattr(node, name), operator and name in _OPERANDS
            if isinstance(value, ast.Node):
                setattr(node, name, operand(value) if operands else holed(value))
            elif isinstance(value, (list, tuple)):
                setattr(node, name, tuple(operand(v) if operands else holed(v) if isinstance(v, ast.Node) else v
                                          for v in value))
        return node

    def operand(node: ast.Node) -> ast.Node:
        return holed(node) if isinstance(node, _ATOMS) else hole(f"({text_of(node)})")

    def text_of(node: ast.Node) -> str:
        sql = str(RawStream()(holed(node)))
        return re.sub(re.escape(prefix) + r"(\d+)_", lambda m: fills[int(m.group(1))], sql)

    return text_of(tree)


def fold_hint(unknown: Sequence[str], columns: Collection[str]) -> str:
    """What follows an error naming filter names a table lacks, for each name matching columns apart from case
    (``: region matches "Region" apart from case: ...``); empty when none does (a plain typo). An unquoted name
    folds to lower case, so the way out is quoting the column as spelled; a quoted one keeps its case, so for a
    lower-case column the way out is dropping the quotes. Every matching spelling is listed (a table may have
    Val and VAL)."""
    hints = []
    for name in unknown:
        same = sorted(c for c in columns if c.lower() == name.lower() and c != name)
        if not same:
            continue
        spelled = ", ".join(c if c == name.lower() and _reads_unquoted(c) else f'"{c}"' for c in same)
        if name == name.lower():
            hints.append(f"{name} matches {spelled} apart from case: unquoted names fold to lower case, as in "
                         "PostgreSQL; quote the column as spelled")
            continue
        cased = [c for c in same if not (c == name.lower() and _reads_unquoted(c))]
        way = ("drop the quotes" if not cased else f"drop the quotes for {name.lower()} or quote the column as spelled"
               if len(cased) < len(same) else "quote the column as spelled")
        hints.append(f'"{name}" matches {spelled} apart from case: quoted names keep their case, as in PostgreSQL; {way}')
    return "".join(("; " if i else ": ") + h for i, h in enumerate(hints))


def _reads_unquoted(column: str) -> bool:
    """Whether ``column`` written without quotes is read as that column (not a keyword, a blank or a symbol)."""
    try:
        tree = parse_expression(f"{column} IS NULL")
    except RowFilterError:
        return False
    arg = getattr(tree, "arg", None)
    return isinstance(arg, ast.ColumnRef) and _names(arg.fields) == [column]


def conjunction(filters: Sequence[str | None]) -> str | None:
    """``(a) AND (b)``: each a deparsed expression, parenthesized on its own; None when there are none."""
    parts = [f for f in filters if f]
    return " AND ".join(f"({f})" for f in parts) if parts else None


def disjunction(filters: Sequence[str]) -> str:
    """``(a) OR (b)`` of deparsed expressions (a single one is returned as it is)."""
    return filters[0] if len(filters) == 1 else " OR ".join(f"({f})" for f in filters)


def parse_expression(text: str) -> ast.Node:
    """The filter's expression tree as the ``WHERE`` of ``SELECT 1 WHERE <text>`` (the one place filter text is
    parsed); RowFilterError when it does not parse or is more than one expression."""
    try:
        stmts = parse_sql(_PREFIX + text)
    except ParseError as exc:
        # args: (message, index in the parsed text); the index is made relative to the filter
        message = str(exc.args[0]) if exc.args else "syntax error"
        index = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], int) else -1
        at = f" (at character {index - len(_PREFIX) + 1})" if index >= len(_PREFIX) else ""
        raise RowFilterError(f"does not parse: {message}{at}") from None
    stmt = stmts[0].stmt if len(stmts) == 1 else None
    if not isinstance(stmt, ast.SelectStmt) or stmt.whereClause is None:
        raise RowFilterError("must be a single expression")
    where = stmt.whereClause
    stmt.whereClause = None
    if stmt != _BARE or not isinstance(where, ast.Node):  # "true ORDER BY 1", "true UNION SELECT 1", ...
        raise RowFilterError("must be a single expression")
    return where


def _deparse(tree: ast.Node) -> str:
    sql = str(RawStream()(tree))
    # The deparser is PostgreSQL-grammar aware; still, what we send must read back as the same tree.
    if parse_expression(sql) != tree:
        raise RowFilterError("cannot be written back unambiguously")
    return sql


def _walk(node: object) -> Iterator[ast.Node]:
    """Every node of the tree, parents first."""
    stack: list[object] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif isinstance(item, ast.Node):
            yield item
            slots = getattr(type(item), "__slots__", ())  # pglast: attribute name -> C type, in order
            stack.extend(getattr(item, name) for name in reversed(list(slots)) if name != "location")


def _names(parts: object) -> list[str]:
    return [str(p.sval) for p in parts or () if isinstance(p, ast.String)]  # type: ignore[attr-defined]


def _builtin(names: list[str]) -> str | None:
    """The unqualified name when ``names`` is unqualified or in pg_catalog; None otherwise."""
    if len(names) == 1 or (len(names) == 2 and names[0] == "pg_catalog"):
        return names[-1]
    return None


def _check(node: ast.Node, columns: set[str]) -> None:  # noqa: C901 - one branch per node kind, as the walker
    if isinstance(node, ast.ColumnRef):
        fields = node.fields or ()
        if len(fields) != 1 or not isinstance(fields[0], ast.String):
            raise RowFilterError("only columns of the table itself may be referenced (no table "
                                 "qualification or *)")
        column = str(fields[0].sval)
        if column in SYSTEM_COLUMNS:
            raise RowFilterError(f"system column {column} is not allowed")
        columns.add(column)  # a quoted name as written, an unquoted one folded (Spark gets it backtick-quoted)
    elif isinstance(node, ast.A_Expr):
        if node.kind not in _EXPR_KINDS:
            kind = node.kind.name.removeprefix("AEXPR_") if node.kind is not None else "operator"
            raise RowFilterError(f"{kind} expressions are not allowed")
        op = _builtin(_names(node.name))
        if node.kind not in _BETWEEN and op not in BUILTIN_OPERATORS:  # BETWEEN's name is its keyword
            raise RowFilterError(f"operator {'.'.join(_names(node.name))} is not a built-in operator")
    elif isinstance(node, ast.FuncCall):
        name = _builtin(_names(node.funcname))
        if name not in IMMUTABLE_FUNCTIONS:
            raise RowFilterError(f"function {'.'.join(_names(node.funcname))} is not allowed (only "
                                 "immutable built-in functions)")
        if node.agg_order or node.agg_filter or node.over or node.agg_star or node.agg_distinct \
                or node.agg_within_group or node.func_variadic:
            raise RowFilterError(f"function {name} is called as an aggregate, window or variadic")
    elif isinstance(node, ast.TypeName):  # of a cast
        names = _names(node.names)
        if _builtin(names) not in BUILTIN_TYPES or node.setof or node.pct_type:
            raise RowFilterError(f"type {'.'.join(names)} is not a built-in type")
    elif isinstance(node, ast.CollateClause):
        if _builtin(_names(node.collname)) not in BUILTIN_COLLATIONS:
            raise RowFilterError(f"collation {'.'.join(_names(node.collname))} is not a built-in "
                                 "collation")
    elif isinstance(node, (ast.String, ast.Integer, ast.Float, ast.Boolean, ast.BitString)):
        pass  # names and constants' values inside the nodes above
    elif type(node) in _REFUSED:
        raise RowFilterError(f"{_REFUSED[type(node)]}")
    elif not isinstance(node, _PLAIN):
        raise RowFilterError(f"{type(node).__name__} expressions are not allowed (only columns, "
                             "constants, built-in operators and types, and immutable built-in functions)")
