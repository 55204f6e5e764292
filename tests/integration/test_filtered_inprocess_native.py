"""A filtered REPLICA IDENTITY FULL table-batch of more than 100k staged changes, netted in this process (no JVM),
equals a native subscriber of the same filter.

The benchmark's filtered workload at 120k changes (``benchmarks/apply.py --workload filtered``): every UPDATE
flips the parity of ``a`` and so crosses the filter ``a % 2 = 0`` (UPDATE→INSERT/DELETE), every 8th row is
updated twice (keys repeat inside the batch), a quarter is deleted — one staged batch, applied with the default
in-process bound and a Spark session that fails the test if anything asks for it.
"""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.apply.batches import list_batches
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from scripts.harness.pgserver import execute, query
from scripts.harness.subscriber import drain_all, wait_for_subscriber
from tests.integration.test_native_parity import native_and_ours
from tests.support.parity import source_with_slot

SCHEMA = "CREATE TABLE big (id int PRIMARY KEY, a int, b text, c numeric(12,2), d timestamptz);"
SETUP = SCHEMA + """
ALTER TABLE big REPLICA IDENTITY FULL;
CREATE PUBLICATION pub_native FOR TABLE big WHERE (a % 2 = 0);
CREATE PUBLICATION pub_all FOR TABLE big;
"""
INSERTS = 64_000
WORKLOAD = [
    f"INSERT INTO big SELECT g, g % 1000, md5(g::text), (g % 100000) * 0.01, "
    f"'2026-01-01'::timestamptz + g * interval '1 second' FROM generate_series(0, {INSERTS - 1}) g",
    f"UPDATE big SET a = a + 1, d = d + interval '1 day' WHERE id < {INSERTS // 2}",
    "UPDATE big SET a = a + 1, c = c + 1 WHERE id % 8 = 0",
    f"DELETE FROM big WHERE id >= {INSERTS - INSERTS // 4}",
]


def _no_spark() -> object:
    pytest.fail("the in-process netting asked for Spark")


def test_a_filtered_full_identity_batch_above_100k_changes_nets_in_process_like_a_native_subscriber(
        pg_server, tmp_path) -> None:
    with source_with_slot(pg_server, SETUP) as (src, slot), \
            native_and_ours(pg_server, src, slot, SCHEMA, "pub_native") as (native_db, ours):
        for statement in WORKLOAD:
            execute(src, statement)
        uri = str(tmp_path / "staging")
        assert drain_all(src, uri, slot=slot) == 1
        (batch,) = list_batches(uri, slot)
        staged = int(batch.manifest.tables["public.big"]["rows"])
        assert staged == INSERTS + INSERTS // 2 + INSERTS // 8 + INSERTS // 4  # 120,000: above the old bound
        execute(ours, SCHEMA)
        config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.big": TableApplyConfig(row_filter="a % 2 = 0")})
        (report,) = apply_slot(SparkOnDemand(_no_spark), config, ours)
        assert report.applied
        wait_for_subscriber(src, native_db, name=f"n_{slot}")
        sql = "SELECT id, a, b, c, d FROM big ORDER BY id"
        native = query(native_db, sql)
        assert query(ours, sql) == native
        # Not vacuous: the rows the filter selects on the source, among them rows updated once and twice.
        assert len(native) == query(src, "SELECT count(*) FROM big WHERE a % 2 = 0")[0][0] > 10_000
        assert query(native_db, "SELECT count(*) FROM big WHERE id < 32000 AND id % 8 = 0")[0][0] > 0
        assert query(native_db, "SELECT count(*) FROM big WHERE id < 32000 AND id % 8 <> 0")[0][0] > 0
