"""Where an Iceberg target's tables live: a pyiceberg catalog (SQL on SQLite or PostgreSQL, REST), one table per
target name, and the table properties that carry a slot's watermark and sync mark."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from airflow_provider_pglogical.exceptions import ApplyError
from airflow_provider_pglogical.staging.credentials import AZURE_SCHEMES, GCS_SCHEMES

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

CATALOG_TYPES = ("sql", "rest")  # the catalogs documented (docs/iceberg.md): SQL is embedded, REST passed through
WATERMARK = "pglogical.watermark."  # + slot: table property, end LSN of the last batch committed with the data
SYNC = "pglogical.sync."  # + slot: table property, sync LSN of the snapshot the table holds
# Non-secret environment pyiceberg's S3 FileIO is told explicitly (credentials it reads from the environment).
ENV_PROPERTIES = {"AWS_ENDPOINT_URL": "s3.endpoint", "AWS_REGION": "s3.region"}
# A GCS or Azure warehouse's files go through staging's filesystems (pyiceberg imported only when it loads it).
STORE_IO_IMPL = "airflow_provider_pglogical.apply.targets.iceberg.fileio.StoreFileIO"


@dataclass(frozen=True)
class IcebergLocation:
    """A pyiceberg catalog (``properties``: ``type``, ``uri``, ``warehouse``, …, as ``load_catalog`` takes them) and
    the namespace the target tables go to (None: each target table's own schema, ``public.t`` → ``public.t``).

    Credentials are never among ``properties`` (the spec refuses them): S3 keys come from the process environment
    (``AWS_*``), a GCS or Azure warehouse's from the variables staging reads (``fileio.py``), a catalog
    database's password from the spec's ``${ENV}`` interpolation of its ``uri``.
    """

    properties: dict[str, str]
    namespace: str | None = None
    name: str = "pglogical"
    table_properties: dict[str, str] = field(default_factory=dict)

    def identifier(self, target: str) -> tuple[str, ...]:
        """``schema.table`` → the Iceberg identifier: (namespace levels…, table)."""
        schema, _, table = target.partition(".")
        return (*(self.namespace.split(".") if self.namespace else (schema,)), table)

    def catalog_properties(self) -> dict[str, str]:
        props = dict(self.properties)
        warehouse = props.get("warehouse")
        if warehouse and not urlparse(warehouse).scheme:  # a plain path: pyiceberg wants a URI
            props["warehouse"] = "file://" + os.path.abspath(warehouse)
        for env, prop in ENV_PROPERTIES.items():
            if env in os.environ:
                props.setdefault(prop, os.environ[env])
        if urlparse(props.get("warehouse", "")).scheme in GCS_SCHEMES + AZURE_SCHEMES:
            props.setdefault("py-io-impl", STORE_IO_IMPL)
        return props

    def connect(self) -> Catalog:
        from pyiceberg.catalog import load_catalog

        props = self.catalog_properties()
        if props.get("type") not in CATALOG_TYPES:
            raise ApplyError(f"Iceberg catalog type must be one of {', '.join(CATALOG_TYPES)}, got {props.get('type')!r}")
        if props["type"] == "sql":
            props.setdefault("init_catalog_tables", "true")  # the embedded catalog creates its own two tables
        return load_catalog(self.name, **props)


def open_table(catalog: Catalog, location: IcebergLocation, target: str) -> Table | None:
    """The target table as the catalog holds it now (a fresh load: the current snapshot and properties), or None."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(location.identifier(target))
    except (NoSuchTableError, NoSuchNamespaceError):
        return None


def watermark_key(slot: str) -> str:
    return WATERMARK + slot


def sync_key(slot: str) -> str:
    return SYNC + slot


def lsn_property(properties: Mapping[str, str], key: str) -> int | None:
    value = properties.get(key)
    return None if value is None else int(value)
