"""The local Spark session is real: it writes and reads Parquet."""


def test_spark_writes_and_reads_parquet(spark, tmp_path):
    path = str(tmp_path / "t.parquet")
    spark.createDataFrame([(1, "a"), (2, None)], "id long, v string").write.parquet(path)
    rows = sorted(spark.read.parquet(path).collect())
    assert [(r.id, r.v) for r in rows] == [(1, "a"), (2, None)]
