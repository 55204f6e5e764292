"""Operator that spark-submits the apply app for a slot's staged batches into a PostgreSQL target."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

import airflow_provider_pglogical
from airflow_provider_pglogical.apply import jvm_archive
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.apply.sparkenv import LOCAL_DRIVER_CONF, SESSION_CONF, is_local, spark_submit_env
from airflow_provider_pglogical.environ import scoped
from airflow_provider_pglogical.exceptions import ApplyError, SpecError, format_lsn
from airflow_provider_pglogical.history.recorder import Stopwatch, recording
from airflow_provider_pglogical.hooks.airflow_connection import connection_dsn
from airflow_provider_pglogical.hooks.storage_connection import connection_credentials, staging_connection

if TYPE_CHECKING:
    from airflow.sdk import Context

PACKAGE_DIR = Path(airflow_provider_pglogical.__file__).resolve().parent
_REPO_APP = PACKAGE_DIR.parent / "spark_apps" / "apply_batches.py"
DEFAULT_APPLICATION = str(_REPO_APP if _REPO_APP.exists() else PACKAGE_DIR / "apply" / "app.py")
def build_package_zip(directory: str | Path) -> str:
    """Zip the installed ``airflow_provider_pglogical`` package (for ``--py-files``); returns its path."""
    path = Path(directory) / "airflow_provider_pglogical.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(PACKAGE_DIR.rglob("*.py")):
            zf.write(f, Path("airflow_provider_pglogical") / f.relative_to(PACKAGE_DIR))
    return str(path)


def submit_master(conn_id: str | None) -> str:
    """The master of Airflow Spark connection ``conn_id`` (its host: ``local[2]``, ``spark://host:7077``)."""
    from airflow.sdk import BaseHook

    return (BaseHook.get_connection(conn_id).host or "") if conn_id else ""


def submit_secrets(master: str, staging: Mapping[str, str], secrets: Mapping[str, str]) -> dict[str, str]:
    """The secret part of spark-submit's environment: the staging connection's credentials and ``secrets`` (the
    target's). Refused where they would not stay secret or would not both hold: for ``yarn`` and ``k8s://``
    masters Airflow's SparkSubmitHook puts every variable of the environment on spark-submit's command line
    (``spark.yarn.appMasterEnv.*``, ``spark.kubernetes.driverEnv.*``), and one process environment cannot give the
    staging and the target two values of one variable."""
    names = sorted({*staging, *secrets})
    if names and master.startswith(("yarn", "k8s://")):
        raise SpecError(f"spark-submit to {master.split(':', 1)[0]} would put {', '.join(names)} on its command line "
                        "(Airflow's SparkSubmitHook passes the environment there for yarn and k8s masters); apply "
                        "through a standalone or local master, or give the cluster the credentials itself "
                        "(docs/spark.md#cluster-deploy-mode)")
    clash = sorted(k for k in staging.keys() & secrets.keys() if staging[k] != secrets[k])
    if clash:
        raise SpecError(f"staging.conn_id and the target's connection set {', '.join(clash)} to different values, "
                        "and a spark-submit apply has one environment; stage on a store of another kind, or reach "
                        "both with one connection")
    return {**staging, **secrets}


def prepare_submit(op: SparkSubmitOperator, master: str, workdir: str, python: str | None, staging_uri: str,
                   staging_conn_id: str | None, secrets: Mapping[str, str] | None = None) -> dict[str, str]:
    """Settle what every app this package submits needs on ``op`` before its ``execute``: the package zipped into
    ``workdir`` and shipped with ``--py-files``, the interpreter (this one for ``local`` masters), a loopback
    driver for ``local``, the session settings the apply relies on (``SESSION_CONF``: UTC, case-sensitive names).
    Returns the spark-submit process's environment: the interpreter and PATH additions, ``op``'s own ``env_vars``,
    ``staging_conn_id``'s credentials and ``secrets`` (the target's),
    never on the command line (``submit_secrets``)."""
    op.py_files = ",".join(p for p in [build_package_zip(workdir), op.py_files] if p)
    op.conf = dict(op.conf or {})
    interpreter = python or (sys.executable if is_local(master) else None)
    if interpreter:
        op.conf.setdefault("spark.pyspark.python", interpreter)
        op.conf.setdefault("spark.pyspark.driver.python", interpreter)
    if is_local(master):
        for key, value in LOCAL_DRIVER_CONF.items():
            op.conf.setdefault(key, value)
        op.conf = jvm_archive.driver_conf(master, op.conf, {**os.environ, **(op.env_vars or {})})
    op.conf.update(SESSION_CONF)  # over a caller's: what the apply's exactness rests on
    staging = connection_credentials(staging_uri, staging_conn_id).environment() if staging_conn_id else {}
    return {**spark_submit_env(master, python), **(op.env_vars or {}),
            **submit_secrets(master, staging, secrets or {})}


class PgLogicalApplyOperator(SparkSubmitOperator):
    """Apply every staged batch of a slot past the target's watermarks (exactly once, idempotent).

    With ``apply_in_worker`` (the default) the batches that need no Spark are applied in this worker first, by the
    same runner the app runs (``apply/without_spark.py``: the direct path and the in-process kernels), up to the
    first step that needs a Spark frame; only then, for the batches from there on, is the app spark-submitted. A
    run whose batches need no Spark (and a run with nothing to apply) starts no JVM.

    Runs ``spark_apps/apply_batches.py`` through spark-submit on the Spark connection
    (``local[*]`` or a standalone ``spark://`` master alike). The package is zipped at execute
    time and shipped with ``--py-files``; no jar is needed (executors COPY through psycopg2).
    The target DSN goes to the spark-submit process as an environment variable, never into its
    command line or logs; client deploy mode is therefore required.

    :param slot: replication slot whose staged batches are applied (templated)
    :param staging_uri: staging root, local path or pyarrow filesystem URI (templated)
    :param target_conn_id: Airflow Postgres connection of the target database
    :param tables: source ``schema.table`` → :class:`TableApplyConfig` or its dict form; empty:
        every staged table with defaults (templated)
    :param max_batches: apply at most this many batches (templated)
    :param write_partitions: executor partitions writing staging tables (default: Spark's)
    :param python: interpreter for driver and executors (default for ``local`` masters: this one)
    :param dsn_env: name of the environment variable carrying the DSN
    :param bookkeeping_schema: schema of the progress, rejects and staging tables (default: the
        one holding ``pglogical_progress``, else the first target schema the role can create in)
    :param source_conn_id: Airflow connection of the source database, only to name the source
        tables in OpenLineage inputs (nothing connects to it)
    :param staging_conn_id: Airflow connection whose credentials reach an object-store staging root (AWS for
        ``s3://``, Google Cloud for ``gs://``, ``wasb``/``adls`` for ``abfs://``/``az://``); they go to the
        spark-submit process as environment variables (default: the worker's own)
    :param session_replication_role: ``replica`` applies like a native subscriber (the target's foreign
        keys and ordinary triggers do not fire; needs superuser or ``SET ON PARAMETER session_replication_role``);
        default ``origin``
    :param apply_in_worker: apply in this worker what needs no Spark before spark-submitting the rest (default);
        False: every batch through spark-submit, no apply work (target COPYs, in-process netting) in the worker

    After the apply (either route, or both), each batch's numbers (rows per target table, durations) go to
    Airflow's ``Stats`` and the log (``metrics/batches.py``), outlet Assets made with
    :func:`~airflow_provider_pglogical.assets.pglogical.target_table_asset` get the rows applied
    as event extras, and :meth:`get_openlineage_facets_on_complete` reports source → target tables.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "slot", "staging_uri", "tables",
                                      "max_batches")

    def __init__(self, *, slot: str, staging_uri: str, target_conn_id: str = "postgres_default",
                 tables: Mapping[str, TableApplyConfig | Mapping[str, Any]] | None = None,
                 max_batches: int | str | None = None, write_partitions: int | None = None,
                 python: str | None = None, dsn_env: str = "PGLOGICAL_TARGET_DSN",
                 application: str = DEFAULT_APPLICATION, conn_id: str = "spark_default",
                 name: str = "pglogical-apply", source_conn_id: str | None = None,
                 bookkeeping_schema: str | None = None, session_replication_role: str = "origin",
                 staging_conn_id: str | None = None, apply_in_worker: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("deploy_mode", "client")  # the DSN reaches the driver as this process's environment
        super().__init__(application=application, conn_id=conn_id, name=name, **kwargs)
        self.slot = slot
        self.staging_uri = staging_uri
        self.target_conn_id = target_conn_id
        self.tables = tables
        self.spark_conn_id = conn_id
        self.max_batches = max_batches
        self.write_partitions = write_partitions
        self.python = python
        self.dsn_env = dsn_env
        self.source_conn_id = source_conn_id
        self.bookkeeping_schema = bookkeeping_schema
        self.session_replication_role = session_replication_role
        self.staging_conn_id = staging_conn_id
        self.apply_in_worker = apply_in_worker

    @property
    def table_configs(self) -> dict[str, TableApplyConfig]:
        """``tables`` (rendered: it is templated) as configs; empty: every staged table with defaults."""
        return {source: given if isinstance(given, TableApplyConfig) else TableApplyConfig.from_dict(dict(given))
                for source, given in (self.tables or {}).items()}

    def _tables_json(self) -> str:
        out = {source: {k: v for k, v in vars(cfg).items() if v is not None}
               for source, cfg in self.table_configs.items()}
        return json.dumps(out, sort_keys=True)

    def application_arguments(self) -> list[str]:
        args = ["--slot", self.slot, "--staging-root", self.staging_uri, "--tables-json", self._tables_json(),
                "--dsn-env", self.dsn_env]
        if self.max_batches not in (None, "", "None"):
            args += ["--max-batches", str(int(self.max_batches))]
        if self.bookkeeping_schema:
            args += ["--bookkeeping-schema", self.bookkeeping_schema]
        if self.write_partitions:
            args += ["--write-partitions", str(self.write_partitions)]
        if self.session_replication_role != "origin":
            args += ["--session-replication-role", self.session_replication_role]
        return args

    # SparkSubmitOperator.execute returns None; this one returns the run's summary as its XCom.
    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        from airflow.sdk import BaseHook

        target = BaseHook.get_connection(self.target_conn_id)
        if not target.host:
            raise ApplyError(f"connection {self.target_conn_id} has no host")
        workdir = tempfile.mkdtemp(prefix="pglogical-apply-")
        try:
            report = Path(workdir) / "batches.jsonl"
            # One record in the slot's run history (docs/staging-format.md#run-history), failed runs included.
            with (staging_connection(self.staging_uri, self.staging_conn_id),
                  recording(self.staging_uri, self.slot, "apply", tool="airflow", log=self.log.warning) as record):
                watch = Stopwatch()
                here: list[dict[str, Any]] = []
                try:
                    # The spark-submit is prepared only when a batch needs it: a run the worker applies whole
                    # neither needs a Spark connection nor touches anything of a JVM.
                    if self._apply_here(here):
                        master = submit_master(self.spark_conn_id)
                        self.application_args = [*(self.application_args or []), *self.application_arguments(),
                                                 "--report-file", str(report)]
                        self.env_vars = prepare_submit(self, master, workdir, self.python, self.staging_uri,
                                                       self.staging_conn_id,
                                                       {self.dsn_env: connection_dsn(self.target_conn_id)})
                        super().execute(context)
                finally:
                    # Batches committed before a failure still count: report them either way, once each.
                    reports = merged_reports(here, read_batch_reports(report))
                    self._report_batches(reports)
                    applied = [r for r in reports if r["applied"]]
                    record.applied(batches_applied=len(applied), seconds=watch.seconds,
                                   rows={table: {"written": n} for table, n in applied_rows(reports).items()},
                                   lsns=[(int(r["start_lsn"]), int(r["end_lsn"])) for r in applied])
            self._emit_asset_events(context, reports)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return {"batches": len(reports), "applied": sum(bool(r["applied"]) for r in reports),
                "rows": applied_rows(reports)}

    def _apply_here(self, reports: list[dict[str, Any]]) -> bool:
        """The in-worker apply (``apply_in_worker``), its batch reports appended to ``reports`` as they commit;
        whether a spark-submit is still needed (always without it)."""
        if not self.apply_in_worker:
            self.log.info("apply_in_worker is off: every batch through spark-submit")
            return True
        from airflow_provider_pglogical.apply.app import parse_args, report_line, summary_line
        from airflow_provider_pglogical.apply.without_spark import apply_without_spark

        config = parse_args(self.application_arguments())  # the submitted app's own reading of its arguments
        # The variables the submitted app would get (``env_vars``: libpq's PGOPTIONS, PGSSLMODE…) hold here too, so
        # both routes reach the target alike.
        from airflow_provider_pglogical.apply.batches import is_local as local_staging

        # Local staging is read here whatever the master: no connection to look up for it.
        master = None if local_staging(config.staging_root) else self._known_master()
        with scoped(self.env_vars or {}):
            result = apply_without_spark(config, connection_dsn(self.target_conn_id), master=master,
                                         on_batch=lambda r: reports.append(json.loads(report_line(r))))
        applied = sum(bool(r["applied"]) for r in reports)
        self.log.info("%s", summary_line(self.slot, result.summary))  # the line the submitted app prints
        if result.needs_spark:
            self.log.info("slot %s: %d batch(es) applied in the worker; a step of the next one needs Spark: "
                          "spark-submit for the rest", self.slot, applied)
        else:
            self.log.info("slot %s: %d batch(es) applied in the worker, no spark-submit: no step needed Spark",
                          self.slot, applied)
        return result.needs_spark

    def _known_master(self) -> str | None:
        """The Spark connection's master when it names one on this machine (a local one lets the worker read staging
        on an object store itself, as that driver would on this machine), else None: not known to be local.

        Airflow's SparkSubmitHook builds its master from the connection: the host alone only for a ``spark``
        connection without a port; else ``type://host`` and ``:port`` appended (``spark://localhost:7077`` given as
        a URI has host ``localhost`` and port 7077), never a local master."""
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        if not self.spark_conn_id:
            return None
        try:
            conn = BaseHook.get_connection(self.spark_conn_id)
        except AirflowNotFoundException:
            return None
        if conn.port or conn.conn_type != "spark":
            return None
        return conn.host or None

    def _report_batches(self, reports: list[dict[str, Any]]) -> None:
        from airflow_provider_pglogical.metrics.batches import apply_metrics_from_report, emit_apply_batch

        for r in reports:
            emit_apply_batch(apply_metrics_from_report(self.slot, r), self.log.info)
        self._lineage_rows = applied_rows(reports)
        self._lineage_target = _connection(self.target_conn_id)

    def _emit_asset_events(self, context: Context, reports: list[dict[str, Any]]) -> None:
        """Extras (rows applied, last LSN) on every outlet that is one of this slot's target-table Assets."""
        from airflow.sdk import Asset

        from airflow_provider_pglogical.assets.pglogical import parse_asset_uri

        rows = applied_rows(reports)
        applied = [r for r in reports if r["applied"]]
        for outlet in self.outlets or []:
            if not isinstance(outlet, Asset) or not outlet.uri.startswith("pglogical://"):
                continue
            ref = parse_asset_uri(outlet.uri)
            if ref.kind != "target" or ref.slot != self.slot:
                continue
            context["outlet_events"][outlet].extra = {
                "table": ref.qualified_name, "rows": rows.get(ref.qualified_name, 0),
                "batches_applied": len(applied),
                "end_lsn": format_lsn(int(applied[-1]["end_lsn"])) if applied else None}

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Inputs: the source tables (with ``source_conn_id``) and their staged change logs; outputs:
        the target tables, each with the rows this run wrote."""
        from airflow_provider_pglogical.lineage.datasets import (
            postgres_authority,
            postgres_table,
            staged_table,
            target_table,
        )
        from airflow_provider_pglogical.lineage.openlineage import operator_lineage

        target = getattr(self, "_lineage_target", None) or _connection(self.target_conn_id)
        rows: dict[str, int] = getattr(self, "_lineage_rows", {})
        info = {"authority": postgres_authority(target.host or "", target.port), "database": target.schema or ""}
        pairs: dict[str, str] = {}  # source table -> target table
        for source, cfg in self.table_configs.items():
            pairs[source] = _qualified(cfg.target or source)
        if not pairs:  # an empty ``tables`` applies every staged table under its own name
            pairs = {table: table for table in rows}
        inputs = [staged_table(self.slot, s) for s in sorted(pairs)]
        if self.source_conn_id:
            source = _connection(self.source_conn_id)
            authority = postgres_authority(source.host or "", source.port)
            inputs = [postgres_table(authority, source.schema or "", s) for s in sorted(pairs)] + inputs
        outputs = {target_table("postgres", t, info): rows.get(t, 0) for t in sorted(set(pairs.values()))}
        return operator_lineage(inputs, outputs)


def _qualified(table: str) -> str:
    # TableApplyConfig.target may be a bare name, which the apply creates in ``public``.
    return table if "." in table else f"public.{table}"


def _connection(conn_id: str) -> Any:
    from airflow.sdk import BaseHook

    return BaseHook.get_connection(conn_id)


def read_batch_reports(path: Path) -> list[dict[str, Any]]:
    """The apply app's per-batch JSON lines ([] when it wrote none)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def merged_reports(here: list[dict[str, Any]], submitted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One report per batch over the two routes, in LSN order: the submitted app lists the batches the worker
    applied again, as not applied (below their watermarks), so a batch applied by either route is reported as
    applied, with that route's numbers. Both routes reporting one batch applied would be a batch applied twice:
    ``ApplyError``, never a silent pick of one."""
    merged = {(int(r["start_lsn"]), int(r["end_lsn"])): r for r in here}
    for r in submitted:
        key = (int(r["start_lsn"]), int(r["end_lsn"]))
        if key in merged and merged[key]["applied"] and r["applied"]:
            raise ApplyError(f"batch {format_lsn(key[0])}-{format_lsn(key[1])} was reported applied both in the "
                             "worker and by the spark-submitted app")
        if key not in merged or not merged[key]["applied"]:
            merged[key] = r
    return [merged[key] for key in sorted(merged, key=lambda k: (k[1], k[0]))]


def applied_rows(reports: list[dict[str, Any]]) -> dict[str, int]:
    """Rows written per target table over the applied batches (rejected rows left out)."""
    rows: dict[str, int] = {}
    for r in reports:
        if r["applied"]:
            for table, counts in (r.get("rows") or {}).items():
                rows[table] = rows.get(table, 0) + sum(n for kind, n in counts.items() if kind != "rejected")
    return rows
