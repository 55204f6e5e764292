"""A Google Cloud connection's service account key (``keyfile_dict``, ``key_path``) reaches staging's filesystem
and a Delta target's options, without the Google provider and without Google: the key is a real RSA key made
here, its ``token_uri`` a token endpoint on 127.0.0.1 that checks the signed assertion as Google's does."""

from __future__ import annotations

import base64
import json
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pyarrow.fs as pafs
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from airflow_provider_pglogical.exceptions import StagingError
from airflow_provider_pglogical.hooks.storage_connection import connection_credentials
from airflow_provider_pglogical.staging import google_key
from airflow_provider_pglogical.staging.credentials import GcsCredentials, gcs_environment

CLIENT_EMAIL = "pglogical@test-project.iam.gserviceaccount.com"


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class TokenEndpoint:
    """Google's token endpoint as far as the JWT-bearer grant goes: verifies the assertion, answers a token."""

    public_key: rsa.RSAPublicKey
    uri: str = ""
    claims: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def service_account() -> Iterator[tuple[dict[str, str], TokenEndpoint]]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    endpoint = TokenEndpoint(private.public_key())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            assert form["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
            header, claims, signature = form["assertion"][0].split(".")
            endpoint.public_key.verify(_unb64(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(),
                                       hashes.SHA256())  # raises on a bad signature: the test then sees a 500
            endpoint.claims.append(json.loads(_unb64(claims)))
            body = json.dumps({"access_token": f"token-{len(endpoint.claims)}", "expires_in": 3599,
                               "token_type": "Bearer"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint.uri = f"http://127.0.0.1:{server.server_address[1]}/token"
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    key = {"type": "service_account", "project_id": "test-project", "private_key_id": "0123abcd",
           "private_key": pem, "client_email": CLIENT_EMAIL, "client_id": "1", "token_uri": endpoint.uri}
    google_key._tokens.clear()
    try:
        yield key, endpoint
    finally:
        server.shutdown()
        server.server_close()
        google_key._tokens.clear()


def connection(monkeypatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_a_keyfile_dict_connection_signs_tokens_for_stagings_filesystem(service_account, monkeypatch):
    key, endpoint = service_account
    connection(monkeypatch, "gcs", conn_type="google_cloud_platform", extra={"keyfile_dict": json.dumps(key)})
    creds = connection_credentials("gs://bucket/staging", "gcs")
    assert isinstance(creds, GcsCredentials) and json.loads(creds.service_account_key or "") == key
    assert creds.project_id == "test-project" and key["private_key"] not in repr(creds)
    assert isinstance(creds.filesystem(), pafs.GcsFileSystem)
    assert len(endpoint.claims) == 1
    claims = endpoint.claims[0]
    assert (claims["iss"], claims["aud"], claims["scope"]) == (CLIENT_EMAIL, endpoint.uri, google_key.SCOPE)
    assert claims["exp"] - claims["iat"] == 3600
    creds.filesystem()
    assert len(endpoint.claims) == 1  # the token is kept until shortly before it expires


def test_a_key_path_connection_reaches_the_filesystem_the_delta_options_and_a_child_processs_environment(
        service_account, monkeypatch, tmp_path):
    key, endpoint = service_account
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(key))
    connection(monkeypatch, "gcs", conn_type="google_cloud_platform",
               extra={"key_path": str(path), "project": "other-project"})
    creds = connection_credentials("gs://bucket/lake", "gcs")
    assert isinstance(creds, GcsCredentials) and creds.project_id == "other-project"
    assert google_key.access_token(creds.service_account_key or "")[0] == "token-1"
    assert json.loads(creds.delta_options()["google_service_account_key"]) == key  # delta-rs signs its own
    assert gcs_environment(creds.environment()) == creds  # spark-submit's and executors' route
    assert len(endpoint.claims) == 1


def test_a_key_the_connection_cannot_give_is_a_one_line_error_naming_the_connection(service_account, monkeypatch,
                                                                                     tmp_path):
    connection(monkeypatch, "missing", conn_type="google_cloud_platform", extra={"key_path": str(tmp_path / "no")})
    with pytest.raises(StagingError, match=f"Google Cloud connection missing: key_path {tmp_path / 'no'} cannot be "
                                           f"read: No such file or directory"):
        connection_credentials("gs://bucket/x", "missing")
    connection(monkeypatch, "garbled", conn_type="google_cloud_platform", extra={"keyfile_dict": "{not json"})
    with pytest.raises(StagingError, match="Google Cloud connection garbled: the Google service account key is not JSON"):
        connection_credentials("gs://bucket/x", "garbled")
    connection(monkeypatch, "listed", conn_type="google_cloud_platform", extra={"keyfile_dict": "[]"})  # JSON, no key
    with pytest.raises(StagingError, match="Google Cloud connection listed: the Google service account key has no "
                                           "client_email, private_key"):
        connection_credentials("gs://bucket/x", "listed")
    key, _ = service_account
    with pytest.raises(StagingError, match=r"^the Google service account key has no client_email"):
        google_key.access_token(json.dumps({**key, "client_email": ""}))
    refused = {**key, "token_uri": "http://127.0.0.1:9/token"}  # nothing listens on the discard port
    with pytest.raises(StagingError, match=f"no access token for Google service account {CLIENT_EMAIL} from "
                                           f"http://127.0.0.1:9/token"):
        google_key.access_token(json.dumps(refused))
