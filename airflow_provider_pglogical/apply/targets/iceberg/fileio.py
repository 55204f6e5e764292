"""pyiceberg's Arrow FileIO with staging's GCS and Azure filesystems.

pyiceberg builds its own GCS and Azure filesystems from catalog properties, which can say neither "anonymous" (an
emulator, a public bucket) nor a service account's key, and it takes ``container@account.dfs.core.windows.net``
for an Azure path's container. This FileIO opens ``gs://``, ``abfs[s]://`` and ``az://`` locations with the
filesystem staging builds from the same variables (``staging/credentials.py``: the CLI's environment, or the
target's connection set as variables around its work); every other scheme is pyiceberg's own.
"""

from __future__ import annotations

from pyarrow.fs import FileSystem
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties

from airflow_provider_pglogical.staging.credentials import (
    AZURE_SCHEMES,
    GCS_SCHEMES,
    environment_credentials,
    object_path,
)

STORE_SCHEMES = GCS_SCHEMES + AZURE_SCHEMES


class StoreFileIO(PyArrowFileIO):
    """``PyArrowFileIO`` whose GCS and Azure filesystems come from ``environment_credentials``."""

    @staticmethod
    def parse_location(location: str, properties: Properties = EMPTY_DICT) -> tuple[str, str, str]:
        scheme, netloc, path = PyArrowFileIO.parse_location(location, properties)
        if scheme in STORE_SCHEMES:
            return scheme, netloc, object_path(location)
        return scheme, netloc, path

    def _initialize_fs(self, scheme: str, netloc: str | None = None) -> FileSystem:
        credentials = environment_credentials(f"{scheme}://{netloc or ''}/") if scheme in STORE_SCHEMES else None
        return super()._initialize_fs(scheme, netloc) if credentials is None else credentials.filesystem()
