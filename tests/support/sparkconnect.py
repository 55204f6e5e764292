"""The two parties of a test's S3 staging: a Spark server's executors hold S3 credentials (``EXECUTOR_KEY``) that
the client (the ``pglogical`` process, or a Spark driver) never has (it runs with ``DRIVER_KEY``), and the S3 server
records every request with the key that signed it, so a test can tell who read which object (``S3Requests``).

The Spark Connect server the tests use is the one on the shared two-worker cluster (tests/support/cluster.py,
``spark_connect``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.support.s3server import REGION, SECRET_KEY, S3Server

DRIVER_KEY = "pglogical-driver-key"  # the client's (the pglogical process) credentials
EXECUTOR_KEY = "pglogical-executor-key"  # the Connect server's executors' credentials


def s3_env(s3: S3Server, key: str) -> dict[str, str]:
    """The AWS environment of one party: the test server's endpoint, signed with ``key``."""
    return {**s3.env(), "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}


@dataclass(frozen=True)
class S3Requests:
    """The S3 server's request log (moto's recorder): which access key read which object."""

    s3: S3Server
    path: Path

    def start(self) -> None:
        self.path.write_text("")
        requests.post(f"{self.s3.endpoint}/moto-api/recorder/start-recording", timeout=10).raise_for_status()

    def stop(self) -> None:
        requests.post(f"{self.s3.endpoint}/moto-api/recorder/stop-recording", timeout=10).raise_for_status()

    def reads(self, key: str, part: str) -> int:
        """GET requests signed with ``key`` of objects of published batches whose path contains ``part`` (the
        drain reading back the files it writes into a ``_partial-`` directory does not count)."""
        count = 0
        for line in self.path.read_text().splitlines():
            entry = json.loads(line)
            auth = entry["headers"].get("Authorization", "")
            if (entry["method"] == "GET" and f"Credential={key}/" in auth and part in entry["url"]
                    and "/_partial-" not in entry["url"]):
                count += 1
        return count


@dataclass(frozen=True)
class SparkConnect:
    """A Spark Connect server whose executors hold ``EXECUTOR_KEY``, and the S3 server they read."""

    url: str  # sc://127.0.0.1:port
    s3: S3Server
    requests: S3Requests
