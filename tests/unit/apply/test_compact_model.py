"""``compact`` against a pure-Python model of the net change per key, over random histories (hypothesis).

The model restates the documented semantics event by event (``to_key_events`` then ``compact``):
a key change is a DELETE of the old key (``away``) and an INSERT of the new key that remembers the old
one; per key, everything up to its last DELETE is void except for the kind (``R`` once a DELETE was
seen and something followed), each column takes the value of the latest later event that knows it
(an unchanged-TOAST column is not known), unknown columns are kept, the LSN is the key's latest
change's, and a key is touched when a key change moved its row away after an earlier event of it.
Few ids, so keys repeat, interleave, swap and come back. This pins today's exact rows, so any
faster compaction (docs/performance.md) can be checked against the same model.
"""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.batches import read_changes
from airflow_provider_pglogical.apply.transforms import compact, project_columns, resolve_toast_from_old, to_key_events
from tests.support.case_union import CASE, by_case, case_key, write_case, write_union
from tests.support.stage import Chg
from tests.unit.apply.conftest import ITEMS

COLS = ("id", "grp", "note")
VALUES = ("grp", "note")
ids = st.integers(0, 3)
grp = st.one_of(st.none(), st.integers(0, 9))
note = st.one_of(st.none(), st.sampled_from(["a", "b", ""]))


@st.composite
def change(draw: Any, commit_lsn: int, tx_order: int) -> Chg:
    op = draw(st.sampled_from("IUUD"))
    if op == "I":
        return Chg("I", commit_lsn, tx_order, new={"id": draw(ids), "grp": draw(grp), "note": draw(note)})
    if op == "D":
        return Chg("D", commit_lsn, tx_order, old={"id": draw(ids)}, old_key_only=True)
    key, new_key = draw(ids), draw(st.one_of(st.none(), ids))  # None: the key stays (no old image is sent)
    toast = draw(st.sampled_from([(), ("note",)]))
    new = {"id": key if new_key is None else new_key, "grp": draw(grp)}
    if not toast:
        new["note"] = draw(note)
    old = None if new_key is None or new_key == key else {"id": key}
    return Chg("U", commit_lsn, tx_order, new=new, old=old, old_key_only=old is not None, toast=toast)


@st.composite
def histories(draw: Any) -> list[Chg]:
    changes = []
    for tx in range(draw(st.integers(1, 5))):
        for order in range(draw(st.integers(1, 5))):
            changes.append(draw(change(1000 + 100 * tx, order)))
    return changes


def model(rows: list[dict[str, Any]]) -> list[tuple]:
    """The net change per key of staged rows (op, positions, images), as ``compact``'s output rows."""
    events: dict[int, list[dict[str, Any]]] = {}

    def add(key: int, **event: Any) -> None:
        events.setdefault(key, []).append(event)

    for r in sorted(rows, key=lambda r: (r["commit_lsn"], r["tx_order"], r["lsn"])):
        op, old, new, keep = r["op"], r["old"], r["new"], tuple(r["new_unchanged_toast"] or ())
        seq = (r["commit_lsn"], r["tx_order"])
        if op == "D":
            add(old["id"], kind="D", seq=(*seq, 0), lsn=r["lsn"], keep=(), away=False, frm=None, values={})
        elif old is not None and old["id"] != new["id"]:  # a key change: delete there, insert here
            add(old["id"], kind="D", seq=(*seq, 0), lsn=r["lsn"], keep=(), away=True, frm=None, values={})
            add(new["id"], kind="I", seq=(*seq, 1), lsn=r["lsn"], keep=keep, away=False, frm={"id": old["id"]},
                values=new)
        else:
            add(new["id"], kind=op, seq=(*seq, 1), lsn=r["lsn"], keep=keep, away=False, frm=None, values=new)
    out = []
    for key, evs in events.items():
        evs.sort(key=lambda e: (e["seq"], e["lsn"]))
        deletes = [i for i, e in enumerate(evs) if e["kind"] == "D"]
        after = evs[deletes[-1] + 1:] if deletes else evs
        kind = "D" if not after else "R" if deletes else "I" if after[0]["kind"] == "I" else "U"
        values, unknown = {}, []
        for c in VALUES:
            knowing = [e for e in after if c not in e["keep"]]
            values[c] = knowing[-1]["values"].get(c) if knowing else None
            if not knowing:
                unknown.append(c)
        touched = any(e["away"] for e in evs[1:])
        frm = after[0]["frm"] if kind in ("I", "R") else None
        out.append((kind, [] if kind == "D" else unknown, evs[-1]["lsn"], frm, touched, key,
                    values["grp"], values["note"]))
    return sorted(out, key=repr)


# Cases per example, staged as one batch keyed by (id, case) (tests/support/case_union.py).
CASES_PER_EXAMPLE = 4


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(histories(), min_size=CASES_PER_EXAMPLE, max_size=CASES_PER_EXAMPLE))
def test_compact_gives_the_models_net_change_per_key(spark, tmp_path_factory, cases):
    """8 examples of 4 histories each: 32 histories compared, more than the 25 examples of one each did, with one
    Spark query per example over their union; the model reads each history's own staged rows."""
    root = tmp_path_factory.mktemp("compact")
    union = write_union(root, ITEMS, dict(enumerate(cases)))
    columns = (*COLS, CASE)
    net = (read_changes(spark, union, ITEMS.name).transform(resolve_toast_from_old(columns, case_key(("id",))))
           .transform(project_columns(columns)).transform(to_key_events(case_key(("id",)), columns))
           .transform(compact(case_key(("id",)), columns)))
    got = by_case({"kind": r["_pgl_kind"], "keep": list(r["_pgl_keep"]), "lsn": r["_pgl_lsn"],
                   "from": r["_pgl_from"] and {"id": r["_pgl_from"]["id"]}, "touched": r["_pgl_touched"],
                   "id": r["id"], "grp": r["grp"], "note": r["note"], CASE: r[CASE]} for r in net.collect())
    assert set(got) <= set(range(len(cases))), "Spark rows outside the compared cases"
    for case, changes in enumerate(cases):
        batch = write_case(root, ITEMS, changes, case)
        staged = [{k: r[k] for k in ("op", "commit_lsn", "tx_order", "lsn", "old", "new", "new_unchanged_toast")}
                  for r in pq.read_table(f"{batch.ref.path}/{batch.table_files[ITEMS.name][0]}").to_pylist()]
        assert got.get(case, []) == model(staged), f"case {case}"
