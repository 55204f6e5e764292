"""A filtered REPLICA IDENTITY FULL table-batch above the in-process bounds is netted in this process in key
partitions spilled to disk (``apply/partitioned.py``), with no JVM, and equals a native subscriber of the same
filter; a failure while spilling, and one while reading a partition back after another partition was already
COPYed, apply nothing, advance nothing and leave no spill file, and the apply run again succeeds.

The workload of ``test_filtered_inprocess_native.py`` (every UPDATE crosses ``a % 2 = 0``, every 8th row updated
twice, a quarter deleted) plus key changes (whose old and new keys land in different partitions) and rows deleted
whose value of a UNIQUE non-key column a new row takes in the same batch (the target applies every partition's
deletes before any upsert). The bounds are set low through the environment so the one batch is netted in several
partitions.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from airflow_provider_pglogical.apply import partitioned
from airflow_provider_pglogical.apply.batches import list_batches
from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig
from airflow_provider_pglogical.apply.runner import apply_slot
from airflow_provider_pglogical.apply.spark_on_demand import SparkOnDemand
from airflow_provider_pglogical.exceptions import ApplyError
from scripts.harness.pgserver import execute, query
from scripts.harness.subscriber import drain_all, wait_for_subscriber
from tests.integration.test_native_parity import native_and_ours
from tests.support.parity import source_with_slot

SCHEMA = "CREATE TABLE big (id int PRIMARY KEY, a int, b text, c numeric(12,2), d timestamptz, u int UNIQUE);"
SETUP = SCHEMA + """
ALTER TABLE big REPLICA IDENTITY FULL;
CREATE PUBLICATION pub_native FOR TABLE big WHERE (a % 2 = 0);
CREATE PUBLICATION pub_all FOR TABLE big;
"""
INSERTS = 16_000
WORKLOAD = [
    f"INSERT INTO big SELECT g, g % 1000, md5(g::text), (g % 100000) * 0.01, "
    f"'2026-01-01'::timestamptz + g * interval '1 second', g FROM generate_series(0, {INSERTS - 1}) g",
    f"UPDATE big SET a = a + 1, d = d + interval '1 day' WHERE id < {INSERTS // 2}",
    "UPDATE big SET a = a + 1, c = c + 1 WHERE id % 8 = 0",
    "UPDATE big SET id = id + 1000000 WHERE id % 10 = 3",  # key changes, some moved twice below
    "UPDATE big SET id = id + 1000000, b = 'moved twice' WHERE id > 1000000 AND id % 20 = 3",
    # A UNIQUE non-key value freed by a DELETE and taken by a new key in the same batch.
    "CREATE TEMP TABLE freed AS SELECT id, a, u FROM big WHERE id % 97 = 5 AND id < 8000",
    "DELETE FROM big WHERE id IN (SELECT id FROM freed)",
    "INSERT INTO big (id, a, b, u) SELECT id + 3000000, a, 'reused', u FROM freed",
    f"DELETE FROM big WHERE id >= {INSERTS - INSERTS // 4} AND id < 1000000",
]
BOUNDS = {"PGLOGICAL_APPLY_INPROCESS_ROWS": "5000", "PGLOGICAL_APPLY_INPROCESS_BYTES": "1000000"}


def _no_spark() -> object:
    pytest.fail("the in-process netting asked for Spark")


def test_a_batch_above_the_bounds_nets_in_key_partitions_like_a_native_subscriber(
        pg_server, tmp_path, monkeypatch) -> None:
    for name, value in BOUNDS.items():
        monkeypatch.setenv(name, value)
    used: list[int] = []
    netted = partitioned.netted

    def counting(*args: Any, **kwargs: Any) -> Any:  # the real netting, its partition count noted
        used.append(kwargs["partitions"])
        return netted(*args, **kwargs)

    monkeypatch.setattr(partitioned, "netted", counting)
    with source_with_slot(pg_server, SETUP) as (src, slot), \
            native_and_ours(pg_server, src, slot, SCHEMA, "pub_native") as (native_db, ours):
        execute(src, ";".join(WORKLOAD))  # one session: the temporary table lives through the statements
        uri = str(tmp_path / "staging")
        assert drain_all(src, uri, slot=slot) == 1
        (batch,) = list_batches(uri, slot)
        assert int(batch.manifest.tables["public.big"]["rows"]) > 5 * int(BOUNDS["PGLOGICAL_APPLY_INPROCESS_ROWS"])
        execute(ours, SCHEMA)
        config = ApplyConfig(slot=slot, staging_root=uri, tables={"public.big": TableApplyConfig(row_filter="a % 2 = 0")})

        # A spill that fails: a typed error, nothing applied, the batch still to apply.
        blocked = tmp_path / "not-a-directory"
        blocked.write_text("")
        monkeypatch.setenv(partitioned.SPILL_SWITCH, str(blocked))
        with pytest.raises(ApplyError, match=r"public\.big: cannot spill \d+ key partitions .*"
                                             "set PGLOGICAL_APPLY_SPILL_DIR to a writable directory"):
            apply_slot(SparkOnDemand(_no_spark), config, ours)
        assert query(ours, "SELECT count(*) FROM big") == [(0,)]
        assert [b.ref for b in list_batches(uri, slot)] == [batch.ref]

        # A partition's spill file lost after the first partition was COPYed into the staging table: a typed error,
        # the target not committed, the batch (and so the slot's confirmed position) not advanced, no spill left.
        spill = tmp_path / "spill"
        spill.mkdir()
        monkeypatch.setenv(partitioned.SPILL_SWITCH, str(spill))
        copied: list[int] = []

        def losing_spill(*args: Any, **kwargs: Any) -> Any:
            parts = counting(*args, **kwargs)
            first = next(parts)
            copied.append(len(first.kind))
            yield first  # its rows go to the COPY; the other partitions' files vanish before they are read
            for directory in spill.iterdir():
                for f in directory.iterdir():
                    os.remove(f)
            yield from parts

        monkeypatch.setattr(partitioned, "netted", losing_spill)
        with pytest.raises(ApplyError, match=r"public\.big: reading key partition \d+ of \d+ of the table-batch back "
                                             r"from .* failed \(No such file or directory\)"):
            apply_slot(SparkOnDemand(_no_spark), config, ours)
        assert copied and copied[0] > 0
        assert query(ours, "SELECT count(*) FROM big") == [(0,)]
        assert query(ours, "SELECT count(*) FROM pglogical_progress") == [(0,)]  # no watermark committed
        assert [b.ref for b in list_batches(uri, slot)] == [batch.ref]
        assert list(spill.iterdir()) == []

        monkeypatch.setattr(partitioned, "netted", counting)
        (report,) = apply_slot(SparkOnDemand(_no_spark), config, ours)
        assert report.applied
        assert len(used) == 3 and used[-1] >= 6  # netted in partitions each time (spill failed, read failed, then done)
        assert list(spill.iterdir()) == []
        wait_for_subscriber(src, native_db, name=f"n_{slot}")
        sql = "SELECT id, a, b, c, d, u FROM big ORDER BY id"
        native = query(native_db, sql)
        assert query(ours, sql) == native
        # Not vacuous: rows updated twice, rows moved by key changes (twice too), a reused UNIQUE value.
        assert len(native) == query(src, "SELECT count(*) FROM big WHERE a % 2 = 0")[0][0] > 2_000
        assert query(native_db, "SELECT count(*) FROM big WHERE id < 8000 AND id % 8 = 0")[0][0] > 0
        assert query(native_db, "SELECT count(*) FROM big WHERE id > 2000000 AND id < 3000000")[0][0] > 0
        assert query(native_db, "SELECT count(*) FROM big WHERE b = 'reused'")[0][0] > 0
