"""Object-store credentials of a staging root handed to this process by whoever resolved them, instead of the
environment.

By default pyarrow's S3 filesystem finds its credentials itself (``AWS_*`` variables, ``~/.aws``): the CLI's way.
An Airflow task resolves the spec's ``staging.conn_id`` (``hooks/aws_connection.py``) and registers the result for
the staging root with ``use_credentials``; from then on, in this process, ``staging.layout.resolve_filesystem`` of
any URI under that root builds its filesystem from them. A process started for the apply (spark-submit) gets them
as ``AWS_*`` variables of its environment (``StorageCredentials.environment``), never on a command line.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from airflow_provider_pglogical.exceptions import StagingError

S3_SCHEMES = ("s3", "s3a")


@dataclass(frozen=True)
class StorageCredentials:
    """What an S3-compatible store needs: keys (None: pyarrow's own chain), region and a custom endpoint URL."""

    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None
    endpoint_url: str | None = None

    def s3_filesystem(self) -> pafs.S3FileSystem:
        options: dict[str, str] = {}
        if self.access_key and self.secret_key:
            options.update(access_key=self.access_key, secret_key=self.secret_key)
            if self.session_token:
                options["session_token"] = self.session_token
        if self.region:
            options["region"] = self.region
        if self.endpoint_url:
            endpoint = urlsplit(self.endpoint_url)
            options.update(endpoint_override=endpoint.netloc + endpoint.path.rstrip("/"),
                           scheme=endpoint.scheme or "https")
        return pafs.S3FileSystem(**options)

    def environment(self) -> dict[str, str]:
        """The standard ``AWS_*`` variables for a process of our own (pyarrow and deltalake both read them)."""
        env = {name: value for name, value in (
            ("AWS_ACCESS_KEY_ID", self.access_key), ("AWS_SECRET_ACCESS_KEY", self.secret_key),
            ("AWS_SESSION_TOKEN", self.session_token), ("AWS_REGION", self.region),
            ("AWS_DEFAULT_REGION", self.region), ("AWS_ENDPOINT_URL", self.endpoint_url)) if value}
        if (self.endpoint_url or "").startswith("http://"):
            env["AWS_ALLOW_HTTP"] = "true"
        return env


_registered: dict[str, StorageCredentials] = {}
_lock = threading.Lock()


def _root(uri: str) -> str:
    return uri.rstrip("/") + "/"


@contextmanager
def use_credentials(uri: str, credentials: StorageCredentials) -> Iterator[None]:
    """``credentials`` for every URI under ``uri`` resolved in this process during the block."""
    scheme = urlsplit(uri).scheme
    if scheme not in S3_SCHEMES:
        raise StagingError(f"staging credentials from a connection are for s3:// roots; {uri} is "
                           f"{scheme + '://' if scheme else 'a local path'}: drop the conn_id or use an s3:// root")
    key = _root(uri)
    with _lock:
        previous = _registered.get(key)
        _registered[key] = credentials
    try:
        yield
    finally:
        with _lock:
            if previous is None:
                _registered.pop(key, None)
            else:
                _registered[key] = previous


def _registered_for(uri: str) -> StorageCredentials | None:
    target = _root(uri)
    with _lock:
        roots = [r for r in _registered if target.startswith(r)]
        return _registered[max(roots, key=len)] if roots else None


def process_environment(uri: str) -> dict[str, str]:
    """This process's environment for a helper process of ours that reaches ``uri``: the registered credentials'
    ``AWS_*`` variables on top (the helper has no registry of its own), else the environment as it is."""
    credentials = _registered_for(uri)
    return {**os.environ, **(credentials.environment() if credentials else {})}


def registered_filesystem(uri: str) -> tuple[pafs.FileSystem, str] | None:
    """The filesystem and path of ``uri`` when credentials are registered for a root it lies under, else None."""
    credentials = _registered_for(uri)
    if credentials is None:
        return None
    parts = urlsplit(uri)
    return credentials.s3_filesystem(), (parts.netloc + parts.path).rstrip("/")
