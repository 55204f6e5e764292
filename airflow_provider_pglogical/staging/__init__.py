"""Staging: the LSN-keyed Parquet change log (docs/staging-format.md), its writer, reader and drain cycle."""

from airflow_provider_pglogical.staging.layout import StagingLayout
from airflow_provider_pglogical.staging.manifest import Manifest
from airflow_provider_pglogical.staging.reader import (
    BatchRef,
    RelationColumn,
    RelationInfo,
    StagingReader,
    TruncateEvent,
)

__all__ = ["BatchRef", "Manifest", "RelationColumn", "RelationInfo", "StagingLayout", "StagingReader", "TruncateEvent"]
