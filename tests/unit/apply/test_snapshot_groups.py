"""``targets/postgres/snapshot.atomic_groups``: which tables of a snapshot must share a load transaction."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.targets.postgres.snapshot import atomic_groups


def _tables(*names: str) -> list:
    return [SimpleNamespace(target=n) for n in names]  # atomic_groups reads the target name only


def _names(groups) -> list[list[str]]:
    return [[t.target for t in g] for g in groups]


def test_fk_linked_tables_form_one_group_in_plan_order_unrelated_ones_their_own():
    tables = _tables("a", "b", "c", "d")
    assert _names(atomic_groups(tables, [("b", "a"), ("d", "b")])) == [["a", "b", "d"], ["c"]]


def test_a_link_through_either_direction_joins_and_fks_to_other_tables_are_ignored():
    tables = _tables("p", "x", "q")
    # q references p's child x and x references p: one chain; "other" is not in this snapshot
    assert _names(atomic_groups(tables, [("x", "p"), ("q", "x"), ("p", "other"), ("other", "q")])) == [["p", "x", "q"]]
    assert _names(atomic_groups(_tables("p", "q"), [("p", "other"), ("q", "other")])) == [["p"], ["q"]]


def test_self_references_and_no_fks_leave_every_table_alone():
    assert _names(atomic_groups(_tables("t", "u"), [("t", "t")])) == [["t"], ["u"]]
    assert _names(atomic_groups([], [("t", "u")])) == []


@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=12))))
def test_groups_partition_the_tables_and_never_split_an_fk(case):
    n, edges = case
    names = [f"t{i}" for i in range(n)]
    groups = _names(atomic_groups(_tables(*names), [(names[a], names[b]) for a, b in edges]))
    assert sorted(x for g in groups for x in g) == sorted(names)  # every table once
    for g in groups:
        assert g == [x for x in names if x in g]  # plan order (parents first) kept inside a group
    where = {x: i for i, g in enumerate(groups) for x in g}
    assert all(where[names[a]] == where[names[b]] for a, b in edges)
    # and minimal: a group with more than one table is connected by its own edges
    for g in groups:
        reach, todo = {g[0]}, [g[0]]
        while todo:
            x = todo.pop()
            for a, b in edges:
                for u, v in ((names[a], names[b]), (names[b], names[a])):
                    if u == x and v not in reach:
                        reach.add(v)
                        todo.append(v)
        assert reach == set(g)
