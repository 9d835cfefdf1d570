"""API fuzzing: schemathesis generates valid and invalid requests from every service's OpenAPI
schema and sends them to the live service (in-process uvicorn on loopback, real index, real tiny
model, real Redis). No answer may be a 5xx, and every documented answer must match its schema.

Admin routes are fuzzed with the bearer token against an empty weights root, so no notice can
change the weights (every one is a 4xx); without the token they must all be 401.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from reliability_kit import wait_for, world_index
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance

pytestmark = [pytest.mark.integration]

TOKEN = "fuzz-admin-token"
CHECKS = [not_a_server_error, response_schema_conformance]


def fuzz_service(
    base_url: str, examples: dict[str, int], default: int = 30, headers: dict[str, str] | None = None
) -> dict[str, int]:
    """Fuzz every operation of the live schema; returns examples sent per operation, raises with every failure."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    failures: list[str] = []
    sent: dict[str, int] = {}
    for result in schema.get_all_operations():
        op = result.ok()
        label = f"{op.method.upper()} {op.path}"
        n = examples.get(label, default)
        count = 0
        raw = op.definition.raw
        has_input = bool(raw.get("parameters") or raw.get("requestBody"))
        modes = (
            ((GenerationMode.POSITIVE, 2 / 3), (GenerationMode.NEGATIVE, 1 / 3))
            if has_input
            else ((GenerationMode.POSITIVE, 0.0),)
        )
        for mode, share in modes:

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=max(1, int(n * share)), deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
            def run(case: Any) -> None:
                nonlocal count
                count += 1
                case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS, timeout=60)

            t0 = time.perf_counter()
            try:
                run()
            except Unsatisfiable:
                # No invalid input exists for this operation (e.g. its only parameter is a free-form header).
                assert mode is GenerationMode.NEGATIVE, label
            except Exception as e:  # collect every operation's failure, not just the first
                failures.append(f"{label} [{mode.value}]: {type(e).__name__}: {str(e)[:1500]}")
            print(f"fuzz {label} [{mode.value}]: {count} requests in {time.perf_counter() - t0:.1f} s")
        sent[label] = count
    assert not failures, "\n\n".join(failures)
    return sent


@pytest.fixture(scope="module")
def retriever_url() -> Iterator[str]:
    from llds_retriever.app import create_app
    from llds_retriever.config import RetrieverConfig
    from llds_server.http import BackgroundServer

    _, index = world_index()
    with BackgroundServer(create_app(RetrieverConfig(index_dir=index, backend={"torch_threads": 1}))) as srv:
        wait_for(lambda: httpx.get(f"{srv.url}/health").status_code == 200, 120, "retriever index load")
        yield srv.url


@pytest.fixture(scope="module")
def rollout_url(
    tiny_model_dir: Path, retriever_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    from llds_rollout.app import create_app
    from llds_rollout.config import RolloutSettings
    from llds_server.http import BackgroundServer

    settings = RolloutSettings.load(
        overrides={"model": str(tiny_model_dir), "retriever_url": retriever_url, "train": False,
                   "admin_token": TOKEN, "weights_root": tmp_path_factory.mktemp("empty-weights"), "engine": {"type": "transformers"},
                   "answer_max_turns": 1, "max_tokens_per_turn": 8, "max_obs_tokens": 32,
                   "max_context_tokens": 256}
    )  # fmt: skip
    with BackgroundServer(create_app(settings)) as srv:
        wait_for(lambda: httpx.get(f"{srv.url}/health").status_code == 200, 120, "rollout model load")
        yield srv.url


def test_fuzz_retriever(retriever_url: str) -> None:
    sent = fuzz_service(retriever_url, {"POST /retrieve": 60})
    assert sent["POST /retrieve"] >= 30


NOT_UNICODE = [b'"\\ud800"', b'"a\\udfffb"', b'"\xff\xfe"', b'"caf\xe9"']
"""JSON strings that are not Unicode, which the generated cases never hold: lone surrogates (as JSON
escapes them) and bytes that are not UTF-8."""


@pytest.mark.parametrize("raw", NOT_UNICODE)
@pytest.mark.parametrize(
    ("service", "route", "template"),
    [
        ("retriever", "/retrieve", b'{"queries": [%s]}'),
        ("retriever", "/retrieve", b'{"queries": ["q"], "request_id": %s}'),
        ("rollout", "/answer", b'{"question": %s}'),
        ("rollout", "/answer/stream", b'{"question": %s}'),
    ],
)
def test_strings_that_are_not_unicode_get_a_4xx_with_a_message(
    request: pytest.FixtureRequest, service: str, route: str, template: bytes, raw: bytes
) -> None:
    url = request.getfixturevalue(f"{service}_url")
    r = httpx.post(f"{url}{route}", content=template % raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert r.json().get("message") or r.json()["detail"]


@pytest.mark.slow
def test_fuzz_rollout_with_admin_token(rollout_url: str) -> None:
    sent = fuzz_service(
        rollout_url,
        {"POST /answer": 15, "POST /answer/stream": 9, "POST /admin/weights": 45},
        default=15,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert {"POST /answer", "POST /admin/weights", "POST /admin/pause", "GET /health"} <= set(sent)
    assert httpx.get(f"{rollout_url}/health").json()["detail"]["weights_version"] == 0  # nothing swapped


def test_admin_routes_refuse_every_fuzzed_request_without_the_token(rollout_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{rollout_url}/openapi.json")
    statuses: set[int] = set()
    for result in schema.get_all_operations():
        op = result.ok()
        if not op.path.startswith("/admin"):
            continue

        @given(case=op.as_strategy())
        @settings(max_examples=10, deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
        def run(case: Any) -> None:
            resp = case.call(base_url=rollout_url, headers={"Authorization": "Bearer wrong"})
            statuses.add(resp.status_code)
            # auth is checked before the body, so even malformed bodies get 401
            assert resp.status_code in (401, 422), resp.text

        run()
    assert 401 in statuses


def test_fuzz_trainer(tiny_model_dir: Path, redis_server: Any, tmp_path: Path) -> None:
    """The real trainer service after set-up (model loaded, queue joined), waiting for groups."""
    import redis

    from llds_server.http import BackgroundServer
    from llds_trainer.app import create_app
    from llds_trainer.config import TrainerConfig
    from llds_trainer.service import TrainerService

    redis.Redis.from_url(redis_server.url).flushall()
    cfg = TrainerConfig(model=str(tiny_model_dir), redis_url=redis_server.url, run_dir=str(tmp_path / "run"),
                        weights_root=str(tmp_path / "weights"), num_threads=1)  # fmt: skip
    service = TrainerService(cfg)
    service.setup()
    with BackgroundServer(create_app(service)) as srv:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        sent = fuzz_service(srv.url, {"GET /history": 40}, default=20)
    assert {"GET /history", "GET /status", "GET /health"} <= set(sent)


def test_fuzz_dashboard(retriever_url: str, rollout_url: str) -> None:
    from llds.dashboard import DashboardConfig, create_app
    from llds_server.http import BackgroundServer

    cfg = DashboardConfig(retriever_url=retriever_url, rollout_url=rollout_url, trainer_url="http://127.0.0.1:9",
                          poll_interval_s=0.2)  # fmt: skip
    with BackgroundServer(create_app(cfg)) as srv:
        asyncio.run(asyncio.sleep(0.5))  # let a few polls land, including failing ones (no trainer)
        sent = fuzz_service(srv.url, {"GET /api/state": 45}, default=15)
    assert "GET /api/state" in sent
