"""Signed admin requests (llds_proto.admin_auth): what a replica accepts and what it refuses."""

from __future__ import annotations

import pytest

from llds_proto.admin_auth import SignatureError, Verifier, base_url, canonical_url, sign, signed

KEY = "the-admin-token"
ME = "http://127.0.0.1:8001"
BODY = b'{"version":3,"path":"v000003"}'


def test_a_request_signed_for_this_replica_passes_once() -> None:
    v = Verifier(KEY, [ME])
    header = sign(KEY, "POST", ME + "/admin/weights", BODY, now=1000)
    v.verify(header, "POST", "/admin/weights", BODY, now=1001)
    with pytest.raises(SignatureError, match="replayed"):
        v.verify(header, "POST", "/admin/weights", BODY, now=1002)


@pytest.mark.parametrize(
    ("why", "header_for", "method", "path", "body", "now", "match"),
    [
        ("sent to someone else's URL", "http://127.0.0.1:9999/admin/weights", "POST", "/admin/weights", BODY, 1000, "not this replica"),
        ("another route", ME + "/admin/weights", "POST", "/admin/pause", BODY, 1000, "does not match"),
        ("another method", ME + "/admin/weights", "GET", "/admin/weights", BODY, 1000, "does not match"),
        ("another body", ME + "/admin/weights", "POST", "/admin/weights", BODY.replace(b"3", b"4"), 1000, "does not match"),
        ("too old", ME + "/admin/weights", "POST", "/admin/weights", BODY, 1000 + 121, r"signed \+121 s from this clock"),
        ("from the future", ME + "/admin/weights", "POST", "/admin/weights", BODY, 1000 - 121, r"signed -121 s"),
    ],
)  # fmt: skip
def test_refused(
    why: str, header_for: str, method: str, path: str, body: bytes, now: int, match: str
) -> None:
    header = sign(KEY, "POST", header_for, BODY, now=1000)
    with pytest.raises(SignatureError, match=match):
        Verifier(KEY, [ME]).verify(header, method, path, body, now=now)


def test_another_key_and_malformed_headers_are_refused() -> None:
    header = sign("someone-else", "POST", ME + "/admin/weights", BODY, now=1000)
    with pytest.raises(SignatureError, match="does not match"):
        Verifier(KEY, [ME]).verify(header, "POST", "/admin/weights", BODY, now=1000)
    good = sign(KEY, "POST", ME + "/admin/weights", BODY, now=1000)
    for bad in ("", "t=1000", "t=x,n=abcdefgh,s=00", "t=1000,n=../../..,s=00", "Bearer the-admin-token",
                good.replace("t=1000", "t=" + "9" * 400), good[:-1] + "\u00e9", good.replace("n=", "n=\u00e9"),
                good + ",x=1", good.upper()):  # fmt: skip
        with pytest.raises(SignatureError, match="malformed"):
            Verifier(KEY, [ME]).verify(bad, "POST", "/admin/weights", BODY, now=1000)


def test_spellings_of_one_url_sign_alike_and_aliases_count() -> None:
    assert canonical_url("HTTP://LocalHost/admin/x?q=1") == "http://localhost:80/admin/x"
    assert canonical_url("http://[::1]:8001") == "http://[::1]:8001/"
    assert base_url("http://gw.example/replica-0/") == "http://gw.example:80/replica-0"
    header = sign(KEY, "POST", "http://ROLLOUT:8001/admin/weights", BODY, now=1000)
    v = Verifier(KEY, [ME, "http://rollout:8001"])
    v.verify(header, "POST", "/admin/weights", BODY, now=1000)
    behind_a_proxy = sign(KEY, "POST", "http://gw.example/replica-0/admin/weights", BODY, now=1000)
    Verifier(KEY, ["http://gw.example/replica-0"]).verify(
        behind_a_proxy, "POST", "/admin/weights", BODY, now=1000
    )
    with pytest.raises(SignatureError, match="not an http"):
        Verifier(KEY, ["ftp://x"])


def test_signed_sends_the_bytes_it_signed_and_never_the_key() -> None:
    body, headers = signed(KEY, "POST", ME + "/admin/weights", {"version": 3, "path": "v000003"})
    assert body == BODY and KEY not in str(headers) and "Authorization" not in headers
    Verifier(KEY, [ME]).verify(headers["X-LLDS-Signature"], "POST", "/admin/weights", body)
    assert signed(None, "GET", ME + "/admin/weight_transfer", None) == (b"", {})
