"""Who may use the OpenAI-compatible surfaces (``/v1``, the bare model; ``/agent/v1``, the search
agent): one rule for both, set by ``api_key`` and ``host``."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from llds_server.http import is_loopback


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, as the HTTP edge answers it."""

    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)


def refusal(api_key: str | None, host: str, authorization: str | None, surface: str) -> Refusal | None:
    """None if a request with this ``Authorization`` header may use ``surface``.

    With ``api_key`` set: 401 unless the header is ``Bearer <api_key>`` (compared in constant time).
    Without one: allowed on a loopback ``host``, 403 naming the setting on a host bound beyond it.
    """
    if not api_key:
        if is_loopback(host):
            return None
        return Refusal(
            403,
            f"{surface} is off on a service bound to {host}: set api_key (env LLDS_API_KEY) and send it "
            "as a bearer token",
        )
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), api_key.encode()):
        return None
    return Refusal(
        401,
        "missing or wrong API key (Authorization: Bearer <api_key>)",
        {"WWW-Authenticate": "Bearer"},
    )
