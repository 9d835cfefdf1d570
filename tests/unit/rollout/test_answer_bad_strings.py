"""``/answer`` refuses strings that are not Unicode with a 4xx and a message, never a 500 (fake engine)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from rollout_fakes import ScriptedEngine

from llds_rollout.app import create_app
from llds_rollout.config import RolloutSettings


@pytest.mark.parametrize("route", ["/answer", "/answer/stream"])
@pytest.mark.parametrize(
    "body",
    [
        b'{"question": "\\ud800"}',  # a lone surrogate, as JSON escapes it (it was a 500)
        b'{"question": "who \\udfff?", "max_turns": 0}',
        b'{"question": "\xff\xfe who?"}',  # bytes that are not UTF-8
        b'{"question": "caf\xe9?"}',
    ],
)
def test_strings_that_are_not_unicode_are_4xx_with_a_message(route: str, body: bytes) -> None:
    settings = RolloutSettings.load(
        overrides={"model": "m", "train": False, "engine": {"type": "transformers"}}
    )
    client = TestClient(create_app(settings, ScriptedEngine(None, [])))  # no lifespan: nothing loads
    r = client.post(route, content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert r.json().get("message") or r.json()["detail"]
    if r.status_code == 422:
        assert "question: Input should be a valid string" in r.json()["message"]
