"""What differs across the tested pyspark range (docs/spark.md#versions), on real Spark and PostgreSQL: Spark's
TIME type arrived in 4.1, so staged PostgreSQL ``time`` values apply from 4.1 on and are refused by name on 4.0
(``make test-spark-versions`` runs this module on 4.0.5, the suite on 4.2)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.sparktypes import HAS_TIME_TYPE
from airflow_provider_pglogical.exceptions import ApplyError
from scripts.harness.pgserver import make_target
from scripts.harness.pgserver import query as rows
from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch

PLAIN = Rel("public", "plain", (Col("id", pa.int32(), "integer", True), Col("name", pa.string(), "text")))
OPENING = Rel("public", "opening", (Col("id", pa.int32(), "integer", True),
                                    Col("opens", pa.time64("us"), "time without time zone")), relid=17001)


def test_time_values_apply_where_spark_has_a_time_type_and_are_refused_by_name_where_it_has_not(
        pg_server, spark, tmp_path):
    _, dsn = make_target(pg_server)
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {PLAIN: [Chg("I", 0x110, 0, new={"id": 1, "name": "a"})]}))
    write_batch(tmp_path, "s1", BatchSpec(0x200, 0x300, {OPENING: [
        Chg("I", 0x210, 0, new={"id": 1, "opens": dt.time(9, 30)})]}))
    config = ApplyConfig(slot="s1", staging_root=str(tmp_path))
    if HAS_TIME_TYPE:
        assert len(apply_slot(spark, config, dsn)) == 2
        assert rows(dsn, "SELECT id, opens::text FROM opening") == [(1, "09:30:00")]
        return
    with pytest.raises(ApplyError, match=r"^staged batch 0/200-0/300 .*: tables/public\.opening/v1\.parquet: old\.opens, "
                                         r"new\.opens hold PostgreSQL time values, which Spark 4\.0\.\d+ cannot read "
                                         r".*: apply with pyspark>=4\.1$"):
        apply_slot(spark, config, dsn)
    # The batch before it is applied; the one with the time column is not, and its watermark stays behind it.
    assert rows(dsn, "SELECT * FROM plain") == [(1, "a")]
    assert rows(dsn, "SELECT target_table, end_lsn::text FROM pglogical_progress") == [("public.plain", "0/200")]
