"""Row filters evaluated in this process over Arrow images, with the answers the Spark path gives: no JVM.

The Spark path evaluates a filter as ``F.expr(<the spec's filter deparsed for Spark>)`` over an image's fields
(``filters._match``). ``compile_filter`` turns the same text's PostgreSQL parse tree (``pglast``) into a per-row
Python evaluator for the images of one staged schema, returning True / False / None (NULL) per row with SQL's
three-valued logic. It covers only constructs whose Spark result it reproduces exactly for the staged Arrow types,
and raises ``NotCovered`` for anything else — then the batch goes to Spark as before:

* columns of integer (int16/32/64), floating-point (float32/64), decimal128, boolean, string, date and timestamp
  images, referenced by name as PostgreSQL's parser reads it (a quoted name as written, an unquoted one folded to
  lower case) and resolved exactly, as the apply's case-sensitive Spark resolves the backtick-quoted name it gets
  (``"Val"`` is column Val, ``Val`` column val);
* constants: integers that fit 64 bits, decimal literals without exponent (``1.50``), strings without backslash
  (Spark reads a backslash as an escape, PostgreSQL does not), ``TRUE``/``FALSE``/``NULL``;
* ``AND``/``OR``/``NOT``, ``IS [NOT] NULL``, ``IS [NOT] DISTINCT FROM``, ``=``, ``<>``/``!=``, ``<``, ``<=``,
  ``>``, ``>=``, ``[NOT] IN (…)``, ``[NOT] BETWEEN`` and ``COALESCE`` between operands of one family:
  integers with integers, decimals with decimals or integers (when Spark's common decimal type needs at most
  38 digits), float32/64 with floats (NaN equal to NaN and above every number, -0.0 equal to 0.0, as Spark
  compares), float64 with integers (the integer rounded to double first, as Spark casts), strings with strings
  (code-point order: Spark's binary UTF-8 order), booleans, dates, timestamps of one time-zone kind;
* integer ``+``, ``-``, ``*``, ``%`` (remainder with the dividend's sign) and unary ``-``, ``abs`` of numbers;
  a result outside the result type's range or a zero divisor is not evaluated here (Spark raises or wraps);
* string ``||``, ``length``, ``lower``/``upper`` (ASCII values; another value is left to Spark, whose case
  mapping is Java's), ``[NOT] LIKE`` / ``[NOT] ILIKE`` with a constant pattern (``%``, ``_``; ILIKE on ASCII).

Left out, so evaluated by Spark: casts, division, float or decimal arithmetic, mixed families (a string compared
with a number or a date, a float32 with an integer, a float with a decimal), ``IS TRUE``, ``LIKE … ESCAPE``,
qualified or other functions, ``CASE``, operators written as symbols Spark does not read (``~~``).

A value the evaluator cannot be sure of at run time (an integer result out of range, a non-ASCII case mapping,
a character outside the Basic Multilingual Plane under LIKE) raises ``NotCovered`` too: the caller decides before
anything is written (``direct.batch_files``). ``tests/unit/apply/test_filter_eval.py`` compares the evaluator and
the publication transform (``apply/published.py``) with the Spark path on random filters and batches.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
from pglast import ast
from pglast.enums import A_Expr_Kind, BoolExprType, NullTestType

from airflow_provider_pglogical.exceptions import RowFilterError
from airflow_provider_pglogical.row_filter import parse_expression


class NotCovered(Exception):
    """The filter (or one of the values it meets) is outside what this module evaluates exactly: use Spark."""


# A type as the evaluator tracks it: (family, detail). Families: int (bits), float (bits), dec ((precision, scale)),
# bool, text, date, ts (time zone or None), null (the NULL literal: any family), any (a column of unknown type:
# ``covers`` judges the grammar before a schema is known).
Kind = tuple[str, Any]
Row = Sequence[Any]
Eval = Callable[[Row], Any]

NULL: Kind = ("null", None)
_ANY: Kind = ("any", None)
BOOL: Kind = ("bool", None)
TEXT: Kind = ("text", None)
_INT_RANGE = {16: (-(2**15), 2**15 - 1), 32: (-(2**31), 2**31 - 1), 64: (-(2**63), 2**63 - 1)}
_DECIMAL_DIGITS = {16: 5, 32: 10, 64: 20}  # Spark's DecimalType.forType of each integer width
COMPARISONS = frozenset({"=", "<>", "!=", "<", "<=", ">", ">="})
ARITHMETIC = frozenset({"+", "-", "*", "%"})


def kind_of(dtype: pa.DataType) -> Kind | None:
    """The evaluator's type of an Arrow image field, or None when it does not evaluate it."""
    if pa.types.is_signed_integer(dtype) and dtype.bit_width in _INT_RANGE:
        return ("int", dtype.bit_width)
    if pa.types.is_float32(dtype) or pa.types.is_float64(dtype):
        return ("float", dtype.bit_width)
    if pa.types.is_decimal128(dtype):
        return ("dec", (dtype.precision, dtype.scale))
    if pa.types.is_boolean(dtype):
        return BOOL
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return TEXT
    if pa.types.is_date32(dtype):
        return ("date", None)
    if pa.types.is_timestamp(dtype) and dtype.unit in ("s", "ms", "us"):
        return ("ts", dtype.tz)
    return None


@dataclass(frozen=True)
class CompiledFilter:
    """A filter compiled for one image schema: ``columns`` the image fields it reads, in ``evaluate``'s row order."""

    columns: tuple[str, ...]
    evaluate_row: Eval

    def evaluate(self, image: pa.StructArray) -> list[bool | None]:
        """The filter over each row of ``image`` (a null image has null fields): True, False or None (NULL)."""
        fields = [image.field(c) for c in self.columns]
        valid = image.is_valid().to_pylist() if image.null_count else None
        try:
            columns = [f.to_pylist() for f in fields]
        except (ValueError, OverflowError):  # a date or timestamp beyond Python's years 1-9999 (BC, infinity)
            raise NotCovered("a date or timestamp Python does not hold") from None
        rows: list[Row] = list(zip(*columns, strict=True)) if columns else [() for _ in range(len(image))]
        if valid is not None:
            nothing = (None,) * len(self.columns)
            rows = [r if v else nothing for r, v in zip(rows, valid, strict=True)]
        return [self.evaluate_row(r) for r in rows]

    def matches(self, image: pa.StructArray) -> np.ndarray:
        """Which rows the filter selects: NULL counts as false (pgoutput's rule)."""
        return np.fromiter((v is True for v in self.evaluate(image)), dtype=bool, count=len(image))


def covers(expression: str) -> bool:
    """Whether the filter's constructs are all in the covered subset, whatever its columns' types (the part of the
    decision a configuration settles; a batch's schema still decides with ``compile_filter``)."""
    try:
        _compile(expression, None)
    except NotCovered:
        return False
    return True


def compile_filter(expression: str, fields: Mapping[str, pa.DataType]) -> CompiledFilter:
    """The filter as an evaluator over images whose fields have these Arrow types; NotCovered outside the subset."""
    return _compile(expression, tuple(fields.items()))


@lru_cache(maxsize=256)
def _compile(expression: str, fields: tuple[tuple[str, pa.DataType], ...] | None) -> CompiledFilter:
    try:
        where = parse_expression(expression)
    except RowFilterError:
        raise NotCovered("does not parse as one expression") from None
    compiler = _Compiler(None if fields is None else dict(fields))
    kind, fn = compiler.node(where)
    if kind[0] not in ("bool", "null", "any"):
        raise NotCovered("not a boolean expression")
    return CompiledFilter(tuple(compiler.columns), fn)


class _Compiler:
    """One filter's tree → (type, per-row function); ``columns`` collects the fields read, by row position."""

    def __init__(self, fields: dict[str, pa.DataType] | None) -> None:
        self.fields = fields
        self.columns: list[str] = []

    def node(self, node: Any) -> tuple[Kind, Eval]:
        if isinstance(node, ast.ColumnRef):
            return self.column(node)
        if isinstance(node, ast.A_Const):
            return self.constant(node)
        if isinstance(node, ast.BoolExpr):
            return self.boolean(node)
        if isinstance(node, ast.NullTest):
            kind, arg = self.node(node.arg)
            if node.nulltesttype == NullTestType.IS_NULL:
                return BOOL, lambda r: arg(r) is None
            return BOOL, lambda r: arg(r) is not None
        if isinstance(node, ast.CoalesceExpr):
            return self.coalesce(node)
        if isinstance(node, ast.FuncCall):
            return self.function(node)
        if isinstance(node, ast.A_Expr):
            return self.expression(node)
        raise NotCovered(type(node).__name__)

    def column(self, node: ast.ColumnRef) -> tuple[Kind, Eval]:
        fields = node.fields or ()
        if len(fields) != 1 or not isinstance(fields[0], ast.String):
            raise NotCovered("qualified name")
        name = str(fields[0].sval)
        if self.fields is None:
            kind: Kind = _ANY
            field = name
        else:
            if name not in self.fields:  # exact: the apply's Spark resolves names case-sensitively too
                raise NotCovered("a name no field has")
            field = name
            found = kind_of(self.fields[field])
            if found is None:
                raise NotCovered("a column type")
            kind = found
        if field not in self.columns:
            self.columns.append(field)
        at = self.columns.index(field)
        return kind, lambda r: r[at]

    @staticmethod
    def constant(node: ast.A_Const) -> tuple[Kind, Eval]:
        if node.isnull:
            return NULL, lambda r: None
        val = node.val
        value: Any
        if isinstance(val, ast.Boolean):
            value, kind = bool(val.boolval), BOOL
        elif isinstance(val, ast.Integer):
            value, kind = int(val.ival or 0), ("int", 32)
        elif isinstance(val, ast.Float):
            text = str(val.fval)
            if re.fullmatch(r"-?\d+", text):
                value = int(text)
                if not _INT_RANGE[64][0] <= value <= _INT_RANGE[64][1]:
                    raise NotCovered("an integer beyond 64 bits")  # Spark reads it as a decimal
                # -2147483648 reaches here (the parser's Integer holds no negative bound): 32 bits to both systems.
                kind = ("int", 32) if _INT_RANGE[32][0] <= value <= _INT_RANGE[32][1] else ("int", 64)
            elif re.fullmatch(r"-?(\d+\.\d*|\.\d+)", text):
                value = Decimal(text)
                digits, exponent = value.as_tuple().digits, int(value.as_tuple().exponent)
                scale = -exponent
                precision = max(len(digits), scale, 1)
                if precision > 38:
                    raise NotCovered("a decimal of more than 38 digits")
                kind = ("dec", (precision, scale))
            else:
                raise NotCovered("a number with an exponent")  # a double in Spark, numeric in PostgreSQL
        elif isinstance(val, ast.String):
            value, kind = str(val.sval), TEXT
            if "\\" in value or "'" in value or "${" in value:
                raise NotCovered("a quote, a backslash or ${ in a string")  # Spark reads them otherwise
        else:
            raise NotCovered("a constant")
        return kind, lambda r: value

    def boolean(self, node: ast.BoolExpr) -> tuple[Kind, Eval]:
        args = [self.node(a) for a in node.args or ()]
        for kind, _ in args:
            _expect_bool(kind)
        fns = [fn for _, fn in args]
        if node.boolop == BoolExprType.NOT_EXPR:
            (arg,) = fns
            return BOOL, lambda r: None if (v := arg(r)) is None else not v
        if node.boolop == BoolExprType.AND_EXPR:
            def and_(r: Row) -> bool | None:
                values = [fn(r) for fn in fns]
                return False if False in values else (None if None in values else True)
            return BOOL, and_

        def or_(r: Row) -> bool | None:
            values = [fn(r) for fn in fns]
            return True if True in values else (None if None in values else False)
        return BOOL, or_

    def coalesce(self, node: ast.CoalesceExpr) -> tuple[Kind, Eval]:
        args = [self.node(a) for a in node.args or ()]
        kind = NULL
        for k, _ in args:
            kind = common(kind, k)
        fns = [fn for _, fn in args]

        def first(r: Row) -> Any:
            return next((v for v in [fn(r) for fn in fns] if v is not None), None)
        return kind, first

    def function(self, node: ast.FuncCall) -> tuple[Kind, Eval]:
        names = [str(p.sval) for p in node.funcname or () if isinstance(p, ast.String)]
        if (len(names) != 1 or node.agg_star or node.agg_distinct or node.over or node.agg_filter
                or node.agg_order or node.func_variadic or len(node.args or ()) != 1):
            raise NotCovered("a function")
        name = names[0].lower()
        kind, arg = self.node((node.args or ())[0])
        if name in ("lower", "upper"):
            _expect(kind, "text")
            method = str.lower if name == "lower" else str.upper
            return TEXT, lambda r: None if (v := arg(r)) is None else method(_ascii(v))
        if name == "length":
            _expect(kind, "text")
            return ("int", 32), lambda r: None if (v := arg(r)) is None else len(v)
        if name == "abs":
            _expect(kind, "int", "dec", "float")
            if kind[0] == "int":
                low, high = _INT_RANGE[kind[1]]
                return kind, lambda r: None if (v := arg(r)) is None else _in_range(abs(v), low, high)
            return kind, lambda r: None if (v := arg(r)) is None else abs(v)
        raise NotCovered("a function")

    def expression(self, node: ast.A_Expr) -> tuple[Kind, Eval]:
        name = ".".join(str(p.sval) for p in node.name or () if isinstance(p, ast.String))
        k = node.kind
        if k == A_Expr_Kind.AEXPR_OP:
            if node.lexpr is None:
                return self.negate(name, node.rexpr)
            if name in COMPARISONS:
                return self.compare(name, node.lexpr, node.rexpr)
            if name in ARITHMETIC:
                return self.arithmetic(name, node.lexpr, node.rexpr)
            if name == "||":
                (lk, left), (rk, right) = self.node(node.lexpr), self.node(node.rexpr)
                _expect(lk, "text")
                _expect(rk, "text")
                return TEXT, lambda r: _concat(left(r), right(r))
            raise NotCovered("an operator")
        if k in (A_Expr_Kind.AEXPR_DISTINCT, A_Expr_Kind.AEXPR_NOT_DISTINCT) and name == "=":
            (lk, left), (rk, right) = self.node(node.lexpr), self.node(node.rexpr)
            equal = _equality(lk, rk)
            distinct = k == A_Expr_Kind.AEXPR_DISTINCT

            def is_distinct(r: Row) -> bool:
                a, b = left(r), right(r)
                same = (a is None and b is None) or (a is not None and b is not None and equal(a, b))
                return not same if distinct else same
            return BOOL, is_distinct
        if k == A_Expr_Kind.AEXPR_IN and name in ("=", "<>"):
            return self.in_list(name == "<>", node.lexpr, node.rexpr)
        if k in (A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN):
            bounds = tuple(node.rexpr or ())
            if len(bounds) != 2:
                raise NotCovered("BETWEEN without two bounds")
            low, high = bounds
            _, ge = self.compare(">=", node.lexpr, low)
            _, le = self.compare("<=", node.lexpr, high)
            negate = k == A_Expr_Kind.AEXPR_NOT_BETWEEN

            def between(r: Row) -> bool | None:
                a, b = ge(r), le(r)
                inside = False if False in (a, b) else (None if None in (a, b) else True)
                return None if inside is None else (not inside if negate else inside)
            return BOOL, between
        if k in (A_Expr_Kind.AEXPR_LIKE, A_Expr_Kind.AEXPR_ILIKE) and name in ("~~", "!~~", "~~*", "!~~*"):
            return self.like(k == A_Expr_Kind.AEXPR_ILIKE, name.startswith("!"), node.lexpr, node.rexpr)
        raise NotCovered("an expression kind")

    def negate(self, name: str, operand: Any) -> tuple[Kind, Eval]:
        if name != "-":
            raise NotCovered("a prefix operator")
        kind, arg = self.node(operand)
        _expect(kind, "int")
        low, high = _INT_RANGE[kind[1]] if kind[0] == "int" else _INT_RANGE[64]
        return kind, lambda r: None if (v := arg(r)) is None else _in_range(-v, low, high)

    def compare(self, name: str, lexpr: Any, rexpr: Any) -> tuple[Kind, Eval]:
        (lk, left), (rk, right) = self.node(lexpr), self.node(rexpr)
        order = _ordering(lk, rk)
        test: Callable[[int], bool] = {
            "=": lambda c: c == 0, "<>": lambda c: c != 0, "!=": lambda c: c != 0, "<": lambda c: c < 0,
            "<=": lambda c: c <= 0, ">": lambda c: c > 0, ">=": lambda c: c >= 0}[name]

        def comparison(r: Row) -> bool | None:
            a, b = left(r), right(r)
            return None if a is None or b is None else test(order(a, b))
        return BOOL, comparison

    def arithmetic(self, name: str, lexpr: Any, rexpr: Any) -> tuple[Kind, Eval]:
        (lk, left), (rk, right) = self.node(lexpr), self.node(rexpr)
        _expect(lk, "int")
        _expect(rk, "int")
        bits = max(k[1] if k[0] == "int" else 0 for k in (lk, rk)) or 32
        kind: Kind = ("int", bits) if "any" not in (lk[0], rk[0]) else _ANY
        low, high = _INT_RANGE[bits if kind[0] == "int" else 64]
        op: Callable[[int, int], int] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b,
                                         "*": lambda a, b: a * b, "%": _remainder}[name]

        def compute(r: Row) -> int | None:
            a, b = left(r), right(r)
            return None if a is None or b is None else _in_range(op(a, b), low, high)
        return kind, compute

    def in_list(self, negate: bool, lexpr: Any, rexpr: Any) -> tuple[Kind, Eval]:
        lk, left = self.node(lexpr)
        items = [self.node(x) for x in rexpr]
        # Spark casts the left side and every item to one common type: one family here, decimals within 38 digits.
        kinds = [k for k in (lk, *(k for k, _ in items)) if k[0] not in ("null", "any")]
        if len({k[0] for k in kinds}) > 1:
            raise NotCovered("an IN list over two families")
        if kinds and kinds[0][0] == "dec":
            functools.reduce(common, kinds)
        equals = [(_equality(lk, k), fn) for k, fn in items]

        def member(r: Row) -> bool | None:
            a, values = left(r), [(equal, fn(r)) for equal, fn in equals]
            if a is None:
                return None
            if any(b is not None and equal(a, b) for equal, b in values):
                return not negate
            return None if any(b is None for _, b in values) else negate
        return BOOL, member

    def like(self, insensitive: bool, negate: bool, lexpr: Any, rexpr: Any) -> tuple[Kind, Eval]:
        kind, value = self.node(lexpr)
        _expect(kind, "text")
        if not isinstance(rexpr, ast.A_Const) or not isinstance(rexpr.val, ast.String):
            raise NotCovered("a LIKE pattern that is not a string constant")
        _, pattern_of = self.constant(rexpr)
        pattern = str(pattern_of(()))
        if insensitive:
            if not pattern.isascii():
                raise NotCovered("a non-ASCII ILIKE pattern")
            pattern = pattern.lower()
        if any(ord(ch) > 0xFFFF for ch in pattern):
            raise NotCovered("a LIKE pattern beyond the Basic Multilingual Plane")
        regex = re.compile("".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern),
                           re.DOTALL)

        def matches(r: Row) -> bool | None:
            v = value(r)
            if v is None:
                return None
            if insensitive:
                v = _ascii(v).lower()
            elif not _bmp(v):
                raise NotCovered("a value beyond the Basic Multilingual Plane under LIKE")
            return (regex.fullmatch(v) is None) if negate else (regex.fullmatch(v) is not None)
        return BOOL, matches


def _expect(kind: Kind, *families: str) -> None:
    if kind[0] not in (*families, "null", "any"):
        raise NotCovered(f"a {kind[0]} operand where {'/'.join(families)} is needed")


def constant(node: ast.A_Const) -> tuple[Kind, Eval]:
    """A literal's type and per-row function (its value, whatever the row): shared with ``filter_columns``."""
    return _Compiler.constant(node)


def _expect_bool(kind: Kind) -> None:
    _expect(kind, "bool")


def common(a: Kind, b: Kind) -> Kind:
    """The type COALESCE gives two operands (one family only; integers and floats widen exactly)."""
    if a[0] in ("null", "any"):
        return b if a[0] == "null" else a
    if b[0] in ("null", "any"):
        return a if b[0] == "null" else b
    if a[0] != b[0]:
        raise NotCovered("COALESCE over two families")
    if a[0] in ("int", "float"):
        return (a[0], max(a[1], b[1]))
    if a[0] == "dec":
        scale = max(a[1][1], b[1][1])
        whole = max(a[1][0] - a[1][1], b[1][0] - b[1][1])
        if whole + scale > 38:
            raise NotCovered("COALESCE over decimals beyond 38 digits")  # Spark's common type would round
        return ("dec", (whole + scale, scale))
    if a != b:
        raise NotCovered("COALESCE over two timestamp types")
    return a


def _ordering(a: Kind, b: Kind) -> Callable[[Any, Any], int]:
    """How Spark orders a value of type ``a`` against one of type ``b``: a three-way comparison (NotCovered when
    the two families do not compare exactly here)."""
    fa, fb = a[0], b[0]
    if "any" in (fa, fb) or "null" in (fa, fb):
        other = fb if fa in ("any", "null") else fa
        return _float_order if other == "float" else _plain_order
    if fa == fb == "int" or (fa == fb and fa in ("bool", "text", "date")):
        return _plain_order
    if fa == fb == "ts":
        if a[1] is None or b[1] is None:
            if a[1] != b[1]:
                raise NotCovered("timestamps with and without time zone")
        return _plain_order
    if {fa, fb} <= {"dec", "int"}:
        digits = [x[1] if x[0] == "dec" else (_DECIMAL_DIGITS[x[1]], 0) for x in (a, b)]
        scale = max(s for _, s in digits)
        whole = max(p - s for p, s in digits)
        if whole + scale > 38:
            raise NotCovered("a decimal comparison beyond 38 digits")  # Spark's common type would round
        return _plain_order
    if fa == fb == "float":
        return _float_order
    if {fa, fb} == {"float", "int"} and max(x[1] for x in (a, b) if x[0] == "float") == 64:
        return lambda x, y: _float_order(float(x), float(y))  # Spark casts the integer to double
    raise NotCovered(f"a comparison of {fa} with {fb}")


def _equality(a: Kind, b: Kind) -> Callable[[Any, Any], bool]:
    order = _ordering(a, b)
    return lambda x, y: order(x, y) == 0


def _plain_order(x: Any, y: Any) -> int:
    return -1 if x < y else (1 if x > y else 0)


def _float_order(x: float, y: float) -> int:
    """Spark's order of doubles: NaN equals NaN and is above every number; -0.0 equals 0.0."""
    xn, yn = x != x, y != y
    if xn or yn:
        return (1 if xn else 0) - (1 if yn else 0)
    return _plain_order(x, y)


def _remainder(a: int, b: int) -> int:
    """Java's (and PostgreSQL's) integer remainder: the dividend's sign; a zero divisor is Spark's to judge."""
    if b == 0:
        raise NotCovered("a zero divisor")
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _in_range(v: int, low: int, high: int) -> int:
    if not low <= v <= high:
        raise NotCovered("an integer result out of its type's range")
    return v


def _concat(a: str | None, b: str | None) -> str | None:
    return None if a is None or b is None else a + b


def _ascii(v: str) -> str:
    if not v.isascii():
        raise NotCovered("a non-ASCII value under a case mapping")
    return v


def _bmp(v: str) -> bool:
    return all(ord(ch) <= 0xFFFF for ch in v) if not v.isascii() else True
