"""Signed admin requests: how the trainer proves a weight notice is its own without sending the token.

The admin token is a shared secret between the trainer and the rollout replicas. The trainer does not
send it: a replica URL comes from Redis, where anyone who can write could register their own server.
Each trainer-to-replica request carries instead an HMAC-SHA256, keyed with the token, over

    llds-admin-v1 \\n <unix time> \\n <nonce> \\n <METHOD> \\n <the URL it was sent to> \\n <sha256 of the body>

in the header ``X-LLDS-Signature: t=<unix time>,n=<nonce>,s=<hex>``. The replica accepts it only
when the URL is one of its own (a notice received by someone else's server is no good anywhere
else), the time is within its window, the nonce is new to it (no replay), and the body is the one
signed. Operators keep ``Authorization: Bearer <token>`` for their own calls.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from urllib.parse import urlsplit

SIGNATURE_HEADER = "X-LLDS-Signature"
_PREFIX = "llds-admin-v1"
_DEFAULT_PORTS = {"http": 80, "https": 443}


class SignatureError(ValueError):
    """A signed admin request that must be refused; the message says why."""


def canonical_url(url: str) -> str:
    """``scheme://host:port/path`` with the scheme and host lower-cased, the port explicit and no
    query: two spellings of the same target sign the same."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise SignatureError(f"not an http(s) URL: {url!r}")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or _DEFAULT_PORTS[scheme]
    return f"{scheme}://{host}:{port}{parts.path or '/'}"


def base_url(url: str) -> str:
    """A replica's base URL in canonical form without its trailing slash (a path prefix, as behind a
    proxy, stays)."""
    return canonical_url(url).rstrip("/")


def _mac(key: str, t: int, nonce: str, method: str, url: str, body: bytes) -> str:
    msg = "\n".join((_PREFIX, str(t), nonce, method.upper(), url, hashlib.sha256(body).hexdigest()))
    return hmac.new(key.encode(), msg.encode(), hashlib.sha256).hexdigest()


def sign(key: str, method: str, url: str, body: bytes, now: float | None = None) -> str:
    """The ``X-LLDS-Signature`` value for sending ``body`` to ``url`` (the full URL, path included)."""
    t = int(time.time() if now is None else now)
    nonce = secrets.token_hex(16)
    return f"t={t},n={nonce},s={_mac(key, t, nonce, method, canonical_url(url), body)}"


_HEADER = re.compile(r"t=(\d{1,12}),n=([0-9A-Za-z]{8,64}),s=([0-9a-f]{64})")


def _parse(header: str) -> tuple[int, str, str]:
    m = _HEADER.fullmatch(header)
    if m is None:
        raise SignatureError(f"malformed {SIGNATURE_HEADER} (want t=<unix time>,n=<nonce>,s=<64 hex>)")
    return int(m.group(1)), m.group(2), m.group(3)


class Verifier:
    """A replica's check of signed admin requests.

    Args:
        key: the admin token.
        origins: base URLs this replica is reached at (its registered URL and any alias); a request
            signed for any other URL is refused.
        window_s: how far the signed time may be from this clock, either way; a nonce is remembered
            this long.
    """

    def __init__(self, key: str, origins: list[str], window_s: float = 120.0):
        self.key = key
        self.origins = {base_url(u) for u in origins}
        self.window_s = window_s
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def verify(self, header: str, method: str, path: str, body: bytes, now: float | None = None) -> None:
        """Raise :class:`SignatureError` unless ``header`` signs this request (``method``, the
        ``path`` it arrived on, ``body``) as sent to one of ``origins`` + ``path``, within the
        window, with a nonce not seen before."""
        now = time.time() if now is None else now
        t, nonce, mac = _parse(header)
        if abs(now - t) > self.window_s:
            raise SignatureError(f"signed {now - t:+.0f} s from this clock (window {self.window_s:g} s)")
        if not any(
            hmac.compare_digest(mac, _mac(self.key, t, nonce, method, canonical_url(o + path), body))
            for o in sorted(self.origins)
        ):
            raise SignatureError(
                "signature does not match (another key, another body, or signed for a URL that is "
                "not this replica's)"
            )
        with self._lock:
            for n in [n for n, until in self._seen.items() if until < now]:
                del self._seen[n]
            if nonce in self._seen:
                raise SignatureError("replayed (nonce already used)")
            self._seen[nonce] = now + self.window_s


def signed(key: str | None, method: str, url: str, payload: object | None) -> tuple[bytes, dict[str, str]]:
    """(body, headers) for sending ``payload`` as JSON to ``url`` signed with ``key``: send exactly
    these bytes. No key: unsigned (the replica's admin routes then refuse)."""
    import json

    body = b"" if payload is None else json.dumps(payload, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json"} if payload is not None else {}
    if key:
        headers[SIGNATURE_HEADER] = sign(key, method, url, body)
    return body, headers
