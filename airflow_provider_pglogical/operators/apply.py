"""Operator that spark-submits the apply app for a slot's staged batches into a PostgreSQL target."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

import airflow_provider_pglogical
from airflow_provider_pglogical.apply.config import TableApplyConfig
from airflow_provider_pglogical.exceptions import ApplyError
from airflow_provider_pglogical.hooks.dsn import libpq_dsn

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


class PgLogicalApplyOperator(SparkSubmitOperator):
    """Apply every staged batch of a slot past the target's watermarks (exactly once, idempotent).

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
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "slot", "staging_uri", "tables",
                                      "max_batches")

    def __init__(self, *, slot: str, staging_uri: str, target_conn_id: str = "postgres_default",
                 tables: Mapping[str, TableApplyConfig | Mapping[str, Any]] | None = None,
                 max_batches: int | str | None = None, write_partitions: int | None = None,
                 python: str | None = None, dsn_env: str = "PGLOGICAL_TARGET_DSN",
                 application: str = DEFAULT_APPLICATION, conn_id: str = "spark_default",
                 name: str = "pglogical-apply", **kwargs: Any) -> None:
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

    def _tables_json(self) -> str:
        out = {}
        for source, given in (self.tables or {}).items():
            cfg = given if isinstance(given, TableApplyConfig) else TableApplyConfig.from_dict(dict(given))
            out[source] = {k: v for k, v in vars(cfg).items() if v is not None}
        return json.dumps(out, sort_keys=True)

    def application_arguments(self) -> list[str]:
        args = ["--slot", self.slot, "--staging-root", self.staging_uri, "--tables-json", self._tables_json(),
                "--dsn-env", self.dsn_env]
        if self.max_batches not in (None, "", "None"):
            args += ["--max-batches", str(int(self.max_batches))]
        if self.write_partitions:
            args += ["--write-partitions", str(self.write_partitions)]
        return args

    def execute(self, context: Context) -> None:
        from airflow.sdk import BaseHook

        target = BaseHook.get_connection(self.target_conn_id)
        if not target.host:
            raise ApplyError(f"connection {self.target_conn_id} has no host")
        master = (BaseHook.get_connection(self.spark_conn_id).host or "") if self.spark_conn_id else ""
        workdir = tempfile.mkdtemp(prefix="pglogical-apply-")
        try:
            self.py_files = ",".join(p for p in [build_package_zip(workdir), self.py_files] if p)
            self.application_args = [*(self.application_args or []), *self.application_arguments()]
            self.conf = dict(self.conf or {})
            python = self.python or (sys.executable if master.startswith("local") else None)
            if python:
                self.conf.setdefault("spark.pyspark.python", python)
                self.conf.setdefault("spark.pyspark.driver.python", python)
            self.conf.setdefault("spark.sql.session.timeZone", "UTC")
            self.env_vars = {**(self.env_vars or {}), self.dsn_env: libpq_dsn(target)}
            super().execute(context)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
