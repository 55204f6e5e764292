"""``direct.net_rows`` (what ``arrownet`` prints) against the net-change model of a batch whose keys never repeat,
and the type decisions of ``arrowtext`` against ``copytext``'s (the Spark path's)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from airflow_provider_pglogical.apply import direct
from airflow_provider_pglogical.apply.targets.postgres import arrownet, arrowtext, copytext

KEY = ("id", "k2")
COLUMNS = ("id", "k2", "v")
IMAGE = pa.struct([("id", pa.int32()), ("k2", pa.string()), ("v", pa.string())])
PLAN = arrownet.DirectPlan(KEY, COLUMNS, (arrowtext.PLAIN, arrowtext.TEXT, arrowtext.TEXT),
                           (arrowtext.PLAIN, arrowtext.TEXT), ())


@st.composite
def changes(draw: st.DrawFn) -> list[dict]:
    """Changes whose keys never repeat: each names fresh keys (an UPDATE that moves its row names two)."""
    n = draw(st.integers(0, 30))
    out, next_key = [], 0
    for lsn in range(n):
        op = draw(st.sampled_from(["I", "U", "U_moved", "U_no_old", "D"]))
        key, next_key = (next_key, f"k{next_key}"), next_key + 1
        v = draw(st.one_of(st.none(), st.text(max_size=4)))
        new = {"id": key[0], "k2": key[1], "v": v}
        if op == "I":
            out.append({"op": "I", "lsn": lsn, "old": None, "new": new})
        elif op == "U":
            out.append({"op": "U", "lsn": lsn, "old": {"id": key[0], "k2": key[1], "v": None}, "new": new})
        elif op == "U_no_old":
            out.append({"op": "U", "lsn": lsn, "old": None, "new": new})
        elif op == "U_moved":
            moved, next_key = (next_key, f"k{next_key}"), next_key + 1
            out.append({"op": "U", "lsn": lsn, "old": {"id": moved[0], "k2": moved[1], "v": None}, "new": new})
        else:
            out.append({"op": "D", "lsn": lsn, "old": {"id": key[0], "k2": key[1], "v": None}, "new": None})
    return out


def model(rows: list[dict]) -> list[tuple]:
    """``to_key_events`` + ``single_event_net`` for such changes (``apply/direct.py``)."""
    out = []
    for r in rows:
        old, new = r["old"], r["new"]
        moved = r["op"] == "U" and old is not None and (old["id"], old["k2"]) != (new["id"], new["k2"])
        if r["op"] in ("I", "U"):
            frm = (old["id"], old["k2"]) if moved else (None, None)
            out.append(("I" if r["op"] == "I" or moved else "U", "{}", r["lsn"], *frm, False,
                        new["id"], new["k2"], new["v"]))
        if r["op"] == "D" or moved:
            out.append(("D", "{}", r["lsn"], None, None, False, old["id"], old["k2"], None))
    return sorted(out, key=repr)


@settings(max_examples=60, deadline=None)
@given(changes())
def test_net_rows_are_the_model_s(rows: list[dict]) -> None:
    table = pa.Table.from_pylist(rows, schema=pa.schema([("op", pa.string()), ("lsn", pa.int64()), ("old", IMAGE),
                                                         ("new", IMAGE)]))
    got = [tuple(r.values()) for b in direct.net_rows(table, PLAN.key, PLAN.columns) for r in b.to_pylist()]
    assert sorted(got, key=repr) == model(rows)
    for batch in direct.net_rows(table, PLAN.key, PLAN.columns):  # and they print: one line per row
        assert arrowtext.line_bytes(batch, arrownet._fields(PLAN)).count(b"\n") == batch.num_rows


def test_the_printable_range_is_years_1_to_9999() -> None:
    """The one definition both paths use (``copytext._beyond_arrow``, ``arrownet``'s row-group statistics)."""
    epoch = dt.date(1970, 1, 1)
    first, last = (dt.date(1, 1, 1) - epoch).days, (dt.date(9999, 12, 31) - epoch).days
    assert arrowtext.ARROW_DAYS == (first, last)
    assert arrowtext.ARROW_MICROS == (first * 86_400_000_000, (last + 1) * 86_400_000_000 - 1)


def test_kinds_are_the_spark_path_s() -> None:
    """The staged Arrow type and the Spark type Spark reads it as get the same ``arrowtext`` kind (or none)."""
    pairs = [(pa.string(), T.StringType()), (pa.bool_(), T.BooleanType()), (pa.int8(), T.ByteType()),
             (pa.int16(), T.ShortType()), (pa.int32(), T.IntegerType()), (pa.int64(), T.LongType()),
             (pa.decimal128(12, 2), T.DecimalType(12, 2)), (pa.decimal128(20, 6), T.DecimalType(20, 6)),
             (pa.decimal128(20, 7), T.DecimalType(20, 7)), (pa.float32(), T.FloatType()),
             (pa.float64(), T.DoubleType()), (pa.timestamp("us", "UTC"), T.TimestampType()),
             (pa.timestamp("us"), T.TimestampNTZType()), (pa.date32(), T.DateType()),
             (pa.binary(), T.BinaryType()), (pa.list_(pa.int32()), T.ArrayType(T.IntegerType()))]
    for arrow_type, spark_type in pairs:
        assert arrowtext.arrow_kind(arrow_type) == copytext._arrow_kind(spark_type), arrow_type
    assert arrowtext.arrow_kind(pa.uint32()) is None  # Spark widens it: not the same printing decision
    assert arrowtext.arrow_kind(pa.time64("us")) is None


def test_a_plan_on_an_object_store_refuses_to_be_pickled_for_spark_s_tasks():
    import pickle

    import pyarrow.fs as pafs
    from pyspark import cloudpickle

    from airflow_provider_pglogical.exceptions import ApplyError

    plan = arrownet.DirectPlan(("id",), ("id",), ("int",), ("int",), (("bucket/a.parquet", 0),))
    assert pickle.loads(pickle.dumps(plan)) == plan  # local files: Spark's tasks may be handed them
    local = arrownet.DirectPlan(("id",), ("id",), ("int",), ("int",), (("/a.parquet", 0),), filesystem=pafs.LocalFileSystem())
    assert pickle.loads(pickle.dumps(local)).local
    store = arrownet.DirectPlan(("id",), ("id",), ("int",), ("int",), (("bucket/a.parquet", 0),),
                                filesystem=pafs.S3FileSystem(access_key="AKIA-ID", secret_key="not-to-be-shipped",
                                                             region="us-east-1"))
    for dumps in (pickle.dumps, cloudpickle.dumps):  # cloudpickle: what mapInArrow ships a function's closure with
        with pytest.raises(ApplyError, match=r"^a direct plan of 1 task\(s\) on a s3 filesystem is copied by this "
                                             r"process only") as info:
            dumps(store)
        assert "not-to-be-shipped" not in str(info.value)
