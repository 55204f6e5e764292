"""Property: arbitrary or mutated bytes only ever decode or raise DecodeError, never anything else."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding import ChangeAssembler, parse_message
from airflow_provider_pglogical.exceptions import DecodeError
from tests.support import wire as w
from tests.unit.decoding.test_messages import all_valid_messages

VALID = [data for _, data, _ in all_valid_messages()]
TYPE_BYTES = sorted({d[0] for d in VALID})

# A message pool for the assembler: every kind, in and out of stream, with the relation first.
POOL = [
    w.begin(9, 1), w.commit(9, 10), w.relation(1, "t", w.T_COLUMNS), w.insert(1, w.row(1)),
    w.update(1, w.row(1), w.row(1), "O"), w.delete(1, w.row(1), "K"), w.truncate([1], 3), w.type_(16500, "", "x"),
    w.message("p", b"x", transactional=True), w.message("p", b"x", transactional=False), w.origin("o"),
    w.stream_start(50, True), w.stream_start(50, False), w.stream_stop(), w.stream_commit(50, 9, 10),
    w.stream_abort(50, 51), w.stream_abort(50, 50, 1, 2), w.relation(1, "t", w.T_COLUMNS, xid=50),
    w.insert(1, w.row(2), xid=51), w.insert(1, w.row(3), xid=50), w.truncate([1], 0, xid=51),
    w.begin_prepare(9, 10, 1, "g"), w.prepare(9, 10, 1, "g"), w.prepare(9, 10, 50, "g", kind="p"),
    w.commit_prepared(9, 10, 1, "g"), w.rollback_prepared(9, 10, 1, "g"),
]


@st.composite
def mutated(draw, sources: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(sources)))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "type"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[pos:pos + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[pos:]
        elif op == "type" and data:
            data[0] = draw(st.sampled_from(TYPE_BYTES))
    return bytes(data)


def parses_or_decode_error(data: bytes, in_stream: bool) -> None:
    try:
        parse_message(data, lsn=1, in_stream=in_stream)
    except DecodeError:
        pass


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=64), st.booleans())
def test_random_bytes_only_decode_or_raise_decode_error(data, in_stream):
    parses_or_decode_error(data, in_stream)


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(TYPE_BYTES), st.binary(max_size=80), st.booleans())
def test_random_bodies_behind_every_known_type_only_decode_or_raise_decode_error(t, body, in_stream):
    parses_or_decode_error(bytes([t]) + body, in_stream)


@settings(max_examples=1500, deadline=None)
@given(mutated(VALID), st.booleans())
def test_mutated_valid_messages_only_decode_or_raise_decode_error(data, in_stream):
    parses_or_decode_error(data, in_stream)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(POOL), mutated(POOL)), max_size=40), st.sampled_from([40, 10**6]))
def test_assembler_fed_any_message_sequence_only_raises_decode_error(rows, budget):
    asm = ChangeAssembler(memory_budget=budget)
    try:
        for i, data in enumerate(rows):
            event = asm.feed(i, 1, data)
            if event is not None and hasattr(event, "changes"):
                for change in event.changes:  # unsplit tuples are framed on access: errors surface here
                    for image in (getattr(change, "old", None), getattr(change, "new", None)):
                        if image is not None:
                            _ = image.values
    except DecodeError:
        pass
    finally:
        asm.close()
