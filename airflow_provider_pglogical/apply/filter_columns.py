"""Row filters evaluated over whole Arrow columns: ``filter_eval``'s subset, compiled to ``pyarrow.compute``.

``filter_eval`` is the reference: a per-row Python evaluator whose answers are the Spark path's (its docstring
lists the covered subset). At millions of changes its per-row calls dominate a filtered batch, so
``compile_matcher`` compiles the same parse tree a second time, to kernels over whole columns, for the part of
the subset whose columnar answer is exactly the per-row one, and keeps the per-row evaluator for the rest:

* columns of integer, floating-point, boolean and string images (decimal, date and timestamp columns, and
  decimal constants, are evaluated per row: Python's ``Decimal`` and ``datetime`` are the reference's values,
  and a date beyond Python's years leaves a batch to Spark there);
* SQL's three-valued logic as Arrow's nulls: ``AND``/``OR`` are Kleene's, a comparison with a null is null, a
  filter selects a row only where it is TRUE;
* integer ``+ - *``, unary ``-`` and ``abs`` with Arrow's checked kernels in the result type of the reference
  (the wider operand; literals are int4), so a result out of range raises ``NotCovered`` as the reference does;
  ``%`` truncated (the dividend's sign, as PostgreSQL and Java), a zero divisor ``NotCovered``;
* floats in Spark's order (NaN equal to NaN and above every number, -0.0 equal to 0.0), an integer compared
  with a double rounded to double first;
* strings compared byte-wise in UTF-8 (code-point order, Spark's binary order, the reference's ``str`` order);
  ``length`` in code points; ``lower``/``upper`` and ``ILIKE`` on ASCII values only, ``LIKE`` on values of the
  Basic Multilingual Plane only (``NotCovered`` otherwise, as the reference); a LIKE pattern as an anchored RE2
  expression whose literal characters are written as code points (``\\x{…}``).

Every subexpression is evaluated over every row, as the reference does, so a value it refuses raises here too:
both raise ``NotCovered`` on the same images (``tests/unit/apply/test_filter_columns.py`` compares them on random
filters and images, and with Spark on fewer).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pglast import ast
from pglast.enums import A_Expr_Kind, BoolExprType, NullTestType

from airflow_provider_pglogical.apply import filter_eval, kernels
from airflow_provider_pglogical.apply.filter_eval import BOOL, NULL, TEXT, NotCovered
from airflow_provider_pglogical.exceptions import RowFilterError
from airflow_provider_pglogical.row_filter import parse_expression

Kind = filter_eval.Kind
# One subexpression over the referenced columns (by name) of ``n`` rows: an Arrow array of ``n`` values.
Columns = Mapping[str, Any]  # pa.Array or pa.ChunkedArray: the kernels take either
ColumnEval = Callable[[Columns, int], Any]
Image: TypeAlias = pa.StructArray | pa.ChunkedArray  # a staged image column, in one piece or in its row groups' chunks

_INT_TYPES = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}
_CHECKED = {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked}
_BEYOND_BMP = "[\\x{10000}-\\x{10FFFF}]"


class _Unexact(Exception):
    """A construct whose columnar answer is not proven to be the reference's: the filter is evaluated per row."""


@dataclass(frozen=True)
class Matcher:
    """A filter for one image schema: over whole columns where ``columnar`` is set, else per row (``reference``)."""

    reference: filter_eval.CompiledFilter
    columnar: ColumnEval | None

    @property
    def columns(self) -> tuple[str, ...]:
        """The image fields the filter reads."""
        return self.reference.columns

    def evaluate(self, image: Image) -> pa.Array | pa.ChunkedArray:
        """The filter over each row of ``image`` (a null image has null fields): true, false or null (NULL)."""
        n = len(image)
        if self.columnar is None or n == 0:
            whole = image.combine_chunks() if isinstance(image, pa.ChunkedArray) else image
            return pa.array(self.reference.evaluate(whole), pa.bool_())
        result = self.columnar(kernels.fields(image, self.columns), n)  # the image's nulls applied to its fields
        return result.cast(pa.bool_()) if result.type == pa.null() else result

    def matches(self, image: Image) -> np.ndarray:
        """Which rows the filter selects: NULL counts as false (pgoutput's rule)."""
        return kernels.mask(self.evaluate(image))


def compile_matcher(expression: str, fields: Mapping[str, pa.DataType]) -> Matcher:
    """The filter for images whose fields have these Arrow types; NotCovered outside ``filter_eval``'s subset."""
    return _compile(expression, tuple(fields.items()))


@lru_cache(maxsize=256)
def _compile(expression: str, fields: tuple[tuple[str, pa.DataType], ...]) -> Matcher:
    reference = filter_eval.compile_filter(expression, dict(fields))  # NotCovered decides first, as it did
    try:
        kind, columnar = _Compiler(dict(fields)).node(parse_expression(expression))
    except (_Unexact, RowFilterError):
        return Matcher(reference, None)
    if kind[0] not in ("bool", "null"):
        return Matcher(reference, None)
    return Matcher(reference, columnar)


def _arrow_type(kind: Kind) -> pa.DataType:
    family = kind[0]
    if family == "int":
        return _INT_TYPES[kind[1]]
    if family == "float":
        return pa.float64() if kind[1] == 64 else pa.float32()
    if family == "text":
        return pa.string()
    if family == "bool":
        return pa.bool_()
    if family == "null":
        return pa.null()
    raise _Unexact(f"a {family} value")


def _as(values: pa.Array, dtype: pa.DataType) -> pa.Array:
    """``values`` as ``dtype``: the NULL literal's nulls, or a widening of integers or floats (exact)."""
    return values if values.type == dtype else values.cast(dtype)


def _bools(values: pa.Array) -> pa.Array:
    return _as(values, pa.bool_())


def _any(mask: pa.Array) -> bool:
    return bool(pc.any(mask).as_py())


class _Compiler:
    """The parse tree → (type, columnar function), mirroring ``filter_eval._Compiler`` node by node."""

    def __init__(self, fields: dict[str, pa.DataType]) -> None:
        self.fields = fields

    def node(self, node: Any) -> tuple[Kind, ColumnEval]:
        if isinstance(node, ast.ColumnRef):
            return self.column(node)
        if isinstance(node, ast.A_Const):
            return self.constant(node)
        if isinstance(node, ast.BoolExpr):
            return self.boolean(node)
        if isinstance(node, ast.NullTest):
            _, arg = self.node(node.arg)
            test = pc.is_null if node.nulltesttype == NullTestType.IS_NULL else pc.is_valid
            return BOOL, lambda cols, n: test(arg(cols, n))
        if isinstance(node, ast.CoalesceExpr):
            return self.coalesce(node)
        if isinstance(node, ast.FuncCall):
            return self.function(node)
        if isinstance(node, ast.A_Expr):
            return self.expression(node)
        raise _Unexact(type(node).__name__)

    def column(self, node: ast.ColumnRef) -> tuple[Kind, ColumnEval]:
        field = str((node.fields or ())[0].sval)  # the reference checked it: one field name, matched exactly
        kind = filter_eval.kind_of(self.fields[field])
        if kind is None or kind[0] not in ("int", "float", "bool", "text"):
            raise _Unexact("a decimal, date or timestamp column")
        dtype = _arrow_type(kind)
        return kind, lambda cols, n: _as(cols[field], dtype)  # large_string → string: the same values

    @staticmethod
    def constant(node: ast.A_Const) -> tuple[Kind, ColumnEval]:
        kind, value_of = filter_eval.constant(node)
        if kind[0] not in ("int", "bool", "text", "null"):
            raise _Unexact("a decimal constant")
        value, dtype = value_of(()), _arrow_type(kind)
        if value is None:
            return kind, lambda cols, n: pa.nulls(n, dtype)
        return kind, lambda cols, n: pa.repeat(pa.scalar(value, dtype), n)

    def boolean(self, node: ast.BoolExpr) -> tuple[Kind, ColumnEval]:
        fns = [fn for _, fn in (self.node(a) for a in node.args or ())]
        if node.boolop == BoolExprType.NOT_EXPR:
            (arg,) = fns
            return BOOL, lambda cols, n: pc.invert(_bools(arg(cols, n)))
        combine = pc.and_kleene if node.boolop == BoolExprType.AND_EXPR else pc.or_kleene

        def fold(cols: Columns, n: int) -> pa.Array:
            return functools.reduce(combine, [_bools(fn(cols, n)) for fn in fns])
        return BOOL, fold

    def coalesce(self, node: ast.CoalesceExpr) -> tuple[Kind, ColumnEval]:
        args = [self.node(a) for a in node.args or ()]
        kind = functools.reduce(filter_eval.common, [k for k, _ in args], NULL)
        dtype = _arrow_type(kind)

        def first(cols: Columns, n: int) -> pa.Array:
            values = [_as(fn(cols, n), dtype) for _, fn in args]
            return values[0] if kind == NULL else pc.coalesce(*values)
        return kind, first

    def function(self, node: ast.FuncCall) -> tuple[Kind, ColumnEval]:
        name = str((node.funcname or ())[-1].sval).lower()
        kind, arg = self.node((node.args or ())[0])
        if name in ("lower", "upper"):
            fold = pc.ascii_lower if name == "lower" else pc.ascii_upper

            def case(cols: Columns, n: int) -> pa.Array:
                values = _as(arg(cols, n), pa.string())
                if _any(pc.invert(pc.string_is_ascii(values))):
                    raise NotCovered("a non-ASCII value under a case mapping")
                return fold(values)
            return TEXT, case
        if name == "length":
            return ("int", 32), lambda cols, n: _as(pc.utf8_length(_as(arg(cols, n), pa.string())), pa.int32())
        # abs: integers checked in their type, floats as they are (-0.0 and NaN compare as the reference's)
        if kind == NULL:
            return kind, arg
        dtype = _arrow_type(kind)
        absolute = pc.abs_checked if kind[0] == "int" else pc.abs
        return kind, lambda cols, n: _checked(absolute, _as(arg(cols, n), dtype))

    def expression(self, node: ast.A_Expr) -> tuple[Kind, ColumnEval]:
        name = ".".join(str(p.sval) for p in node.name or () if isinstance(p, ast.String))
        k = node.kind
        if k == A_Expr_Kind.AEXPR_OP:
            if node.lexpr is None:  # unary minus of an integer
                kind, arg = self.node(node.rexpr)
                dtype = _arrow_type(kind) if kind[0] == "int" else pa.int64()
                return kind, lambda cols, n: _checked(pc.negate_checked, _as(arg(cols, n), dtype))
            if name in filter_eval.COMPARISONS:
                return self.compare(name, node.lexpr, node.rexpr)
            if name in filter_eval.ARITHMETIC:
                return self.arithmetic(name, node.lexpr, node.rexpr)
            (_, left), (_, right) = self.node(node.lexpr), self.node(node.rexpr)  # ||
            return TEXT, lambda cols, n: pc.binary_join_element_wise(
                _as(left(cols, n), pa.string()), _as(right(cols, n), pa.string()), "")
        if k in (A_Expr_Kind.AEXPR_DISTINCT, A_Expr_Kind.AEXPR_NOT_DISTINCT):
            (lk, left), (rk, right) = self.node(node.lexpr), self.node(node.rexpr)
            equal = _comparison("=", lk, rk)
            distinct = k == A_Expr_Kind.AEXPR_DISTINCT

            def is_distinct(cols: Columns, n: int) -> pa.Array:
                a, b = left(cols, n), right(cols, n)
                same = pc.or_(pc.fill_null(equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
                return pc.invert(same) if distinct else same
            return BOOL, is_distinct
        if k == A_Expr_Kind.AEXPR_IN:
            return self.in_list(name == "<>", node.lexpr, node.rexpr)
        if k in (A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN):
            low, high = tuple(node.rexpr or ())
            _, ge = self.compare(">=", node.lexpr, low)
            _, le = self.compare("<=", node.lexpr, high)
            negate = k == A_Expr_Kind.AEXPR_NOT_BETWEEN

            def between(cols: Columns, n: int) -> pa.Array:
                inside = pc.and_kleene(ge(cols, n), le(cols, n))
                return pc.invert(inside) if negate else inside
            return BOOL, between
        return self.like(k == A_Expr_Kind.AEXPR_ILIKE, name.startswith("!"), node.lexpr, node.rexpr)

    def compare(self, name: str, lexpr: Any, rexpr: Any) -> tuple[Kind, ColumnEval]:
        (lk, left), (rk, right) = self.node(lexpr), self.node(rexpr)
        test = _comparison(name, lk, rk)
        return BOOL, lambda cols, n: test(left(cols, n), right(cols, n))

    def arithmetic(self, name: str, lexpr: Any, rexpr: Any) -> tuple[Kind, ColumnEval]:
        (lk, left), (rk, right) = self.node(lexpr), self.node(rexpr)
        bits = max(k[1] if k[0] == "int" else 0 for k in (lk, rk)) or 32
        dtype = _INT_TYPES[bits]
        if name == "%":
            return ("int", bits), lambda cols, n: _remainder(_as(left(cols, n), dtype), _as(right(cols, n), dtype))
        op = _CHECKED[name]
        return ("int", bits), lambda cols, n: _checked(op, _as(left(cols, n), dtype), _as(right(cols, n), dtype))

    def in_list(self, negate: bool, lexpr: Any, rexpr: Any) -> tuple[Kind, ColumnEval]:
        lk, left = self.node(lexpr)
        items = [(_comparison("=", lk, k), fn) for k, fn in (self.node(x) for x in rexpr)]

        def member(cols: Columns, n: int) -> pa.Array:
            a = left(cols, n)
            hit = np.zeros(n, dtype=bool)
            unknown = np.zeros(n, dtype=bool)
            for equal, fn in items:
                b = fn(cols, n)
                hit |= kernels.mask(equal(a, b))
                unknown |= kernels.mask(pc.is_null(b))
            null = kernels.mask(pc.is_null(a)) | (~hit & unknown)
            return pa.array(hit != negate, pa.bool_(), mask=null)
        return BOOL, member

    def like(self, insensitive: bool, negate: bool, lexpr: Any, rexpr: Any) -> tuple[Kind, ColumnEval]:
        _, value = self.node(lexpr)
        pattern = str(rexpr.val.sval)
        pattern = pattern.lower() if insensitive else pattern
        regex = "\\A(?s:" + "".join(".*" if ch == "%" else "." if ch == "_" else ch if ch.isalnum() and ch.isascii()
                                    else f"\\x{{{ord(ch):X}}}" for ch in pattern) + ")\\z"

        def matches(cols: Columns, n: int) -> pa.Array:
            values = _as(value(cols, n), pa.string())
            if insensitive:
                if _any(pc.invert(pc.string_is_ascii(values))):
                    raise NotCovered("a non-ASCII value under a case mapping")
                values = pc.ascii_lower(values)
            elif _any(pc.match_substring_regex(values, _BEYOND_BMP)):
                raise NotCovered("a value beyond the Basic Multilingual Plane under LIKE")
            found = pc.match_substring_regex(values, regex)
            return pc.invert(found) if negate else found
        return BOOL, matches


def _comparison(name: str, a: Kind, b: Kind) -> Callable[[pa.Array, pa.Array], pa.Array]:
    """``a <name> b`` over columns as ``filter_eval._ordering`` orders the two types (null where either is)."""
    families = {a[0], b[0]}
    if "null" in families:
        return lambda x, y: pa.nulls(len(x), pa.bool_())
    plain: Callable[[Any, Any], Any] = {"=": pc.equal, "<>": pc.not_equal, "!=": pc.not_equal, "<": pc.less,
                                        "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}[name]
    if "float" not in families:  # integers (any widths), booleans, strings: Arrow's order is the reference's
        if len(families) != 1 and families != {"int"}:
            raise _Unexact("a comparison of two families")
        return plain

    def floats(x: pa.Array, y: pa.Array) -> pa.Array:
        # Spark's order of doubles: NaN equals NaN and is above every number (Arrow's IEEE order is not).
        x, y = x.cast(pa.float64(), safe=False), y.cast(pa.float64(), safe=False)  # an integer rounded to double
        xn, yn = pc.is_nan(x), pc.is_nan(y)
        nan_answer = {"=": pc.and_(xn, yn), "<>": pc.xor(xn, yn), "!=": pc.xor(xn, yn),
                      "<": pc.and_(pc.invert(xn), yn), "<=": pc.or_(pc.invert(xn), yn),
                      ">": pc.and_(xn, pc.invert(yn)), ">=": pc.or_(xn, pc.invert(yn))}[name]
        return pc.if_else(pc.or_(xn, yn), nan_answer, plain(x, y))
    return floats


def _checked(op: Callable[..., pa.Array], *args: pa.Array) -> pa.Array:
    """An Arrow checked kernel; an integer result out of its type's range is the reference's ``NotCovered``."""
    try:
        return op(*args)
    except pa.ArrowInvalid:
        raise NotCovered("an integer result out of its type's range") from None


def _remainder(a: pa.Array, b: pa.Array) -> pa.Array:
    """Truncated remainder (the dividend's sign); a zero divisor of a non-null dividend is ``NotCovered``."""
    null = kernels.mask(pc.is_null(a)) | kernels.mask(pc.is_null(b))
    x = np.asarray(pc.fill_null(a, 0).to_numpy(zero_copy_only=False))
    y = np.asarray(pc.fill_null(b, 1).to_numpy(zero_copy_only=False))
    if np.any((y == 0) & ~null):
        raise NotCovered("a zero divisor")
    y = np.where((y == 0) | (y == -1), 1, y)  # x % -1 is 0, and the minimum % -1 would trap in C
    return pa.array(np.fmod(x, y), a.type, mask=null)
