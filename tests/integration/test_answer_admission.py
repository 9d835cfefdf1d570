"""/answer admission over real HTTP: the rollout service (tiny model, transformers engine) with
``answer_max_in_flight = 2`` and ``answer_max_queued = 2``, and a real loopback retriever that holds
every search until released, so the running answers stay running while more arrive.

Twice the capacity (8 requests, 4 slots) arrives at once: the excess answers 503 with ``Retry-After``
at once (not after a client time-out), the admitted ones answer 200 once the retriever lets go,
and the service's metrics count what happened.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from test_rollout_service import QUESTION, TestEngine, _search_then_answer_script, _wait, retriever_app

from llds_rollout.app import create_app
from llds_rollout.config import RolloutSettings
from llds_server.http import BackgroundServer

pytestmark = pytest.mark.integration

RUNNING, QUEUED = 2, 2


def held_retriever(release: threading.Event, arrived: list[float]) -> FastAPI:
    """The real word-overlap retriever, holding each request until ``release`` is set."""
    inner = retriever_app([])
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(body: dict[str, Any]) -> Any:
        arrived.append(time.monotonic())
        assert release.wait(120), "test never released the retriever"
        route = next(r for r in inner.routes if getattr(r, "path", "") == "/retrieve")
        return route.endpoint(body)  # type: ignore[attr-defined]

    return app


@pytest.fixture()
def held_service(tiny_model_dir: Path) -> Iterator[tuple[str, threading.Event, list[float]]]:
    from transformers import AutoTokenizer

    release, arrived = threading.Event(), []
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    with BackgroundServer(held_retriever(release, arrived)) as retriever:
        settings = RolloutSettings.load(
            overrides={
                "model": str(tiny_model_dir),
                "retriever_url": retriever.url,
                "train": False,
                "answer_max_turns": 2,
                "max_tokens_per_turn": 40,
                "answer_max_in_flight": RUNNING,
                "answer_max_queued": QUEUED,
                "answer_retry_after_s": 3,
                "retriever_timeout_s": 120,
            }
        )
        engine = TestEngine(str(tiny_model_dir), script=_search_then_answer_script(tok, "hamlet author", "x"))
        with BackgroundServer(create_app(settings, engine)) as srv:
            _wait(lambda: httpx.get(f"{srv.url}/health").status_code == 200, what="model load")
            try:
                yield srv.url, release, arrived
            finally:
                release.set()


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not exported"
    return float(m.group(1))


def test_twice_the_capacity_gets_503_for_the_excess_at_once_and_200_for_the_rest(
    held_service: tuple[str, threading.Event, list[float]],
) -> None:
    url, release, arrived = held_service

    async def main() -> list[tuple[int, float, httpx.Response]]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:

            async def one(i: int) -> tuple[int, float, httpx.Response]:
                t0 = time.monotonic()
                r = await client.post("/answer", json={"question": QUESTION})
                return i, time.monotonic() - t0, r

            tasks = [asyncio.create_task(one(i)) for i in range(2 * (RUNNING + QUEUED))]
            # the running answers reach the held retriever, the queued ones wait behind them
            deadline = time.monotonic() + 60
            while len(arrived) < RUNNING:
                assert time.monotonic() < deadline, "the admitted answers never searched"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            metrics = (await client.get("/metrics")).text
            assert _metric(metrics, "llds_rollout_answers_in_flight") == RUNNING
            assert _metric(metrics, "llds_rollout_answers_queued") == QUEUED
            refused = [t for t in tasks if t.done()]
            assert len(refused) == RUNNING + QUEUED, "the excess must be refused while the rest wait"
            # a streamed answer is refused the same way, before any event goes out
            r = await client.post("/answer/stream", json={"question": QUESTION})
            assert r.status_code == 503 and r.headers["retry-after"] == "3", r.text
            release.set()
            return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    ok = [(s, r) for _, s, r in results if r.status_code == 200]
    busy = [(s, r) for _, s, r in results if r.status_code == 503]
    assert len(ok) == RUNNING + QUEUED and len(busy) == RUNNING + QUEUED, [r.status_code for *_, r in results]
    for s, r in busy:
        assert s < 10, f"a refused request took {s:.1f} s"
        assert r.headers["retry-after"] == "3"
        assert "answer_max_in_flight = 2" in r.json()["detail"]
    assert all(r.json()["answer"] == "x" for _, r in ok)
    metrics = httpx.get(f"{url}/metrics").text
    assert _metric(metrics, "llds_rollout_answers_rejected_total") == RUNNING + QUEUED + 1
    assert _metric(metrics, "llds_rollout_answers_in_flight") == 0
    assert _metric(metrics, "llds_rollout_answers_queued") == 0
    assert _metric(metrics, "llds_rollout_answer_queue_seconds_count") == RUNNING + QUEUED
    # the slots came back: the service answers again
    assert httpx.post(f"{url}/answer", json={"question": QUESTION}, timeout=60).status_code == 200
