"""Profile the PostgreSQL target's Spark stage per batch: driver phases and CPU per process, robust to machine load.

Wall seconds on the shared development machine are several times their idle value; CPU seconds are not.
For every batch of every staging root given, in one Spark session (so the first batch is the cold one):

* driver phases before the first Spark job: building the net frame (``BatchChanges.net``: staged read, shared
  transforms, ``keys_never_repeat``), building the COPY-text frame (``copy_columns``), analysis, optimisation,
  physical planning and code generation (``toRdd``, which under adaptive execution also runs the shuffle's map
  stages: a batch with compaction's shuffle spends its scan and transforms there), each timed on the driver;
* the execution (Spark job + executors' COPY + ANALYZE), with the CPU seconds it cost the Spark JVM (all its
  threads: tasks, JIT compiler, GC), the Python workers (``mapInArrow``), PostgreSQL (COPY) and the driver's Python.

Staging roots come from ``--stage N``: the big workload (``benchmarks/apply.py --workload big``) at N changes,
drained either in two batches whose keys never repeat (``--kind unique``: the inserts, then the UPDATE and DELETE)
or in one batch with repeated keys (``--kind repeated``), or the filtered workload (``--kind filtered``, one batch;
apply it with ``--filtered``), into ``--out DIR`` (kept, for A/B runs of two commits on the same staged data).
Examples::

    python benchmarks/stage_profile.py --stage 7000 --kind unique --out /tmp/s-small
    python benchmarks/stage_profile.py --stage 350000 --kind unique --out /tmp/s-350k
    python benchmarks/stage_profile.py /tmp/s-small /tmp/s-350k     # small first: the 350k batches run warm
    python benchmarks/stage_profile.py --stage 375000 --kind filtered --out /tmp/s-f375k
    python benchmarks/stage_profile.py --filtered /tmp/s-f375k /tmp/s-f375k  # cold, then warm

A table-batch on the direct path (``apply/direct.py``: no transform needed, printed from the staged files by the
executors) records ``"path": "direct"`` and only its execution; ``PGLOGICAL_APPLY_DIRECT=0`` profiles the Spark
path for an A/B on the same staged data.

``--event-log DIR`` keeps Spark's event log (task CPU per stage: ``benchmarks/spark_events.py``);
``--java-options`` passes ``spark.driver.extraJavaOptions`` (e.g. ``-XX:TieredStopAtLevel=1``). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from airflow_provider_pglogical.apply.config import ApplyConfig, TableApplyConfig  # noqa: E402
from airflow_provider_pglogical.apply.targets.base import BatchChanges, BatchResult, PlannedBatch  # noqa: E402
from airflow_provider_pglogical.apply.targets.postgres import arrownet  # noqa: E402
from airflow_provider_pglogical.apply.targets.postgres.copy import staging_columns  # noqa: E402
from airflow_provider_pglogical.apply.targets.postgres.copytext import copy_columns  # noqa: E402
from airflow_provider_pglogical.apply.targets.postgres.target import PostgresTarget  # noqa: E402
from airflow_provider_pglogical.apply.targets.postgres.target_types import describe_types  # noqa: E402
from benchmarks.apply import BIG_SCHEMA, FILTER, big_workload, filtered_workload  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[str, int, float, float]]:
    """pid → (command, parent pid, CPU s of itself and its reaped children, CPU s of itself) from /proc."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = [int(x) for x in fields[11:15]]  # utime, stime, cutime, cstime
        out[int(name)] = (stat[stat.index("(") + 1:stat.rindex(")")], int(fields[1]), sum(ticks) / HZ,
                          sum(ticks[:2]) / HZ)
    return out


def cpu_seconds(driver: int, postmaster: int) -> dict[str, float]:
    """CPU seconds so far: the Spark JVM (child of this driver), the Python workers under it, PostgreSQL, the driver."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _, _) in procs.items():
        children.setdefault(parent, []).append(pid)

    def tree(root: int) -> list[int]:
        stack, seen = [root], []
        while stack:
            pid = stack.pop()
            seen.append(pid)
            stack.extend(children.get(pid, []))
        return [p for p in seen if p in procs]

    out = {"jvm": 0.0, "python_workers": 0.0, "postgres": 0.0, "driver_python": 0.0}
    for pid in tree(driver):
        command, _, total, own = procs[pid]
        if pid == driver:
            out["driver_python"] += own
        elif command == "java":
            out["jvm"] += own  # its reaped children are Spark's short-lived helpers, not workers
        else:
            out["python_workers"] += total
    out["postgres"] = sum(procs[pid][2] for pid in tree(postmaster))
    return out


class _TimedChanges:
    """``BatchChanges`` that times how long the net frame takes to build (driver only: no job runs)."""

    def __init__(self, inner: BatchChanges, record: dict[str, Any]) -> None:
        self.inner, self.record = inner, record

    def net(self, table: Any) -> Any:
        t0 = time.monotonic()
        frame = self.inner.net(table)
        self.record["driver_net_frame_s"] = round(time.monotonic() - t0, 2)
        return frame

    def published(self, table: Any) -> Any:
        return self.inner.published(table)

    def direct_net(self, table: Any) -> Any:
        """The direct path's files (``apply/direct.py``; ``PGLOGICAL_APPLY_DIRECT=0`` profiles the Spark path)."""
        direct_net = getattr(self.inner, "direct_net", None)
        return direct_net(table) if direct_net is not None else None

    def ordered(self, table: Any) -> Any:
        return self.inner.ordered(table)


class ProfiledTarget(PostgresTarget):
    """The PostgreSQL target, recording per batch the driver phases and the CPU of the stage."""

    postmaster = 0
    batches: list[dict[str, Any]] = []

    def apply_batch(self, plan: PlannedBatch, changes: BatchChanges) -> BatchResult:
        record: dict[str, Any] = {"batch": f"{plan.start_lsn:X}-{plan.end_lsn:X}"}
        self.batches.append(record)
        result = super().apply_batch(plan, _TimedChanges(changes, record))
        record["seconds"] = result.seconds
        return result

    def _stage(self, planned: Any, target: Any, staging: str, make_frame: Any, *, in_order: bool,
               direct: Any = None) -> tuple[dict[str, int] | None, int | None]:
        record = self.batches[-1]
        types = describe_types(self.conn, staging_columns(target, planned.key, planned.columns))
        if direct is not None and arrownet.plan_direct(direct, types) is not None:
            record["path"] = "direct"  # no frame, no plan: only the execution is timed
            before = cpu_seconds(os.getpid(), self.postmaster)
            t0 = time.monotonic()
            staged = super()._stage(planned, target, staging, make_frame, in_order=in_order, direct=direct)
            after = cpu_seconds(os.getpid(), self.postmaster)
            record["execute_wall_s"] = round(time.monotonic() - t0, 2)
            record["execute_cpu_s"] = {k: round(after[k] - before[k], 2) for k in before}
            return staged
        record["path"] = "spark"
        frame = make_frame()
        t0 = time.monotonic()
        lines, _fields = copy_columns(frame, types)
        t1 = time.monotonic()
        qe = lines._jdf.queryExecution()
        qe.analyzed()
        t2 = time.monotonic()
        qe.optimizedPlan()
        t3 = time.monotonic()
        qe.toRdd()  # physical planning and whole-stage code generation
        t4 = time.monotonic()
        record.update(driver_copy_text_frame_s=round(t1 - t0, 2), driver_analyze_s=round(t2 - t1, 2),
                      driver_optimize_s=round(t3 - t2, 2), driver_physical_codegen_s=round(t4 - t3, 2))
        before = cpu_seconds(os.getpid(), self.postmaster)
        t0 = time.monotonic()
        staged = super()._stage(planned, target, staging, lambda: frame, in_order=in_order)  # plans again: warm
        after = cpu_seconds(os.getpid(), self.postmaster)
        record["execute_wall_s"] = round(time.monotonic() - t0, 2)
        record["execute_cpu_s"] = {k: round(after[k] - before[k], 2) for k in before}
        return staged


def stage(changes: int, kind: str, out: str) -> int:
    """The big workload at ``changes`` changes, drained into ``out``; returns the number of batches. ``kind``
    ``filtered``: ``benchmarks/apply.py``'s filtered workload instead (REPLICA IDENTITY FULL, one batch), to be
    profiled with ``--filtered``."""
    from airflow_provider_pglogical.hooks import PgLogicalHook
    from scripts.harness.pgserver import execute, make_database, start_server, stop_server
    from scripts.harness.subscriber import drain_all

    server = start_server()
    try:
        source = server.dsn(make_database(server))
        full = "ALTER TABLE big REPLICA IDENTITY FULL;" if kind == "filtered" else ""
        execute(source, BIG_SCHEMA + full + "CREATE PUBLICATION pub_all FOR TABLE big;")
        PgLogicalHook.from_dsn(source).create_slot("ours")
        (filtered_workload if kind == "filtered" else big_workload)(source, changes)
        shutil.rmtree(out, ignore_errors=True)
        # unique: the inserts fill the first batch exactly, the UPDATE and the DELETE (disjoint ids) the second
        batch = changes * 4 // 7 if kind == "unique" else 10 * changes
        return drain_all(source, out, max_changes=batch)
    finally:
        stop_server(server)


def profile(roots: list[str], java_options: str, event_log: str | None = None,
            row_filter: str | None = None) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.apply.runner import apply_slot
    from airflow_provider_pglogical.apply.sparkenv import use_package_python
    from scripts.harness.pgserver import execute, make_target, start_server, stop_server

    use_package_python()
    builder = (SparkSession.builder.master("local[2]").appName("pglogical-stage-profile")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.memory", "2g"))
    if event_log:
        Path(event_log).mkdir(parents=True, exist_ok=True)
        builder = builder.config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", event_log)
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    spark = builder.getOrCreate()
    server = start_server()
    ProfiledTarget.postmaster = int(Path(server.data_dir, "postmaster.pid").read_text().split()[0])
    results: dict[str, Any] = {"java_options": java_options, "load_average_at_start": os.getloadavg(), "roots": []}
    try:
        for root in roots:
            _, dsn = make_target(server)
            execute(dsn, BIG_SCHEMA)
            config = ApplyConfig(slot="ours", staging_root=root, tables={"public.big": TableApplyConfig(row_filter=row_filter)})
            ProfiledTarget.batches = []
            t0 = time.monotonic()
            apply_slot(spark, config, target=ProfiledTarget(spark, config, dsn, ["public.big"]))
            results["roots"].append({"root": root, "apply_s": round(time.monotonic() - t0, 2),
                                     "batches": ProfiledTarget.batches})
        results["load_average_at_end"] = os.getloadavg()
        return results
    finally:
        stop_server(server)
        spark.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("roots", nargs="*", help="staging roots to apply, in order (the first runs cold)")
    p.add_argument("--stage", type=int, default=None, help="stage the big workload at this many changes")
    p.add_argument("--kind", choices=("unique", "repeated", "filtered"), default="unique")
    p.add_argument("--out", default=None, help="staging root for --stage")
    p.add_argument("--java-options", default="", help="spark.driver.extraJavaOptions")
    p.add_argument("--event-log", default=None, help="keep Spark's event log here (benchmarks/spark_events.py reads it)")
    p.add_argument("--filtered", action="store_true",
                   help=f"apply with the filtered workload's spec row filter {FILTER!r}")
    args = p.parse_args()
    if args.stage:
        if not args.out:
            p.error("--stage needs --out")
        print(json.dumps({"staged_batches": stage(args.stage, args.kind, args.out), "root": args.out}))
    if args.roots:
        print(json.dumps(profile(args.roots, args.java_options, args.event_log,
                                        FILTER if args.filtered else None), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
