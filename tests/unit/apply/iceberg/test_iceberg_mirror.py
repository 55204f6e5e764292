"""The Iceberg mirror's row plan (``iceberg/mirror.py``) against a reference written row by row, and its vectorised
key matching against the tuple reference, on generated net changes (hypothesis)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.targets.iceberg import mirror
from airflow_provider_pglogical.apply.transforms import FROM, KEEP, KIND, LSN

KEYS = st.integers(min_value=0, max_value=12)
BASE = st.dictionaries(KEYS, st.tuples(st.integers(0, 9), st.one_of(st.none(), st.text(max_size=3))), max_size=10)
NET = st.dictionaries(KEYS, st.tuples(st.sampled_from("DIUR"), st.booleans(), st.integers(0, 9),
                                      st.one_of(st.none(), st.text(max_size=3))), max_size=10)


def base_table(rows: dict[int, tuple]) -> pa.Table:
    keys = sorted(rows)
    return pa.table({"id": pa.array(keys, pa.int32()), "n": pa.array([rows[k][0] for k in keys], pa.int32()),
                     "body": pa.array([rows[k][1] for k in keys], pa.string()),
                     "extra": pa.array([f"x{k}" for k in keys], pa.string())})


def net_table(rows: dict[int, tuple]) -> pa.Table:
    keys = sorted(rows)
    return pa.table({KIND: pa.array([rows[k][0] for k in keys], pa.string()),
                     KEEP: pa.array([["body"] if rows[k][1] else [] for k in keys], pa.list_(pa.string())),
                     LSN: pa.array([100 + k for k in keys], pa.int64()),
                     FROM: pa.nulls(len(keys), pa.struct([("id", pa.int32())])),
                     "id": pa.array(keys, pa.int32()), "n": pa.array([rows[k][2] for k in keys], pa.int32()),
                     "body": pa.array([rows[k][3] for k in keys], pa.string())})


def reference(base: dict[int, tuple], net: dict[int, tuple], truncated: bool) -> tuple[dict[int, tuple], list[int]]:
    """The Delta MERGE's rules, one change at a time: the table after the batch, and the rejected keys."""
    state = {} if truncated else {k: (v[0], v[1], f"x{k}") for k, v in base.items()}
    rejected = []
    for k, (kind, keep, n, body) in sorted(net.items()):
        row = state.get(k)
        if kind == "D":
            state.pop(k, None)
        elif kind == "U":
            if row is not None:
                state[k] = (n, row[1] if keep else body, row[2])
        elif keep and (kind == "R" or row is None):
            rejected.append(k)
        else:
            state[k] = (n, row[1] if keep and row is not None else body, row[2] if row is not None else None)
    return state, rejected


@settings(max_examples=200, deadline=None)
@given(BASE, NET, st.booleans())
def test_the_row_plan_leaves_the_table_a_row_by_row_merge_leaves(base, net, truncated):
    table = base_table({} if truncated else base)
    plan = mirror.plan_net(net_table(net), table, ("id",), ("id", "n", "body"), ("id", "n", "body", "extra"),
                           where="b", target="public.t", unchanged_toast="reject_and_continue")
    kept = table.filter(pa.compute.invert(mirror.key_mask(table, ("id",), plan.replaced)))
    after = {r["id"]: (r["n"], r["body"], r["extra"]) for r in pa.concat_tables([kept, plan.rows]).to_pylist()}
    expected, rejected = reference(base, net, truncated)
    assert after == expected
    assert sorted(r["key"]["id"] for r in plan.rejects) == rejected
    assert plan.counts["deleted"] == sum(1 for k, v in net.items() if v[0] == "D" and k in base and not truncated)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), KEYS), max_size=20), st.sets(st.one_of(st.none(), KEYS), max_size=8))
def test_vectorised_key_matching_equals_the_tuple_reference(values, keys):
    """One key column: Arrow's hash set (NULL matches NULL, as REPLICA IDENTITY FULL keys need); composite keys:
    Python tuples. Both must say the same for a single column."""
    table = pa.table({"id": pa.array(values, pa.int32()), "n": pa.array(values, pa.int32())})
    wanted = {(k,) for k in keys}
    fast = mirror.key_mask(table, ("id",), wanted).to_pylist()
    assert fast == [(v,) in wanted for v in values]
    pairs = {(k, k) for k in keys}
    assert mirror.key_mask(table, ("id", "n"), pairs).to_pylist() == fast
