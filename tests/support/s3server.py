"""A real S3-compatible server for tests: moto's standalone server on 127.0.0.1, a free port, one bucket.

Credentials and the endpoint reach pyarrow (staging) and deltalake (target) the way a deployment
gives them: through the standard AWS environment variables, never through URIs or arguments.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

ACCESS_KEY, SECRET_KEY, REGION = "pglogical-test-key", "pglogical-test-secret", "us-east-1"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
                "AWS_ALLOW_HTTP": "true"}

    def keys(self, prefix: str) -> list[str]:
        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name=REGION)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


@contextmanager
def s3_server(bucket: str | None = None, *, wrap: Callable[[Any], Any] | None = None) -> Iterator[S3Server]:
    """A moto S3 server with one empty bucket. moto keeps its buckets in process-wide state that every server of
    the process shares, so each server gets a bucket of its own name (``lake-<random>``): a test never sees another
    test's objects. ``wrap`` wraps the server's WSGI application (a middleware that sees every request)."""
    bucket = bucket or f"lake-{uuid.uuid4().hex[:12]}"
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    if wrap is not None:
        assert server._server is not None
        server._server.app = wrap(server._server.app)  # werkzeug's handler calls server.app per request
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                     region_name=REGION).create_bucket(Bucket=bucket)
        yield S3Server(endpoint, bucket)
    finally:
        server.stop()


@pytest.fixture
def s3(monkeypatch) -> Iterator[S3Server]:
    """An S3 server for one test, its credentials in this process's environment for the test's duration."""
    with s3_server() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        yield server
