"""Dispatch of ``/v1/`` requests to the engine's OpenAI-compatible app (fake engines, no vLLM)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from rollout_fakes import ScriptedEngine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from llds_rollout.app import create_app
from llds_rollout.config import RolloutSettings
from llds_rollout.engine.vllm_openai import keeps


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path, "body": (await request.body()).decode()})


class OpenAIEngine(ScriptedEngine):
    """Offers an OpenAI app (an echo) once ``loaded``."""

    def __init__(self, loaded: bool) -> None:
        super().__init__(None, [])
        self.loaded = loaded
        self.echo = Starlette(routes=[Route("/v1/{rest:path}", _echo, methods=["GET", "POST"])])

    @property
    def openai_asgi(self) -> Any:
        return self.echo if self.loaded else None


def _client(engine_type: str, engine: ScriptedEngine, **over: Any) -> TestClient:
    settings = RolloutSettings.load(
        overrides={
            "model": "m",
            "train": False,
            "engine": {"type": engine_type, **over},
            "max_body_bytes": 2048,
        }
    )
    return TestClient(create_app(settings, engine))  # no lifespan: nothing loads


def test_v1_goes_to_the_engine_app_and_the_rest_stays() -> None:
    c = _client("vllm", OpenAIEngine(loaded=True))
    r = c.post("/v1/chat/completions", json={"x": 1})
    assert r.status_code == 200 and r.json() == {"path": "/v1/chat/completions", "body": '{"x":1}'}
    assert c.get("/v1/models").json()["path"] == "/v1/models"
    assert c.get("/health").status_code == 503  # ours: the service has not loaded


def test_v1_body_limit_applies() -> None:
    c = _client("vllm", OpenAIEngine(loaded=True))
    assert c.post("/v1/completions", content=b"x" * 4096).status_code == 413


def test_v1_is_503_while_loading() -> None:
    r = _client("vllm", OpenAIEngine(loaded=False)).post("/v1/completions", json={})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"


@pytest.mark.parametrize(("engine_type", "over"), [("transformers", {}), ("vllm", {"openai_api": False})])
def test_v1_is_404_naming_the_setting_without_it(engine_type: str, over: dict[str, Any]) -> None:
    r = _client(engine_type, OpenAIEngine(loaded=False), **over).post("/v1/completions", json={})
    assert r.status_code == 404
    assert "engine.type = 'vllm' and engine.openai_api = true" in r.json()["detail"]


@pytest.mark.parametrize(
    ("path", "kept"),
    [("/v1/chat/completions", True), ("/v1/models", True), ("/pause", False), ("/collective_rpc", False),
     ("/health", False), ("/metrics", False), ("/v1", False), ("/tokenize", False),
     ("/v1/load_lora_adapter", False), ("/v1/unload_lora_adapter", False)],
)  # fmt: skip
def test_only_v1_routes_of_vllm_are_kept(path: str, kept: bool) -> None:
    assert keeps(path) is kept


def test_v1_key_and_loopback_rules() -> None:
    body = {"x": 1}
    c = _client("vllm", OpenAIEngine(loaded=True), **{})
    assert c.post("/v1/completions", json=body).status_code == 200  # loopback, no key
    keyed = RolloutSettings.load(
        overrides={"model": "m", "train": False, "engine": {"type": "vllm"}, "api_key": "k1"}
    )
    c = TestClient(create_app(keyed, OpenAIEngine(loaded=True)))
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
    assert c.post("/v1/completions", json=body, headers={"Authorization": "Bearer k2"}).status_code == 401
    assert c.post("/v1/completions", json=body, headers={"Authorization": "Bearer k1"}).status_code == 200
    assert c.get("/health").status_code == 503  # the other routes are not behind the key
    wide = RolloutSettings.load(
        overrides={"model": "m", "train": False, "engine": {"type": "vllm"}, "host": "0.0.0.0"}
    )
    r = TestClient(create_app(wide, OpenAIEngine(loaded=True))).post("/v1/completions", json=body)
    assert r.status_code == 403 and "api_key" in r.json()["detail"] and "LLDS_API_KEY" in r.json()["detail"]


def test_v1_takes_an_answer_slot_and_gives_it_back() -> None:
    from llds_rollout.answer_admission import AnswerAdmission

    app = create_app(RolloutSettings.load(overrides={"model": "m", "train": False, "engine": {"type": "vllm"}}),
                     OpenAIEngine(loaded=True))  # fmt: skip
    service = app.state.service
    service.answer_admission = AnswerAdmission(max_in_flight=1, max_queued=0, retry_after_s=3.0)
    c = TestClient(app)
    assert c.post("/v1/completions", json={}).status_code == 200
    assert service.answer_admission.in_flight == 0  # released after the response
    service.answer_admission.admit()  # someone holds the one slot
    r = c.post("/v1/completions", json={})
    assert (
        r.status_code == 503
        and r.headers["retry-after"] == "3"
        and "answer capacity full" in r.json()["detail"]
    )
