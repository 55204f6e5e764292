"""Benchmark: the big-transaction apply on a two-worker Spark standalone cluster with S3 staging vs ``local[2]`` with
local staging, side by side in one run.

``benchmarks/apply.py``'s big workload (``--changes``, default 175,000: 100k inserts in one transaction, a
50k-row UPDATE, a 25k-row DELETE) is drained twice from one source, by two slots created before it: into a
local directory and into an S3 bucket (moto's server on 127.0.0.1). Then the same apply (``apply_slot``) runs in
this process, first with a ``local[2]`` session over the local staging, then with a session on a standalone
cluster started here (``scripts/harness/sparkcluster.py``: a master and two workers, one 1-core executor on each,
the workers holding the S3 credentials) over the S3 staging. Both targets are compared with each other.

Prints one JSON object: session start and apply seconds of each, and the ratios cluster / local.

Usage: python benchmarks/cluster.py [--changes 175000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig  # noqa: E402
from airflow_provider_pglogical.apply.runner import apply_slot  # noqa: E402
from airflow_provider_pglogical.hooks import PgLogicalHook  # noqa: E402
from benchmarks.apply import BIG_SCHEMA, big_workload  # noqa: E402
from scripts.harness.pgserver import execute, make_database, make_target, query, start_server, stop_server  # noqa: E402
from scripts.harness.sparkcluster import app_conf, start_cluster  # noqa: E402
from scripts.harness.subscriber import drain_all  # noqa: E402

BUCKET = "pglogical-bench"
S3_ENV = {"AWS_ACCESS_KEY_ID": "bench-key", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_REGION": "us-east-1",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def timed_apply(master: str, conf: dict[str, str], staging: str, slot: str, target: str) -> dict[str, Any]:
    """A session on ``master`` and ``apply_slot`` of every staged batch into ``target``, timed apart; stopped."""
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.sparkenv import LOCAL_DRIVER_CONF, use_package_python

    use_package_python()
    t0 = time.monotonic()
    builder = (SparkSession.builder.master(master).appName("pglogical-bench-cluster")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.memory", "2g"))
    for key, value in {**LOCAL_DRIVER_CONF, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    start_s = time.monotonic() - t0
    config = ApplyConfig(slot=slot, staging_root=staging, tables={"public.big": TableApplyConfig()})
    t0 = time.monotonic()
    reports = apply_slot(spark, config, target)
    apply_s = time.monotonic() - t0
    spark.stop()
    return {"spark_start_s": round(start_s, 2), "apply_s": round(apply_s, 2),
            "batches_applied": sum(r.applied for r in reports)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=175_000)
    args = p.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the S3 server's line per request
    root = Path(tempfile.mkdtemp(prefix="pglogical-bench-cluster-"))
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    s3_env = {**S3_ENV, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    os.environ.update(s3_env)  # the drain and the driver (manifests) reach S3 like the workers do
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    server = start_server()
    cluster = None
    try:
        source = make_database(server)
        src_dsn = server.dsn(source)
        (_, local_target), (_, cluster_target) = make_target(server), make_target(server)
        execute(src_dsn, BIG_SCHEMA + "CREATE PUBLICATION pub_all FOR TABLE big;")
        for dsn in (local_target, cluster_target):
            execute(dsn, BIG_SCHEMA)
        hook = PgLogicalHook.from_dsn(src_dsn)
        hook.create_slot("ours")
        hook.create_slot("ours_s3")
        hook.close()
        counts = big_workload(src_dsn, args.changes)
        local_staging, s3_staging = str(root / "staging"), f"s3://{BUCKET}/staging"
        drain_all(src_dsn, local_staging)
        drain_all(src_dsn, s3_staging, slot="ours_s3")

        local = timed_apply("local[2]", {}, local_staging, "ours", local_target)
        cluster = start_cluster(root / "cluster", env=s3_env)
        on_cluster = timed_apply(cluster.master_url, app_conf(), s3_staging, "ours_s3", cluster_target)
        digest = "SELECT count(*), sum(hashtext(big::text)) FROM big"
        same = query(local_target, digest) == query(cluster_target, digest)
        out = {
            "workload": "big", "changes": sum(counts.values()), "by_op": counts,
            "local_2_local_staging": local, "cluster_2_workers_s3_staging": on_cluster,
            "ratio_cluster_over_local_apply": round(on_cluster["apply_s"] / local["apply_s"], 2),
            "ratio_cluster_over_local_start_plus_apply": round(
                (on_cluster["spark_start_s"] + on_cluster["apply_s"]) / (local["spark_start_s"] + local["apply_s"]), 2),
            "targets_identical": same, "load_average": [round(x, 2) for x in os.getloadavg()],
        }
        print(json.dumps(out, indent=2))
        return 0 if same else 1
    finally:
        if cluster is not None:
            cluster.stop()
        stop_server(server)
        moto.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
