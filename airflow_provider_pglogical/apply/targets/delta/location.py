"""Where a Delta target's tables live and how they are opened: one table per target name under the target URI."""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from airflow_provider_pglogical.staging.credentials import S3_SCHEMES, environment_credentials

# Environment variables deltalake (object_store) and pyarrow read themselves; named here only so
# that `storage_options_from_env` can hand the non-secret ones on explicitly.
ENV_OPTIONS = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ALLOW_HTTP", "AWS_S3_ALLOW_UNSAFE_RENAME")


@dataclass(frozen=True)
class DeltaLocation:
    """The target root (local path, ``file://``, ``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``abfss://container@account.dfs.core.windows.net/prefix``, ``az://container/prefix``) and its object-store
    options.

    ``storage_options`` go to deltalake as they are (``AWS_ENDPOINT_URL``, ``AWS_REGION``, …), on top of what the
    credentials give. Credentials come from the process environment (``AWS_*``, read by deltalake itself; the
    GCS and Azure variables staging reads, turned into delta-rs options by ``staging/credentials.py``), which
    the target fills from its Airflow connection around its work — never from a command line.
    """

    uri: str
    storage_options: dict[str, str] = field(default_factory=dict)

    def table_uri(self, target: str) -> str:
        """``<uri>/<schema>/<table>`` with both names URL-quoted (``.`` too, like staging)."""
        schema, _, table = target.partition(".")
        parts = [quote(p, safe="").replace(".", "%2E") for p in (schema, table)]
        return posixpath.join(self.uri.rstrip("/"), *parts)

    @property
    def options(self) -> dict[str, str] | None:
        credentials = environment_credentials(self.uri)  # GCS, Azure
        if credentials is not None:
            return {**credentials.delta_options(), **self.storage_options} or None
        if urlsplit(self.uri).scheme not in S3_SCHEMES:
            return dict(self.storage_options) or None
        opts = {k: os.environ[k] for k in ENV_OPTIONS if k in os.environ}
        opts.update(self.storage_options)
        if opts.get("AWS_ENDPOINT_URL", "").startswith("http://"):
            opts.setdefault("AWS_ALLOW_HTTP", "true")
        # Without a locking provider, S3 has no atomic rename; delta-rs then needs this acknowledged.
        # One writer per slot and table is what the apply guarantees (the slot runs one apply at a time).
        opts.setdefault("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
        return opts

    def open(self, target: str) -> DeltaTable | None:
        try:
            return DeltaTable(self.table_uri(target), storage_options=self.options)
        except TableNotFoundError:
            return None


def app_id(slot: str, target: str) -> str:
    """The Delta app-transaction id that carries a (slot, table) watermark: ``pglogical/<slot>/<target>``."""
    return f"pglogical/{slot}/{target}"


def sync_app_id(slot: str, target: str) -> str:
    """The Delta app-transaction id that carries the sync LSN of the snapshot a table holds:
    ``pglogical-sync/<slot>/<target>`` (set by the snapshot's overwrite commit, with the watermark)."""
    return f"pglogical-sync/{slot}/{target}"


def watermark(location: DeltaLocation, slot: str, target: str) -> int | None:
    """End LSN of the last batch of ``slot`` committed into ``target``, read from the Delta log."""
    table = location.open(target)
    return None if table is None else table.transaction_version(app_id(slot, target))
