"""A Google service account's JSON key turned into an OAuth access token, without the Google provider.

pyarrow's GCS filesystem takes an access token, not a key: the key signs a JWT (RS256) that the key's own
``token_uri`` exchanges for a token (Google's OAuth 2.0 service-account flow, RFC 7523). Tokens are kept per key
until a few minutes before they expire, so resolving many staged files asks once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta

from airflow_provider_pglogical.exceptions import StagingError

SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
_LIFETIME = 3600  # seconds asked for: Google's maximum
_MARGIN = timedelta(minutes=5)  # a kept token is renewed this long before its expiry

_tokens: dict[str, tuple[str, datetime]] = {}
_lock = threading.Lock()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def parse_key(text: str) -> dict[str, str]:
    """The fields of a service account key; a one-line error naming what is missing (never the key itself)."""
    try:
        key = json.loads(text)
    except ValueError:
        raise StagingError("the Google service account key is not JSON") from None
    missing = [f for f in ("client_email", "private_key") if not isinstance(key, dict) or not key.get(f)]
    if missing:
        raise StagingError(f"the Google service account key has no {', '.join(missing)}: a service account's JSON "
                           f"key file has both")
    return {name: str(value) for name, value in key.items()}


def signed_assertion(key: dict[str, str], now: int) -> str:
    """The JWT the token endpoint exchanges: the account's claims signed with its private key."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    header = {"alg": "RS256", "typ": "JWT", **({"kid": key["private_key_id"]} if key.get("private_key_id") else {})}
    claims = {"iss": key["client_email"], "scope": SCOPE, "aud": key.get("token_uri") or GOOGLE_TOKEN_URI,
              "iat": now, "exp": now + _LIFETIME}
    signing_input = ".".join(_b64(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims))
    private_key = serialization.load_pem_private_key(key["private_key"].encode(), password=None)
    if not isinstance(private_key, rsa.RSAPrivateKey):
        raise StagingError(f"the Google service account key of {key['client_email']} is not an RSA key")
    signature = private_key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + _b64(signature)


def access_token(text: str) -> tuple[str, datetime]:
    """An access token of the service account whose JSON key is ``text``, and its expiry (UTC)."""
    cache_key = hashlib.sha256(text.encode()).hexdigest()
    with _lock:
        kept = _tokens.get(cache_key)
    if kept is not None and kept[1] - _MARGIN > datetime.now(UTC):
        return kept
    key = parse_key(text)
    now = int(time.time())
    body = urllib.parse.urlencode({"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                                   "assertion": signed_assertion(key, now)}).encode()
    uri = key.get("token_uri") or GOOGLE_TOKEN_URI
    request = urllib.request.Request(uri, data=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (the key's own https endpoint)
            answer = json.loads(response.read())
    except (urllib.error.URLError, ValueError) as exc:
        raise StagingError(f"no access token for Google service account {key['client_email']} from {uri}: "
                           f"{getattr(exc, 'code', None) or getattr(exc, 'reason', None) or exc}") from None
    token = answer.get("access_token")
    if not token:
        raise StagingError(f"no access token for Google service account {key['client_email']} from {uri}")
    expiry = datetime.fromtimestamp(now + int(answer.get("expires_in", _LIFETIME)), UTC)
    with _lock:
        _tokens[cache_key] = (token, expiry)
    return token, expiry
