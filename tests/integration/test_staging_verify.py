"""`pglogical apply` refuses staged batches whose files are not what their manifest records (docs/staging-format.md,
"Verification"): a file swapped in from another batch, a manifest with another end LSN or row count, a deleted
``transactions.parquet``, a truncated Parquet file. Each refusal is one line naming batch and file, exits non-zero,
leaves the target and its watermarks at the last good batch; the staging put right applies exactly once. Local
staging and S3 (moto), through the real console script."""

from __future__ import annotations

import copy
import dataclasses
import json

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import yaml

from airflow_provider_pglogical.snapshot.layout import SnapshotLayout
from airflow_provider_pglogical.staging.layout import StagingLayout
from airflow_provider_pglogical.staging.reader import StagingReader
from scripts.harness.pgserver import drop_database, execute, make_database, query
from tests.integration.test_cli import pglogical
from tests.support.spark import TEST_SPARK_CONF

SLOT = "verify_slot"


class Staging:
    """The pipeline's staging area seen through pyarrow (a local directory or an S3 prefix), to damage it."""

    def __init__(self, uri: str) -> None:
        self.layout = StagingLayout.from_uri(uri, SLOT)
        self.fs = self.layout.fs

    def batches(self) -> list[str]:
        return [ref.path for ref in StagingReader(self.layout).batches()]

    def read(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            data: bytes = f.read()
            return data

    def write(self, path: str, data: bytes) -> None:
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def save(self, directory: str) -> dict[str, bytes]:
        return {info.path: self.read(info.path)
                for info in self.fs.get_file_info(pafs.FileSelector(directory, recursive=True))
                if info.type == pafs.FileType.File}

    def restore(self, directory: str, saved: dict[str, bytes]) -> None:
        for info in self.fs.get_file_info(pafs.FileSelector(directory, recursive=True)):
            if info.type == pafs.FileType.File and info.path not in saved:
                self.fs.delete_file(info.path)
        for path, data in saved.items():
            self.write(path, data)

    def edit_manifest(self, directory: str, change) -> None:
        body = json.loads(self.read(f"{directory}/_manifest.json"))
        change(body)
        self.write(f"{directory}/_manifest.json", json.dumps(body).encode())


def _set_end(body: dict) -> None:
    body["end_lsn_int"] += 8


def _more_rows(body: dict) -> None:
    body["tables"]["public.t"]["rows"] += 1


def damages(staging: Staging, second: str, third: str) -> dict[str, tuple]:
    """name → (damage of the second batch, the file the error must name)."""
    table_file = "tables/public.t/v1.parquet"
    return {
        "swapped from another batch": (
            lambda: staging.write(f"{second}/{table_file}", staging.read(f"{third}/{table_file}")), table_file),
        "wrong end_lsn": (lambda: staging.edit_manifest(second, _set_end), "_manifest.json"),
        "deleted transactions": (lambda: staging.fs.delete_file(f"{second}/transactions.parquet"),
                                 "transactions.parquet"),
        "changed row count": (lambda: staging.edit_manifest(second, _more_rows), "_manifest.json"),
        "truncated parquet": (
            lambda: staging.write(f"{second}/{table_file}", staging.read(f"{second}/{table_file}")[:-100]), table_file),
    }


@pytest.fixture
def make_pipeline(pg_server, pg_dsn, pg_dbname, tmp_path):
    targets = []

    def make(staging_uri: str, **extra) -> dict:
        target = make_database(pg_server)
        targets.append(target)
        execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL)")
        doc = {"source": {"dsn": pg_server.uri(pg_dbname), "publication": "verify_pub", "slot": SLOT,
                          "create": True, "max_changes": 10},
               "staging": {"uri": staging_uri},
               "target": {"kind": "postgres", "dsn": pg_server.uri(target)},
               "tables": {"public.t": {}}, "spark": {"master": "local[1]", "conf": dict(TEST_SPARK_CONF)}, **extra}
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(copy.deepcopy(doc)))
        return {"spec": str(path), "source": pg_dsn, "target": pg_server.dsn(target)}

    yield make
    for target in targets:
        drop_database(pg_server, target)


def insert_transactions(dsn: str, first: int, count: int) -> None:
    for n in range(first, first + count):
        execute(dsn, f"INSERT INTO t SELECT g, 'v' || g FROM generate_series({10 * n}, {10 * n + 9}) g")


def run_scenario(pipeline: dict, staging: Staging, names: list[str], env: dict[str, str] | None = None) -> None:
    spec = pipeline["spec"]
    assert pglogical("decode", "--spec", spec, extra=env).returncode == 0  # creates slot and publication
    insert_transactions(pipeline["source"], 0, 1)
    assert pglogical("run", "--spec", spec, extra=env).returncode == 0  # batch 1, applied
    insert_transactions(pipeline["source"], 1, 3)
    decoded = pglogical("decode", "--spec", spec, extra=env)
    assert decoded.returncode == 0, decoded.stderr[-2000:]
    first, second, third, _fourth = staging.batches()
    first_end = first.rsplit("/", 1)[1].split("-")[1]
    second_name = second.rsplit("/", 1)[1]
    saved = staging.save(second)
    for name in names:
        damage, file = damages(staging, second, third)[name]
        damage()
        result = pglogical("apply", "--spec", spec, extra=env)
        assert result.returncode == 1, (name, result.stderr[-2000:])
        [line] = result.stderr.strip().splitlines()[-1:]
        assert line.startswith("pglogical apply: error: staged batch ") and f"({second_name}): {file} " in line, \
            (name, line)
        assert "Traceback" not in result.stderr, name
        # nothing of the damaged batch (nor anything after it) reached the target
        assert query(pipeline["target"], "SELECT count(*), min(id), max(id) FROM t") == [(10, 0, 9)], name
        # and its watermark stays at the first batch's end (read from the target's progress table, where
        # `pglogical status` reads it; the command itself reports on the last damage below)
        [(mark,)] = query(pipeline["target"], "SELECT end_lsn::text FROM pglogical_progress WHERE slot = %s", (SLOT,))
        assert int(mark.split("/")[0], 16) << 32 | int(mark.split("/")[1], 16) == int(first_end, 16), name
        if name == names[-1]:  # `pglogical status` still reports on damaged staging, with that watermark
            status = pglogical("status", "--spec", spec, extra=env)
            assert status.returncode == 0, status.stderr[-2000:]
            [reported] = json.loads(status.stdout)["target"]["watermarks"].values()
            assert int(reported.split("/")[0], 16) << 32 | int(reported.split("/")[1], 16) == int(first_end, 16), name
        staging.restore(second, saved)
    fixed = pglogical("apply", "--spec", spec, extra=env)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert "applied 3 of 4 staged batches" in fixed.stderr or "applied 3 of 3 staged batches" in fixed.stderr
    assert query(pipeline["target"], "SELECT id, v FROM t ORDER BY id") == \
        query(pipeline["source"], "SELECT id, v FROM t ORDER BY id")
    assert query(pipeline["target"], "SELECT count(*) FROM t") == [(40,)]


def test_damaged_local_staging_is_refused_naming_batch_and_file_and_applies_once_put_right(make_pipeline, tmp_path):
    uri = str(tmp_path / "staging")
    run_scenario(make_pipeline(uri), Staging(uri), list(damages(Staging(uri), "", "")))


def test_damaged_s3_staging_is_refused_naming_batch_and_file_and_applies_once_put_right(make_pipeline, s3):
    uri = f"s3://{s3.bucket}/staging"
    run_scenario(make_pipeline(uri), Staging(uri), ["swapped from another batch", "truncated parquet",
                                                    "deleted transactions"], env=s3.env())


def test_a_damaged_snapshot_is_refused_and_the_resync_its_error_names_puts_it_right(make_pipeline, tmp_path):
    uri = str(tmp_path / "staging")
    pipeline = make_pipeline(uri, snapshot={"initial": True})
    spec = pipeline["spec"]
    execute(pipeline["source"], "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g")
    decoded = pglogical("decode", "--spec", spec)
    assert decoded.returncode == 0, decoded.stderr[-2000:]
    layout = SnapshotLayout.from_uri(uri, SLOT)
    ref = layout.latest("public.t")
    assert ref is not None
    [chunk] = layout.manifest(ref).files
    path = f"{ref.path}/{chunk}"
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-50])
    refused = pglogical("apply", "--spec", spec)
    assert refused.returncode == 1
    [line] = refused.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"pglogical apply: error: staged snapshot of public.t at {ref.lsn >> 32:X}/"
                           f"{ref.lsn & 0xFFFFFFFF:X} ({ref.path.rsplit('/', 1)[1]}): {chunk} has {len(data) - 50} "
                           f"bytes, its manifest records {len(data)}"), line
    assert line.endswith("; stage it again: pglogical resync --table public.t"), line
    assert query(pipeline["target"], "SELECT to_regclass('public.t') IS NULL") == [(True,)]  # nothing created
    # the way out the error names
    resynced = pglogical("resync", "--spec", spec, "--table", "public.t")
    assert resynced.returncode == 0, resynced.stderr[-2000:]
    applied = pglogical("apply", "--spec", spec)
    assert applied.returncode == 0, applied.stderr[-2000:]
    assert query(pipeline["target"], "SELECT id, v FROM t ORDER BY id") == \
        query(pipeline["source"], "SELECT id, v FROM t ORDER BY id")


def test_the_delta_target_refuses_a_damaged_batch_before_its_commit_and_applies_it_once_put_right(spark, tmp_path):
    from airflow_provider_pglogical.apply.config import ApplyConfig
    from airflow_provider_pglogical.apply.runner import apply_slot
    from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
    from airflow_provider_pglogical.apply.targets.delta.target import DeltaTarget
    from airflow_provider_pglogical.exceptions import StagingCorruptError
    from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch
    from tests.unit.apply.delta.test_delta_target import rows_of

    rel = Rel("public", "t", (Col("id", pa.int32(), "integer", True), Col("v", pa.string(), "text")))
    staging = tmp_path / "staging"
    first = write_batch(staging, "s1", BatchSpec(100, 200, {rel: [Chg("I", 150, i, {"id": i, "v": "a"})
                                                                  for i in range(3)]}))
    second = write_batch(staging, "s1", BatchSpec(200, 300, {rel: [Chg("I", 250, i, {"id": 10 + i, "v": "b"})
                                                                   for i in range(5)]}))
    location = DeltaLocation(str(tmp_path / "lake"))
    config = ApplyConfig(slot="s1", staging_root=str(staging), tables={})
    apply_slot(spark, dataclasses.replace(config, max_batches=1), target=DeltaTarget(location, "s1"))  # batch 1
    table_file = "tables/public.t/v1.parquet"
    saved = (second / table_file).read_bytes()
    (second / table_file).write_bytes((first / table_file).read_bytes())  # batch 1's file in batch 2
    with pytest.raises(StagingCorruptError) as info:
        apply_slot(spark, config, target=DeltaTarget(location, "s1"))
    assert info.value.file == table_file and str(info.value).startswith(
        f"staged batch 0/C8-0/12C ({second.name}): {table_file} ")
    assert [r[0] for r in rows_of(location)] == [0, 1, 2]
    assert DeltaTarget(location, "s1").watermarks("s1", ["public.t"]) == {"public.t": 200}
    (second / table_file).write_bytes(saved)
    reports = apply_slot(spark, config, target=DeltaTarget(location, "s1"))
    assert [r.applied for r in reports] == [False, True]  # batch 1 at the watermark already
    assert [r[0] for r in rows_of(location)] == [0, 1, 2, 10, 11, 12, 13, 14]
    assert DeltaTarget(location, "s1").watermarks("s1", ["public.t"]) == {"public.t": 300}
