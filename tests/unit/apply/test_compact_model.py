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

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.batches import list_batches, read_changes
from airflow_provider_pglogical.apply.transforms import compact, project_columns, resolve_toast_from_old, to_key_events
from tests.support.stage import BatchSpec, Chg, write_batch
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


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=histories())
def test_compact_gives_the_models_net_change_per_key(spark, tmp_path_factory, changes):
    root = tmp_path_factory.mktemp("compact")
    write_batch(root, "slot", BatchSpec(0x1000, 0x2000, {ITEMS: changes}))
    (batch,) = list_batches(str(root), "slot")
    frame = read_changes(spark, batch, ITEMS.name)
    staged = [{k.removeprefix("_pgl_"): v for k, v in r.asDict(recursive=True).items()}
              for r in frame.select("_pgl_op", "_pgl_commit_lsn", "_pgl_tx_order", "_pgl_lsn", "_pgl_old", "_pgl_new",
                                    "_pgl_new_unchanged_toast").collect()]
    net = (frame.transform(resolve_toast_from_old(COLS, ("id",))).transform(project_columns(COLS))
           .transform(to_key_events(("id",), COLS)).transform(compact(("id",), COLS)))
    got = sorted(((r["_pgl_kind"], list(r["_pgl_keep"]), r["_pgl_lsn"], r["_pgl_from"] and r["_pgl_from"].asDict(),
                   r["_pgl_touched"], r["id"], r["grp"], r["note"]) for r in net.collect()), key=repr)
    assert got == model(staged)
