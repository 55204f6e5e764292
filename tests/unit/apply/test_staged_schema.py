"""The schemas the apply builds in this process instead of asking Spark (``staged_schema``) are Spark's own.

``spark_schema`` of a staged row-change file against Spark's Parquet inference of the same file, for staged types
drawn from every built-in type the decoder stages (arrays, ranges and multiranges of them, numerics of every
precision Spark reads); and the frames read with them (``batches.read_changes``, ``copytext.copy_columns``) against
Spark's analysis of the same selections.
"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from airflow_provider_pglogical.apply import batches
from airflow_provider_pglogical.apply.executor_reads import spark_schema
from airflow_provider_pglogical.apply.notes import fold_notes
from airflow_provider_pglogical.apply.sparkenv import SESSION_CONF
from airflow_provider_pglogical.apply.staged_arrow import spark_readable
from airflow_provider_pglogical.apply.targets.postgres import copytext
from airflow_provider_pglogical.decoding.values import oids
from airflow_provider_pglogical.decoding.values.registry import _SIMPLE, codec_for
from airflow_provider_pglogical.staging.schema import row_change_schema
from tests.support.sparkconf import session_conf
from tests.support.stage import ITEMS, Chg, Col, Rel

TYPE_OIDS = sorted({*_SIMPLE, *oids.ARRAY_ELEMENT, *oids.RANGE_SUBTYPE, *oids.MULTIRANGE_RANGE})
NUMERIC_TYPMODS = [-1, *[((p << 16) | s) + 4 for p, s in ((1, 0), (18, 4), (38, 38), (39, 2), (20, 0))]]
READ_BY_DRIVER = ((39 << 16) | 2) + 4  # numeric(39,2): wider than Spark's decimals, not read by its Parquet reader
column_types = st.one_of(
    st.tuples(st.sampled_from(TYPE_OIDS), st.just(-1)),
    st.tuples(st.sampled_from([oids.NUMERIC, 1231]), st.sampled_from(NUMERIC_TYPMODS)),  # numeric, numeric[]
)


# Reader settings a server may have as its defaults, under which Spark's inference types staged columns otherwise
# (a timestamp without time zone as the session's local time, bytes as text): SESSION_CONF pins them back.
OTHER_READER_DEFAULTS = {"spark.sql.parquet.inferTimestampNTZ.enabled": "false",
                         "spark.sql.parquet.binaryAsString": "true"}


@pytest.fixture(scope="module")
def session(spark):
    with session_conf(spark, OTHER_READER_DEFAULTS), session_conf(spark, SESSION_CONF):
        yield spark


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(column_types, min_size=1, max_size=8))
@example([(oid, -1) for oid in TYPE_OIDS] + [(oids.NUMERIC, t) for t in NUMERIC_TYPMODS if t != READ_BY_DRIVER])
def test_the_staged_schema_is_the_one_sparks_parquet_reader_infers(session, tmp_path_factory, columns):
    row = pa.struct([(f"c{i}" if i else "a.b `c`", codec_for(oid, typmod, None).arrow_type)
                     for i, (oid, typmod) in enumerate(columns)])
    path = str(tmp_path_factory.mktemp("staged") / "v1.parquet")
    pq.write_table(row_change_schema(row).empty_table(), path)
    staged = pq.read_schema(path)
    if not spark_readable(staged):  # a numeric wider than 38 digits goes through the driver (staged_arrow)
        return
    assert spark_schema(staged) == session.read.parquet(path).schema


def test_a_type_outside_the_list_leaves_the_schema_to_spark():
    assert spark_schema(pa.schema([("d", pa.duration("us"))])) is None
    assert spark_schema(pa.schema([("t", pa.timestamp("ns"))])) is None
    assert spark_schema(pa.schema([("n", pa.decimal128(5, -2))])) is None
    assert spark_schema(pa.schema([("l", pa.list_(pa.struct([("t", pa.time32("ms"))])))])) is None


PRICED = Rel("public", "priced", (*ITEMS.columns, Col("price", pa.decimal128(10, 2), "numeric(10,2)")))


def test_the_frames_built_with_known_schemas_have_sparks_types(session, changes_frame, monkeypatch):
    given: list[tuple[str, str]] = []
    inferred: list[tuple[StructType, StructType | None]] = []
    parquet = batches._parquet

    def record(df, schema):  # what the selection analyses to, against the schema the client holds for it
        given.append((df.schema.simpleString(), schema.simpleString()))
        return df

    def read(spark, paths, staged):  # the staged files as Spark infers them, against the schema given for them
        found = spark_schema(staged)
        inferred.append((spark.read.parquet(*paths).schema, found))
        return parquet(spark, paths, staged)

    monkeypatch.setattr(batches, "_parquet", read)
    monkeypatch.setattr(batches, "known", record)
    monkeypatch.setattr(copytext, "known", record)
    frame = changes_frame(PRICED, [Chg("I", 0x1100, 0, new={"id": 1, "grp": 2, "note": "a", "price": None}),
                                   Chg("U", 0x1200, 0, new={"id": 1, "grp": 3, "note": "b", "price": Decimal("1.50")})])
    folded = frame.transform(fold_notes)  # the numeric as struct<value, note>: copy_columns' folded branch
    text, fields = copytext.copy_columns(folded.select("_pgl_lsn", "_pgl_commit_time", "_pgl_new", "_pgl_absent",
                                                       F.col("_pgl_new.price").alias("price")))
    assert len(inferred) == 1 and all(spark_read == held for spark_read, held in inferred), inferred
    assert len(given) == 3, given  # the staged file, its selection, the COPY writers' frame
    assert all(analysed == held for analysed, held in given[1:]), given
    assert "decimal(10,2)" in given[2][0], given  # the folded numeric reached the writers as its value
    assert len(text.collect()) == 2 and fields
