"""Row filters through PostgreSQL's parser: publication rules, and the deparsed SQL the pipeline evaluates."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pglast import ast, parse_sql
from pglast.enums import BoolExprType

from airflow_provider_pglogical.exceptions import RowFilterError
from airflow_provider_pglogical.row_filter import canonical, conjunction, disjunction, parse_row_filter, spark_sql


def where_of(sql: str) -> ast.Node:
    return parse_sql(f"SELECT 1 WHERE {sql}")[0].stmt.whereClause


@pytest.mark.parametrize(("text", "sql", "columns"), [
    ("amount > 100 AND region = 'EU'", "amount > 100 AND region = 'EU'", {"amount", "region"}),
    ("(id <= 5) /* only the first */ -- five", "id <= 5", {"id"}),
    ('"id" = 1', "id = 1", {"id"}),
    ('"Region" = \'eu\' AND Region <> \'x\'', '"Region" = \'eu\' AND region <> \'x\'', {"Region", "region"}),
    ('"select" = 1 AND "a b" > 2', '"select" = 1 AND "a b" > 2', {"select", "a b"}),
    ("note = 'it''s; \"ok\" (really'", "note = 'it''s; \"ok\" (really'", {"note"}),
    ("id::int > -5 AND lower(n) LIKE 'a%'", "CAST(id AS integer) > -5 AND lower(n) LIKE 'a%'", {"id", "n"}),
    ("coalesce(a, 0) IN (1, 2) AND b IS DISTINCT FROM 3", "COALESCE(a, 0) IN (1, 2) AND b IS DISTINCT FROM 3",
     {"a", "b"}),
    ("CASE WHEN a THEN 1 ELSE 2 END = 1 AND x BETWEEN 1 AND 2", "CASE WHEN a THEN 1 ELSE 2 END = 1 AND "
     "x BETWEEN 1 AND 2", {"a", "x"}),
    ("pg_catalog.upper(s) = 'A' AND trim(t) <> ''", "pg_catalog.upper(s) = 'A' AND pg_catalog.btrim(t) <> ''",
     {"s", "t"}),
])
def test_an_allowed_filter_is_deparsed_from_its_tree_with_its_columns(text, sql, columns):
    parsed = parse_row_filter(text)
    assert parsed.sql == sql and parsed.columns == frozenset(columns)


@pytest.mark.parametrize(("text", "reason"), [
    ("/* ( */ true) OR (true /* ) */", 'does not parse: syntax error at or near ")" (at character 13)'),
    ("amount > 100 AND region = 'EU", "does not parse: unterminated quoted string"),
    ("(amount > 100", "does not parse: syntax error at end of input"),
    ("amount > 100)", 'does not parse: syntax error at or near ")"'),
    ("amount > 100; DROP TABLE x", "must be a single expression"),
    ("true UNION SELECT 1", "must be a single expression"),
    ("true ORDER BY 1", "must be a single expression"),
    ("true LIMIT 1", "must be a single expression"),
    ("pg_sleep(0.2) IS NOT NULL", "function pg_sleep is not allowed (only immutable built-in functions)"),
    ("now() > amount", "function now is not allowed"),
    ("public.lower(x) = 'a'", "function public.lower is not allowed"),
    ("count(*) > 1", "function count is not allowed"),
    ("lower(x ORDER BY x) = 'a'", "function lower is called as an aggregate, window or variadic"),
    ("id > (SELECT v FROM public.secret WHERE id = 17)::int", "subqueries are not allowed"),
    ("EXISTS (SELECT 1)", "subqueries are not allowed"),
    ("id = $1", "parameters are not allowed"),
    ("d < current_date", "CURRENT_DATE, CURRENT_USER and the like are not immutable"),
    ("xmin = 1", "system column xmin is not allowed"),
    ("ctid > '(0,1)'", "system column ctid is not allowed"),
    ("secret.id = 1", "only columns of the table itself may be referenced"),
    ("x::mood = 'happy'", "type mood is not a built-in type"),
    ("x OPERATOR(public.===) 1", "operator public.=== is not a built-in operator"),
    ("x @@@ 1", "operator @@@ is not a built-in operator"),
    ("x = 'a' COLLATE public.mine", "collation public.mine is not a built-in collation"),
    ("arr[1] = 2", "field selection and array subscripts are not allowed"),
    ("x SIMILAR TO 'a'", "SIMILAR expressions are not allowed"),
])
def test_a_filter_a_publication_would_refuse_is_refused_with_the_reason(text, reason):
    with pytest.raises(RowFilterError) as info:
        parse_row_filter(text)
    assert str(info.value).startswith(reason) and "\n" not in str(info.value)


@pytest.mark.parametrize(("text", "spark"), [
    ('"Region" = \'eu\' AND Region <> \'"x"\'', "(`Region` = 'eu') AND (`region` <> '\"x\"')"),
    ('"se`lect" IN (1, 2) OR lower("a b") = \'a\'', "(`se``lect` IN (1, 2)) OR (lower(`a b`) = 'a')"),
    # Spark ranks || with + and -: every composite operand is parenthesized, whatever PostgreSQL would need
    ("t || (i - 1) = '19' AND NOT a * (b + 1) IS NULL", "((`t` || (`i` - 1)) = '19') AND (NOT ((`a` * (`b` + 1)) IS NULL))"),
    # a constant spelling what stands for a name while printing is a constant still
    ("note <> 'pglogical_column_1_' AND n <> 'pglogical_hole0_'",
     "(`note` <> 'pglogical_column_1_') AND (`n` <> 'pglogical_hole0_')"),
])
def test_spark_gets_every_name_backtick_quoted_as_postgresql_read_it(text, spark):
    assert spark_sql(text) == spark_sql(canonical(text)) == spark


def test_the_publications_filters_are_combined_from_their_deparsed_trees():
    assert canonical("((id > 10))") == "id > 10"
    assert disjunction(["id > 10"]) == "id > 10"
    assert disjunction(["id > 10", "b < 3"]) == "(id > 10) OR (b < 3)"
    assert conjunction(["(id > 10) OR (b < 3)", None, "c = 1"]) == "((id > 10) OR (b < 3)) AND (c = 1)"
    assert conjunction([None, None]) is None


# Tokens that can open or close something in SQL text: comments, parentheses, quotes, keywords.
TOKENS = st.sampled_from(["true", "false", "id", "x", "1", "'a'", "'('", "')'", "''", "(", ")", "/*", "*/", "--",
                          "\n", " OR ", " AND ", "NOT ", " = ", " <= ", " IS NULL", "lower(", "::int", "/* ) */",
                          "/* ( */", ";", " ", "\"id\""])


@settings(deadline=None, max_examples=400)
@given(st.lists(TOKENS, min_size=1, max_size=14).map("".join))
def test_whatever_the_text_a_spec_filter_stays_one_conjunct_of_the_snapshot_where(text):
    try:
        parsed = parse_row_filter(text)
    except RowFilterError:
        return  # refused: never reaches the source
    publication = "id <= 5"
    where = where_of(conjunction([publication, parsed.sql]))
    # The spec's text cannot reach past its parentheses: the WHERE is exactly (publication) AND (spec).
    assert isinstance(where, ast.BoolExpr) and where.boolop == BoolExprType.AND_EXPR
    assert list(where.args) == [where_of(publication), where_of(parsed.sql)]
    # and what is sent is the filter's own tree, a fixed point of parse and deparse
    assert where_of(parsed.sql) == where_of(text) and parse_row_filter(parsed.sql) == parsed


# Expressions a spec may hold, as token lists: comparisons of columns and literals under AND / OR / NOT.
COLUMN = st.sampled_from(["id", "amount", "region", "note"])
LITERAL = st.one_of(
    st.integers(-10**9, 10**9).map(str),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6)
    .map(lambda s: "'" + s.replace("'", "''") + "'"),
    st.sampled_from(["true", "false", "NULL"]))
COMPARISON = st.tuples(COLUMN, st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), st.one_of(LITERAL, COLUMN)) \
    .map(list)
EXPRESSION = st.recursive(
    COMPARISON,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: ["(", *t[0], ")", t[1], "(", *t[2], ")"]),
        inner.map(lambda e: ["NOT", "(", *e, ")"])),
    max_leaves=6)
# What may stand between two tokens: blanks, and comments holding what would close the expression if pasted.
GAP = st.sampled_from([" ", "\n", " /* ) OR (true */ ", " -- ) OR (true\n", "/**/"])


@settings(deadline=None, max_examples=300)
@given(EXPRESSION, st.data())
def test_comments_between_any_tokens_change_nothing_and_the_deparse_is_a_fixed_point(tokens, data):
    plain = parse_row_filter(" ".join(tokens))
    gaps = data.draw(st.lists(GAP, min_size=len(tokens) + 1, max_size=len(tokens) + 1))
    commented = parse_row_filter("".join(g + t for g, t in zip(gaps, [*tokens, ""], strict=True)))
    assert commented == plain
    assert parse_row_filter(plain.sql) == plain
    assert plain.columns <= {"id", "amount", "region", "note"}
