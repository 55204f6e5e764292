"""The compiled helpers (``decoding._speedups``) against their pure-Python references.

Properties: the binary COPY splitter gives exactly ``split_copy_py``'s rows (or the same error), and
the assembler's compiled path (plain DML taken in C, spill records written and read back in C)
gives exactly the events, changes and errors of the pure-Python row loop, on random message
sequences with random memory budgets (so transactions spill at random points).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding import ChangeAssembler, speedups
from airflow_provider_pglogical.decoding.model import RowChange, TupleData
from airflow_provider_pglogical.decoding.wiretuple import WireTuple
from airflow_provider_pglogical.exceptions import DecodeError
from tests.support import wire as w

needs_compiled = pytest.mark.skipif(speedups.compiled is None, reason="compiled helpers not built")


def test_the_compiled_helpers_are_in_use_where_a_compiler_exists():
    """`pip install` builds _speedups when a C compiler and Python's headers exist; then it must be the one used."""
    compiler = shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc")
    headers = (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()
    if os.environ.get(speedups.PURE_PYTHON_ENV):
        pytest.skip(f"{speedups.PURE_PYTHON_ENV} is set")
    if not (compiler and headers):
        pytest.skip("no C compiler or Python headers: the pure-Python path is expected")
    assert speedups.implementation() == "compiled"


# -- binary COPY splitting ---------------------------------------------------------------------

HEADER = speedups.SIGNATURE + struct.pack("!ii", 0, 0)


def copy_row(lsn: int, xid: int, data: bytes) -> bytes:
    return struct.pack("!hiqiqi", 3, 8, lsn, 8, xid, len(data)) + data


rows_st = st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**32), st.binary(max_size=40)), max_size=20)


def split_both(data: bytes, header: bool) -> tuple[Any, Any]:
    out = []
    for fn in (speedups.compiled.split_copy, speedups.split_copy_py):  # type: ignore[union-attr]
        try:
            out.append(fn(data, header))
        except ValueError as exc:
            out.append(("ValueError", str(exc)))
    return out[0], out[1]


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(rows_st, st.booleans(), st.booleans())
def test_compiled_copy_splitter_equals_the_reference(rows, header, trailer):
    data = (HEADER if header else b"") + b"".join(copy_row(*r) for r in rows) + (b"\xff\xff" if trailer else b"")
    compiled, reference = split_both(data, header)
    assert compiled == reference
    assert reference == ([tuple(r) for r in rows], len(data), trailer)


@needs_compiled
@settings(max_examples=600, deadline=None)
@given(rows_st, st.booleans(), st.data())
def test_compiled_copy_splitter_equals_the_reference_on_damaged_input(rows, header, data):
    raw = bytearray((HEADER if header else b"") + b"".join(copy_row(*r) for r in rows) + b"\xff\xff")
    for _ in range(data.draw(st.integers(1, 3))):
        if not raw:
            break
        pos = data.draw(st.integers(0, len(raw) - 1))
        if data.draw(st.booleans()):
            raw[pos] = data.draw(st.integers(0, 255))
        else:
            del raw[pos:]
    compiled, reference = split_both(bytes(raw), header)
    assert compiled == reference


# -- the assembler's compiled path ----------------------------------------------------------------

OTHER = [("id", w.INT4, -1, 1), ("v", w.TEXT, -1, 0), ("n", w.INT4, -1, 0)]


@st.composite
def plain_dml(draw) -> bytes:
    relid = draw(st.sampled_from([1, 2]))
    values = tuple(draw(st.sampled_from([w.int4(draw(st.integers(-5, 5))), ("n", None), ("u", None),
                                         ("t", draw(st.binary(max_size=6)))]))
                   for _ in range(draw(st.integers(0, 3))))
    image = w.tup(*values)
    if draw(st.integers(0, 60)) == 0:  # a damaged tuple: both paths must fail (or not) alike, later
        image = image[:-1] if image else b"\x00"
    kind = draw(st.sampled_from(["I", "U", "D", "UO"]))
    if kind == "I":
        return w.insert(relid, image)
    if kind == "U":
        return w.update(relid, image)
    if kind == "UO":  # an update with an old image (REPLICA IDENTITY FULL 'O', key change 'K'): two tuples
        old = w.tup(*(draw(st.sampled_from([w.int4(draw(st.integers(-5, 5))), ("n", None), ("u", None),
                                              ("t", draw(st.binary(max_size=6)))]))
                      for _ in range(draw(st.integers(0, 3)))))
        if draw(st.integers(0, 30)) == 0:  # a damaged old tuple, cut short or run long
            old = old[:-1] if draw(st.booleans()) and old else old + b"t"
        return w.update(relid, image, old, draw(st.sampled_from(["K", "O"])))
    return w.delete(relid, image, draw(st.sampled_from(["K", "O"])))


ROW_OTHER = [w.update(1, w.row(1), w.row(1), "O"), w.update(1, w.row(1), w.row(2), "K"), w.truncate([1, 2], 1),
             w.message("p", b"x", transactional=True), w.message("q", b"y", transactional=False), w.origin("o"),
             w.relation(2, "u", OTHER), w.relation(1, "t", w.T_COLUMNS[:1]), w.type_(16500, "", "x")]


@st.composite
def sessions(draw) -> list[bytes]:
    out: list[bytes] = [w.relation(2, "u", OTHER)] if draw(st.integers(0, 30)) == 0 else []  # outside: an error
    final = 0x100
    for xid in range(1, draw(st.integers(1, 4)) + 1):
        final += 0x100
        out.append(w.begin(final, xid))
        if xid == 1:
            out += [w.relation(1, "t", w.T_COLUMNS), w.relation(2, "u", OTHER)]
        for _ in range(draw(st.integers(0, 30))):
            out.append(draw(plain_dml()) if draw(st.integers(0, 7)) else draw(st.sampled_from(ROW_OTHER)))
        out.append(w.commit(final, final + 8))
    if draw(st.integers(0, 5)) == 0:  # one broken message somewhere: both paths must fail alike
        bad = draw(st.sampled_from([b"I\x00", w.insert(3, w.row(1)), w.delete(3, w.row(1), "K"), b"D"]))
        out.insert(draw(st.integers(0, len(out))), bad)
    return out


def image_key(image: Any) -> Any:
    if isinstance(image, WireTuple):
        return ("wire", image.message, image.offset, image.lsn, image.end)
    if isinstance(image, TupleData):
        return ("tuple", image.kinds, image.values)
    return image


def change_key(change: Any) -> Any:
    if type(change) is RowChange:
        return ("row", change.op, change.relation, change.lsn, image_key(change.old), image_key(change.new),
                change.old_key_only)
    return change


def outcome(messages: list[bytes], budget: int, compiled: bool, block: int, spilled: list[int] | None = None) -> list[Any]:
    rows = [(0x1000 + i, 7, data) for i, data in enumerate(messages)]
    got: list[Any] = []
    with ChangeAssembler(memory_budget=budget) as asm:
        try:
            if compiled:
                events = asm.feed_blocks([rows[i:i + block] for i in range(0, len(rows), block)])
            else:
                events = asm._feed_rows_py(rows)
            for event in events:
                changes = getattr(event, "changes", None)
                if spilled is not None and hasattr(changes, "spilled_records"):
                    spilled.append(changes.spilled_records)
                fields = {k: getattr(event, k) for k in getattr(event, "__slots__", ()) if k != "changes"}
                got.append((type(event).__name__, fields,
                            None if changes is None else [change_key(c) for c in changes], len(changes or ())))
        except DecodeError as exc:
            got.append(("error", type(exc).__name__, str(exc)))
        got.append(("relations", asm.relations.to_state()))
    return got


@needs_compiled
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), st.sampled_from([0, 20, 60, 200, 1 << 20]), st.integers(1, 9))
def test_compiled_assembler_path_equals_the_python_row_loop(messages, budget, block):
    compiled = outcome(messages, budget, True, block)
    assert compiled == outcome(messages, budget, False, block)
    COMPLETED[compiled[0][0] == "Transaction"] += 1


COMPLETED = {True: 0, False: 0}


def test_the_property_saw_committed_transactions_not_only_errors():
    """Guards the generator above: a good share of random sessions must decode (else the property compares errors
    only). About half decode; hypothesis's search shifts the share from run to run (143 of 300 was seen), so the
    bar is a fifth, far above the zero a broken generator gives."""
    if speedups.compiled is None:
        pytest.skip("compiled helpers not built")
    if not COMPLETED[True] + COMPLETED[False]:
        test_compiled_assembler_path_equals_the_python_row_loop()
    assert COMPLETED[True] * 5 >= COMPLETED[True] + COMPLETED[False] > 0


@needs_compiled
def test_compiled_path_takes_plain_rows_and_spills_them_like_the_python_loop():
    """A concrete case of the property that surely exercises every branch: in memory, spilling, read back."""
    messages = [w.begin(0x900, 5), w.relation(1, "t", w.T_COLUMNS)]
    messages += [w.insert(1, w.row(i, "v" * (i % 7))) for i in range(300)]
    messages += [w.delete(1, w.row(i), "K") for i in range(50)]
    messages += [w.commit(0x900, 0x908)]
    spilled: list[int] = []
    compiled = outcome(messages, 2000, True, 64, spilled)
    assert compiled == outcome(messages, 2000, False, 64)
    assert compiled[0][0] == "Transaction" and compiled[0][3] == 350 and compiled[0][2][-1][1] == "D"
    assert spilled and 0 < spilled[0] < 350  # part in memory, the rest spilled and read back


# -- spill records and the staged columns ------------------------------------------------------------


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1), st.binary(max_size=30)), max_size=12),
       st.integers(0, 40))
def test_compiled_spill_record_parser_equals_the_python_loop(records, cut):
    import struct as _struct

    blob = b"".join(_struct.pack("!QII", lsn, sub, len(d)) + d for lsn, sub, d in records)
    blob = blob[:max(len(blob) - cut, 0)]
    got, pos = speedups.compiled.spill_records(blob, 0)  # type: ignore[union-attr]
    expected, p = [], 0
    while len(blob) - p >= 16:
        lsn, sub, n = _struct.unpack_from("!QII", blob, p)
        if len(blob) - p - 16 < n:
            break
        expected.append((lsn, sub, blob[p + 16:p + 16 + n]))
        p += 16 + n
    assert (got, pos) == (expected, p)


@needs_compiled
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), st.sampled_from([60, 1 << 20]))
def test_staged_columns_of_the_compiled_writer_path_equal_the_python_path(messages, budget):
    """The writer's row group columns (op, lsn, key_only, both images as Arrow) built by
    ``rowchange_columns`` + ``convert_joined`` equal the attribute-by-attribute path, errors included."""
    from airflow_provider_pglogical.decoding.values import RowImageConverter

    rows = [(0x1000 + i, 7, data) for i, data in enumerate(messages)]
    with ChangeAssembler(memory_budget=budget) as asm:
        try:
            changes = [c for e in asm.feed_rows(rows) for c in getattr(e, "changes", ()) if type(c) is RowChange]
        except DecodeError:
            return
        by_rel: dict[Any, list[RowChange]] = {}
        for c in changes:
            by_rel.setdefault(c.relation, []).append(c)
        for relation, group in by_rel.items():
            conv = RowImageConverter(relation)
            cols = speedups.compiled.rowchange_columns(group, 16)  # type: ignore[union-attr]
            wire = all(isinstance(i, WireTuple | None) for c in group for i in (c.old, c.new))
            assert (cols is not None) == wire  # eagerly decoded images (TupleData) take the Python path
            if cols is None:
                continue
            lsn, ops, keys, old_side, new_side = cols
            assert list(memoryview(lsn).cast("q")) == [c.lsn for c in group]
            assert ops.decode() == "".join(c.op for c in group)
            assert list(keys) == [int(c.old_key_only) for c in group]
            for side, attr in ((old_side, "old"), (new_side, "new")):
                images = [getattr(c, attr) for c in group]
                got = expected = None
                try:
                    expected = conv.convert(images)
                except DecodeError as exc:
                    expected = ("error", str(exc))
                try:
                    got = conv.convert_joined(side, lambda images=images: images)
                except DecodeError as exc:
                    got = ("error", str(exc))
                if isinstance(expected, tuple):
                    assert got == expected
                else:
                    assert not isinstance(got, tuple)
                    assert got.array.equals(expected.array) and got.notes.equals(expected.notes)
                    assert got.unchanged.equals(expected.unchanged)


# -- the writer's runs of one relation ------------------------------------------------------------------


class _ItemsOfItsOwn(list[Any]):
    """A list whose ``[]`` is its own: both scans must read items through it, not the list's array."""

    def __getitem__(self, i: Any) -> Any:
        item = super().__getitem__(i)
        return None if isinstance(item, RowChange) and item.lsn == 13 else item


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "a", "b", "equal_a", "other", "subclass", "own_item"]), max_size=20),
       st.integers(-2, 3) | st.integers(-2, 22), st.sampled_from(["a", "b"]),
       st.sampled_from(["list", "tuple", "list_subclass"]))
@example(["a", "equal_a", "a"], 0, "a", "list")
@example(["a", "own_item", "a"], 0, "a", "list_subclass")
@example(["a", "a"], -1, "a", "tuple")
def test_compiled_relation_run_equals_the_writer_reference(kinds, start, wanted, container):
    """``_speedups.relation_run`` ends a run where ``staging.writer.relation_run_py`` does: at the first change
    that is not a ``RowChange`` (a subclass or another record included) of that very relation object; a relation
    equal to it but another object (``RelationSchema`` compares by value) ends the run too. Both read a list
    subclass through its own ``[]`` and refuse a negative start alike."""
    from airflow_provider_pglogical.decoding.model import ColumnDef, RelationSchema, TruncateChange
    from airflow_provider_pglogical.staging.writer import relation_run_py

    class Derived(RowChange):  # not the exact type: ends a run in both
        __slots__ = ()

    columns = (ColumnDef("id", 23, -1, True),)
    rels = {"a": RelationSchema(1, "public", "a", "d", columns), "b": RelationSchema(2, "public", "b", "d", columns)}
    equal_a = dataclasses.replace(rels["a"])
    assert equal_a == rels["a"] and equal_a is not rels["a"]

    def change(kind: str) -> Any:
        if kind in rels:
            return RowChange("I", rels[kind], 1, None, None)
        if kind == "equal_a":
            return RowChange("I", equal_a, 1, None, None)
        if kind == "subclass":
            return Derived("I", rels["a"], 1, None, None)
        if kind == "own_item":  # a run of "a" in the array, not through the subclass's []
            return RowChange("I", rels["a"], 13, None, None)
        return TruncateChange(1, (), False, False)

    items = [change(k) for k in kinds]
    changes: Any = {"list": list, "tuple": tuple, "list_subclass": _ItemsOfItsOwn}[container](items)
    relation = rels[wanted]
    outcomes = []
    for scan in (speedups.compiled.relation_run, relation_run_py):  # type: ignore[union-attr]
        try:
            outcomes.append(scan(changes, start, relation))
        except ValueError:
            outcomes.append("ValueError")
    assert outcomes[0] == outcomes[1]
    assert (outcomes[1] == "ValueError") == (start < 0)


# -- the replication stream's bound rule ------------------------------------------------------------------

def _xlogdata(lsn: int, payload: bytes) -> bytes:
    return b"w" + struct.pack(">QQQ", lsn, lsn, 0) + payload


def _keepalive(wal_end: int, reply: bool) -> bytes:
    return b"k" + struct.pack(">QQ?", wal_end, 0, reply)


@st.composite
def replication_streams(draw: Any) -> list[bytes]:
    """CopyData of a walsender: transactions (Begin with its commit's start, changes, Commit at its end),
    messages outside them and keepalives between and inside them, LSNs rising as the walsender sends them.

    A keepalive's walEnd is how far the walsender has decoded: at least the end of what it sent before,
    and at most where anything it sends later was decoded (a later transaction's commit start, a later
    message's position); inside a transaction, which is sent once its commit is decoded, at most that
    commit's start."""
    units: list[tuple[int, int, list[bytes]]] = []  # (decoded at, decoded through, messages) per unit
    lsn = draw(st.integers(0, 50))
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):  # a message carries its record's end; its start rides in the payload here
            start = lsn + draw(st.integers(1, 20))
            lsn = start + draw(st.integers(1, 20))
            units.append((start, lsn, [_xlogdata(lsn, b"M\x00" + struct.pack(">Q", start)
                                                 + draw(st.binary(max_size=6)))]))
            continue
        first = lsn + draw(st.integers(1, 20))
        changes = draw(st.integers(0, 3))
        commit = first + changes * 10 + draw(st.integers(1, 10))
        body = [_xlogdata(first, b"B" + struct.pack(">QQI", commit, 0, 7))]
        for i in range(changes):
            body.append(_xlogdata(first + 1 + 10 * i, b"I" + draw(st.binary(max_size=6))))
            if draw(st.integers(0, 5)) == 0:  # sent while the commit is decoded: the walEnd is before it
                body.append(_keepalive(draw(st.integers(lsn, commit)), draw(st.booleans())))
        lsn = commit + draw(st.integers(1, 10))
        body.append(_xlogdata(lsn, b"C\x00" + struct.pack(">QQQ", commit, lsn, 0)))
        units.append((commit, lsn, body))
    out: list[bytes] = []
    through = 0
    for i, (_at, unit_through, body) in enumerate(units + [(0, 0, [])]):
        if draw(st.integers(0, 2)) == 0:
            upper = units[i][0] if i < len(units) else through + 30
            out.append(_keepalive(draw(st.integers(through, upper)), draw(st.booleans())))
        out += body
        through = max(through, unit_through)
    return out


needs_stream_reader = pytest.mark.skipif(speedups.compiled is None or not hasattr(speedups.compiled, "repl_split"),
                                         reason="compiled helpers not built with libpq")


def _positions(messages: list[bytes]) -> list[int]:
    """Every LSN the messages carry (dataStart, a Begin's commit, a keepalive's walEnd) and its neighbours."""
    out = [struct.unpack_from(">Q", m, 1)[0] for m in messages]
    out += [struct.unpack_from(">Q", m, 26 + (m[25:26] == b"M"))[0] for m in messages if m[25:26] in (b"B", b"M")]
    return sorted({p + d for p in out for d in (-1, 0, 1) if p + d >= 0}) or [0]


@needs_stream_reader
@settings(max_examples=500, deadline=None)
@given(replication_streams(), st.data(), st.booleans())
def test_the_compiled_stream_bound_equals_the_python_reference(messages, data, in_tx):
    """``repl_split`` (the rule ``repl_read`` applies while reading) gives ``split_messages``' rows, open
    transaction and stopping point; read on past each keepalive, as the read does, it takes exactly the
    transactions whose commit starts before the bound and the messages whose record starts before it, as the
    peek does, and at most the one message sent next (which then ends the batch at its end, losing nothing).
    The bound is often one of the messages' LSNs (or next to one), where ``>=`` and ``>`` part."""
    from airflow_provider_pglogical.hooks.replication import split_messages

    bound = data.draw(st.one_of(st.integers(0, 400), st.sampled_from(_positions(messages))))

    rest, in_c, in_py, every = list(messages), in_tx, in_tx, []
    while True:
        compiled_rows, in_c, c_state = speedups.compiled.repl_split(rest, bound, in_c)
        rows, in_py, state = split_messages(rest, bound, in_py)
        assert (compiled_rows, in_c, c_state) == (rows, in_py, state)
        every += rows
        if state != "keepalive":
            break
        rest = rest[next(i for i, m in enumerate(rest) if m[:1] == b"k") + 1:]  # the read answers it and goes on
    if not in_tx:  # read to the bound or the stream's end: every transaction committing before it, every message
        def at(data: bytes) -> tuple[bytes, int]:  # a Begin's commit start, a message record's start
            return data[:1], struct.unpack_from(">Q", data, 1 + (data[:1] == b"M"))[0]

        sent = [at(m[25:]) for m in messages if m[25:26] in (b"B", b"M")]
        taken = [at(data) for _, _, data in every if data[:1] in (b"B", b"M")]
        exact = [(kind, pos) for kind, pos in sent if pos < bound]
        assert taken[:len(exact)] == exact
        assert taken[len(exact):] in ([], sent[len(exact):len(exact) + 1]) and all(
            kind == b"M" for kind, _ in taken[len(exact):])


# -- a variable-width column's bytes, gathered without the GIL ------------------------------------------------


def _gather_outcome(gather: Any, data: bytes, starts: Any, lengths: Any, total: int) -> bytes | str:
    try:
        got: bytes = gather(data, starts, lengths, total)
    except ValueError as e:
        return f"ValueError: {e}"
    return got


_MUTATIONS = ("start -1", "start past the end", "length -1", "length past the end", "total +1", "total -1")


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(st.data())
def test_compiled_slice_gather_equals_the_numpy_reference(data):
    """``_speedups.gather_slices`` joins the slices ``vector.gather_slices_py`` joins, and a slice outside the
    buffer or a total that is not the lengths' sum gets the same ValueError from both (never a read past)."""
    import numpy as np

    from airflow_provider_pglogical.decoding.values.vector import gather_slices_py

    buf = data.draw(st.binary(max_size=40))
    slices = []
    for _ in range(data.draw(st.integers(0, 8))):
        s = data.draw(st.integers(0, len(buf)))
        slices.append((s, data.draw(st.integers(0, len(buf) - s))))
    starts = np.array([s for s, _ in slices], dtype=np.int64)
    lengths = np.array([n for _, n in slices], dtype=np.int64)
    total = int(lengths.sum())
    expected = b"".join(buf[s:s + n] for s, n in slices)
    mutation = data.draw(st.sampled_from((None, *_MUTATIONS[:4] * bool(slices), *_MUTATIONS[4:])))
    if mutation is None:
        outcome: bytes | str = expected
    else:  # one slice (or the total) made invalid: both refuse it alike
        i = data.draw(st.integers(0, len(slices) - 1)) if slices else 0
        if mutation.startswith("start"):
            starts[i] = -1 if mutation == "start -1" else len(buf) + 1
        elif mutation.startswith("length"):
            lengths[i] = -1 if mutation == "length -1" else len(buf) - starts[i] + 1
        else:
            total += 1 if mutation == "total +1" else -1
        outcome = _gather_outcome(gather_slices_py, buf, starts, lengths, total)
        assert isinstance(outcome, str), outcome
    if data.draw(st.booleans()):  # int64 arrays at an odd address: the C side reads them unaligned
        starts = np.frombuffer(b"\0" + starts.tobytes(), dtype=np.int64, offset=1)
    c_outcome = _gather_outcome(speedups.compiled.gather_slices, buf, starts, lengths, total)  # type: ignore[union-attr]
    assert c_outcome == _gather_outcome(gather_slices_py, buf, starts, lengths, total) == outcome


@needs_compiled
def test_a_wrong_large_gather_total_is_refused_before_any_allocation():
    """A total far over the slices' sum is a ValueError from both paths, not a MemoryError from allocating it."""
    import numpy as np

    from airflow_provider_pglogical.decoding.values.vector import gather_slices_py

    one = np.array([0], dtype=np.int64), np.array([1], dtype=np.int64)
    for gather in (speedups.compiled.gather_slices, gather_slices_py):  # type: ignore[union-attr]
        with pytest.raises(ValueError, match="the slices hold 1 bytes, not 35184372088832$"):
            gather(b"abc", *one, 1 << 45)
