"""Random staged table-batches for the direct path's property tests (hypothesis).

Mostly eligible for the direct path (every key fresh) and sometimes not — a key repeated, an unchanged-TOAST value,
a row filter, an action left out of the publication — so a rule that let such a batch through would show as a
disagreement with Spark's net frame (tests/unit/apply/test_direct.py, tests/unit/apply/lake/test_lake_direct.py).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.config import TableApplyConfig
from tests.support.stage import ITEMS, PAIRS, Chg, Col, Rel

KEYS = {ITEMS: ("id",), PAIRS: ("a", "b")}


def _key_value(rel: Rel, n: int) -> dict[str, Any]:
    return {"id": n} if rel is ITEMS else {"a": n, "b": f"k{n % 3}"}


def _row(rel: Rel, n: int, draw: st.DrawFn) -> dict[str, Any]:
    row = _key_value(rel, n)
    if rel is ITEMS:
        row.update(grp=draw(st.one_of(st.none(), st.integers(-5, 5))),
                   note=draw(st.one_of(st.none(), st.text(max_size=3))))
    else:
        row.update(v=draw(st.one_of(st.none(), st.integers(-5, 5))))
    return row


@st.composite
def changes_of(draw: st.DrawFn, rel: Rel, repeat: bool = True) -> list[Chg]:
    """A table's changes, each naming fresh keys unless a key is drawn again on purpose; without ``repeat``, never
    (and no unchanged-TOAST value): a batch Spark nets without compaction and without the TOAST refill."""
    fresh = iter(range(1, 1000))
    used: list[int] = []

    def key() -> int:
        if repeat and used and draw(st.integers(0, 15)) == 0:  # now and then a key seen before: not eligible
            return draw(st.sampled_from(used))
        used.append(next(fresh))
        return used[-1]

    changes = []
    for i in range(draw(st.integers(0, 12))):
        commit, order = 10 + i // 3, i % 3
        op = draw(st.sampled_from(["I", "U", "U_moved", "U_key_only", "D"]))
        if op == "I":
            changes.append(Chg("I", commit, order, new=_row(rel, key(), draw)))
        elif op == "U":  # key kept, no old image (pgoutput sends none then)
            toast = ("note",) if repeat and rel is ITEMS and draw(st.integers(0, 10)) == 0 else ()
            new = _row(rel, key(), draw)
            changes.append(Chg("U", commit, order, new={k: v for k, v in new.items() if k not in toast}, toast=toast))
        elif op == "U_moved":  # key changed: the old key image ('K')
            old = _key_value(rel, key())
            changes.append(Chg("U", commit, order, old=old, old_key_only=True, new=_row(rel, key(), draw)))
        elif op == "U_key_only":  # an old key image equal to the new key: the key stayed
            n = key()
            changes.append(Chg("U", commit, order, old=_key_value(rel, n), old_key_only=True, new=_row(rel, n, draw)))
        else:
            changes.append(Chg("D", commit, order, old=_key_value(rel, key()), old_key_only=True))
    return changes


CONFIGS = st.sampled_from([TableApplyConfig(), TableApplyConfig(), TableApplyConfig(),
                           TableApplyConfig(row_filter="true"), TableApplyConfig(actions=("insert", "update"))])


@st.composite
def batches(draw: st.DrawFn) -> tuple[Rel, list[Chg], TableApplyConfig]:
    """A table's changes, each naming fresh keys unless a key is drawn again on purpose, and its config."""
    rel = draw(st.sampled_from([ITEMS, PAIRS]))
    changes = draw(changes_of(rel))
    return rel, changes, draw(CONFIGS)


@st.composite
def case_lists(draw: st.DrawFn, cases: int) -> tuple[Rel, list[list[Chg]], TableApplyConfig]:
    """``cases`` independent table-batches of one table under one config (tests/support/case_union.py). Spark decides
    compaction and the TOAST refill for the whole union, so whether any case may repeat a key or leave a value
    unchanged-TOAST is drawn once per example: the plan without either stays compared."""
    rel = draw(st.sampled_from([ITEMS, PAIRS]))
    repeat = draw(st.booleans())
    changes = draw(st.lists(changes_of(rel, repeat), min_size=cases, max_size=cases))
    return rel, changes, draw(CONFIGS)


# A table without a primary key: no replica identity, so keyless (insert-only, every INSERT its own row).
EVENTS = Rel("public", "events", (Col("at", pa.int64(), "bigint"), Col("grp", pa.int64(), "bigint"),
                                  Col("note", pa.string(), "text")))
KEYLESS_CONFIGS = st.sampled_from([TableApplyConfig(), TableApplyConfig(), TableApplyConfig(row_filter="grp > 0"),
                                   TableApplyConfig(row_filter="note IS NOT NULL AND at < 3"),
                                   TableApplyConfig(actions=("insert",)), TableApplyConfig(actions=("insert", "update")),
                                   TableApplyConfig(row_filter="grp > 0", actions=("insert", "delete"))])
_EVENT = st.fixed_dictionaries({"at": st.integers(1, 3), "grp": st.one_of(st.none(), st.integers(-1, 2)),
                                "note": st.one_of(st.none(), st.sampled_from(["a", "b"]))})


@st.composite
def keyless_changes(draw: st.DrawFn) -> list[Chg]:
    """A keyless table's changes: INSERTs of a few distinct rows (identical INSERTs are frequent), in one example of
    four some UPDATEs and DELETEs too — which a keyless table refuses when its action is published (then not
    eligible)."""
    ops = "IIIIIUD" if draw(st.integers(0, 3)) == 0 else "I"
    changes = []
    for i in range(draw(st.integers(0, 12))):
        commit, order = 10 + i // 3, i % 3
        op = draw(st.sampled_from(ops))
        changes.append(Chg(op, commit, order, new=draw(_EVENT)) if op != "D" else Chg("D", commit, order, old=draw(_EVENT)))
    return changes


def refused(changes: list[Chg], config: TableApplyConfig) -> bool:
    """Whether a keyless table-batch holds an UPDATE or DELETE of a published action (Spark refuses it)."""
    return any(c.op == "U" and "update" in config.actions or c.op == "D" and "delete" in config.actions
               for c in changes)
